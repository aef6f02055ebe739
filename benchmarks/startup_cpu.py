"""CPU time of `recursa run` from the process's start to its first model request, beside the
floor script's (bench_startup 5b's), interleaved; medians in milliseconds.

    .venv/bin/python benchmarks/startup_cpu.py                          # this tree, both venvs
    .venv/bin/python benchmarks/startup_cpu.py --before /tmp/old/src    # and another tree's src
    .venv/bin/python benchmarks/startup_cpu.py --runs 31 --sandboxes inprocess --out /tmp/cpu.json

Not part of run_all.py: a diagnostic for start-up work. 5b's wall time to the first request
also counts the time a loaded machine keeps the process waiting (and, with the local sandbox,
the worker booting on the same cores); the CPU the process has used when it writes its first
request does not, so it compares trees on a busy machine. Each child is the command run under
a small prelude that reads its CPU clock (every thread) when it writes `POST .../chat/completions`
and exits there. The floor gets the same prelude. The plain venv is bench_startup's
(_common.plain_python); the code under test comes from `src` by PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parent.parent / "tests")]

from _common import RECURSA_PYTHON, REPO, plain_python  # noqa: E402
from bench_startup import CONTEXT, _floor_script  # noqa: E402

# Run in the child before anything else: the CPU clock at the first request, then exit.
PRELUDE = """
import os, sys, time
import asyncio.selector_events as _se
_write = _se._SelectorSocketTransport.write
def _first(self, data):
    if bytes(data[:5]) == b"POST ":
        sys.stdout.write("CPU %.3f\\n" % (time.process_time() * 1000))
        sys.stdout.flush()
        os._exit(0)
    return _write(self, data)
_se._SelectorSocketTransport.write = _first
"""

RUN = PRELUDE + """
sys.argv = ["recursa"] + sys.argv[1:]
from recursa.cli import main
sys.exit(main())
"""


def _cpu_ms(cmd: list[str], env: dict[str, str], cwd: str) -> float | None:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=cwd)
    line = next((x for x in p.stdout.splitlines() if x.startswith("CPU ")), None)
    return float(line.split()[1]) if line else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--sandboxes", default="inprocess,local")
    ap.add_argument("--venvs", default="dev,plain", help="dev (this venv), plain, or both")
    ap.add_argument("--before", help="another tree's src directory, measured beside this one")
    ap.add_argument("--out", help="write the samples and medians here as JSON")
    a = ap.parse_args()

    from openai_testserver import OpenAITestServer
    reply = "```repl\nanswer['content'] = 'started'\nanswer['ready'] = True\n```"
    pythons = {"dev": RECURSA_PYTHON}
    if "plain" in a.venvs:
        plain, msg = plain_python(log=lambda m: print(m, file=sys.stderr))
        if plain is None:
            print(msg, file=sys.stderr)
        else:
            pythons["plain"] = plain
    pythons = {k: v for k, v in pythons.items() if k in a.venvs.split(",")}
    trees = {"this": str(REPO / "src")}
    if a.before:
        trees = {"before": str(Path(a.before).resolve()), **trees}
    for src in trees.values():      # as pip would have: no module compiled in the timed runs
        subprocess.run([RECURSA_PYTHON, "-m", "compileall", "-q", src], check=False)

    env0 = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, OpenAITestServer(responder=lambda r: reply) as srv:
        ctx = os.path.join(tmp, "context.txt")
        Path(ctx).write_text(CONTEXT)
        floor = os.path.join(tmp, "floor.py")
        Path(floor).write_text(PRELUDE + _floor_script())
        run = os.path.join(tmp, "run.py")
        Path(run).write_text(RUN)
        rows: list[tuple[str, list[str], dict[str, str]]] = []
        for venv, py in pythons.items():
            rows.append((f"floor ({venv})", [py, floor, srv.base_url], env0))
            for tree, src in trees.items():
                for sb in a.sandboxes.split(","):
                    cmd = [py, run, "run", "ROOTQ-start: say started", "-c", ctx, "--model",
                           "openai:bench-model", "--base-url", srv.base_url, "--sandbox", sb,
                           "-q"]
                    rows.append((f"{tree} {sb} ({venv})", cmd, {**env0, "PYTHONPATH": src}))
        t0 = time.time()
        for _ in range(a.runs):             # the rows in turn, so drift hits them alike
            for name, cmd, env in rows:
                ms = _cpu_ms(cmd, env, tmp)
                if ms is not None:
                    samples.setdefault(name, []).append(ms)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"CPU ms from process start to the first request, medians of {a.runs} "
          f"(load average {os.getloadavg()[0]:.1f}, {time.time() - t0:.0f} s)")
    for name, m in medians.items():
        venv = name.rsplit("(", 1)[1].rstrip(")")
        fl = medians.get(f"floor ({venv})")
        gap = "" if name.startswith("floor") or fl is None else f"  floor {m - fl:+.1f}"
        print(f"  {name:30} {m:7.1f}  (min {min(samples[name]):.1f}, n {len(samples[name])}){gap}")
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "trees": trees,
                                           "pythons": pythons, "medians_ms": medians,
                                           "samples_ms": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
