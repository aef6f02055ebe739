"""Sessions: a follow-up question in a kept sandbox vs a fresh run over the same context.

A fresh `rlm.completion` writes the context to a file, starts a sandbox worker and loads the
context into it; a question in a session finds all of that done. The model is scripted (one
turn: `FINAL(str(len(context)))`, no latency), so the figures are recursa's own overhead.
Fresh runs and session questions alternate, so load drifts hit both alike; medians are printed.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_session.py [--mb 1 20] [-n 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from recursa import RLM  # noqa: E402
from recursa.models.replay import ReplayClient  # noqa: E402

REPLY = "```repl\nFINAL(str(len(context)))\n```"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[1.0, 20.0])
    ap.add_argument("-n", type=int, default=7)
    ap.add_argument("--sandbox", default="local")
    a = ap.parse_args()
    print(f"sandbox {a.sandbox}, {a.n} questions each, medians (s)")
    print(f"{'context':>10} {'fresh run':>10} {'in session':>11} {'ratio':>7}")
    for mb in a.mb:
        line = "The quick brown fox jumps over the lazy dog. " * 20 + "\n"
        context = line * int(mb * 1024 * 1024 / len(line))
        rlm = RLM(model=ReplayClient(lambda m: REPLY), sandbox=a.sandbox)
        fresh, kept = [], []
        with rlm.session(context) as s:
            s.completion("warm-up: load the context")
            for _ in range(a.n):
                t = time.perf_counter()
                r = rlm.completion("How long is the context?", context)
                fresh.append(time.perf_counter() - t)
                assert r.answer == str(len(context)), r
                t = time.perf_counter()
                r = s.completion("How long is the context?")
                kept.append(time.perf_counter() - t)
                assert r.answer == str(len(context)), r
        f, k = statistics.median(fresh), statistics.median(kept)
        print(f"{mb:>8g}MB {f:>10.3f} {k:>11.3f} {f / k:>6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
