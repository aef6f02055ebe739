"""Where one warm two-turn recursa completion spends its time, from its own trace events.

    .venv/bin/python benchmarks/phases.py                  # both sandboxes, small context
    .venv/bin/python benchmarks/phases.py --context-mb 40  # the 40 MB context of bench_bigcontext
    .venv/bin/python benchmarks/phases.py --sides recursa-local --runs 20

Not part of run_all.py: a diagnostic for whoever optimizes the overhead (docs/performance.md).
Uses the same scripted server on 127.0.0.1 as the benchmarks; prints medians in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parent.parent / "tests")]

from _common import Server, complete, make_rlm  # noqa: E402

PHASES = ["before run start (clients)", "context prepare", "sandbox start", "turn 1",
          "turn 2", "sandbox close", "after run end", "total"]


def one(side: str, base_url: str, context: str, trace: Path) -> dict[str, float]:
    trace.unlink(missing_ok=True)
    rlm = make_rlm(side, base_url, trace=str(trace))
    t = time.time()
    complete(side, rlm, "ROOTQ-overhead: how long is the context?", context)
    t_end = time.time()
    evs = [json.loads(line) for line in trace.read_text().splitlines()][1:]   # skip the header
    run_points = [e["t"] for e in evs if e["kind"] == "run"]
    turns_s = [e["t"] for e in evs if e["kind"] == "turn" and e.get("phase") == "start"]
    turns_e = [e["t"] for e in evs if e["kind"] == "turn" and e.get("phase") == "end"]
    final = next(e["t"] for e in evs if e["kind"] == "final")
    return {"before run start (clients)": run_points[0] - t,
            "context prepare": run_points[1] - run_points[0],
            "sandbox start": run_points[2] - run_points[1],
            "turn 1": turns_e[0] - turns_s[0], "turn 2": turns_e[1] - turns_s[1],
            "sandbox close": final - turns_e[1], "after run end": t_end - evs[-1]["t"],
            "total": t_end - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sides", default="recursa-local,recursa-inprocess")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--context-mb", type=float, default=0)
    a = ap.parse_args()
    if a.context_mb:
        from bench_bigcontext import make_context
        context = make_context(int(a.context_mb * 1e6))
    else:
        context = "The quick brown fox jumps over the lazy dog.\n" * 50
    trace = Path(tempfile.mkdtemp(prefix="recursa-phases-")) / "trace.jsonl"
    sides = a.sides.split(",")
    res: dict[str, dict[str, list[float]]] = {s: {p: [] for p in PHASES} for s in sides}
    with Server("scripted", latency=0.0) as srv:
        for side in sides:
            for i in range(a.runs + 2):
                ph = one(side, srv.base_url, context, trace)
                if i >= 2:   # two warm-up runs
                    for k, v in ph.items():
                        res[side][k].append(v)
    print(f"{'phase':30}" + "".join(f"{s:>20}" for s in sides))
    for p in PHASES:
        print(f"{p:30}" + "".join(f"{statistics.median(res[s][p]) * 1000:17.1f} ms"
                                  for s in sides))
    trace.unlink(missing_ok=True)
    trace.parent.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
