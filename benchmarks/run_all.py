"""Run every speed benchmark side by side - recursa (sandbox "local" and "inprocess") and the
reference library rlms 0.1.3 - in one run, print a table of medians and ratios, and write
benchmarks/results/latest.json.

    .venv/bin/python benchmarks/run_all.py            # full run (about 7 minutes on 2 cores)
    .venv/bin/python benchmarks/run_all.py --quick    # fewer repetitions (about 3 minutes)
    .venv/bin/python benchmarks/run_all.py --only overhead,batch --no-rlms

Everything talks to scripted OpenAI-compatible servers on 127.0.0.1 only; every driver runs in
its own subprocess with a timeout. See docs/performance.md for the method.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DIR, RECURSA_PYTHON, SIDES_ALL, rlms_python  # noqa: E402
from _report import table  # noqa: E402

BENCHES = ["overhead", "bigcontext", "batch", "tree", "concurrent", "startup", "serve"]


class Ctx:
    def __init__(self, args: argparse.Namespace, rlms_py: str | None):
        self.quick = args.quick
        self.rounds = args.rounds or (1 if args.quick else 2)
        self.rlms_py = rlms_py
        self.install = not args.no_install
        wanted = [s for s in args.sides.split(",") if s] or list(SIDES_ALL)
        self.sides = [s for s in SIDES_ALL if s in wanted and (s != "rlms" or rlms_py)]
        self.workdir = Path(args.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def python(self, side: str) -> str:
        return self.rlms_py if side == "rlms" else RECURSA_PYTHON

    @staticmethod
    def dialect(side: str) -> str:
        return "rlms" if side == "rlms" else "recursa"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--rounds", type=int, default=0,
                    help="interleaved rounds of all sides (default 2, --quick 1)")
    ap.add_argument("--sides", default="", help=f"comma-separated subset of {','.join(SIDES_ALL)}")
    ap.add_argument("--no-rlms", action="store_true", help="skip the reference library")
    ap.add_argument("--no-install", action="store_true",
                    help="do not create the venvs for rlms and for a plain install of recursa's "
                         "dependencies when they are missing")
    ap.add_argument("--out", default=str(BENCH_DIR / "results" / "latest.json"))
    ap.add_argument("--workdir", default="/tmp/recursa-bench")
    args = ap.parse_args(argv)
    cmd = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable),
                                            os.path.relpath(__file__), *(argv or sys.argv[1:])])
    only = [b for b in args.only.split(",") if b] or BENCHES
    bad = set(only) - set(BENCHES)
    if bad:
        ap.error(f"unknown benchmark(s): {', '.join(sorted(bad))}")

    if set(filter(None, args.sides.split(","))) - set(SIDES_ALL):
        ap.error(f"--sides takes {','.join(SIDES_ALL)}")
    if args.no_rlms or (args.sides and "rlms" not in args.sides.split(",")):
        rlms_py, msg = None, "reference side skipped (--no-rlms)"
    else:
        rlms_py, msg = rlms_python(install=not args.no_install,
                                   log=lambda s: print(s, file=sys.stderr))
    print(msg, file=sys.stderr)
    ctx = Ctx(args, rlms_py)
    results: dict[str, Any] = {
        "command": cmd, "when": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg_start": os.getloadavg()},
        "reference": msg, "quick": args.quick, "rounds": ctx.rounds, "benchmarks": {}}
    t0 = time.monotonic()
    for name in only:
        mod = importlib.import_module("bench_" + name)
        print(f"[{time.monotonic() - t0:6.1f}s] {name} ...", file=sys.stderr, flush=True)
        try:
            results["benchmarks"][name] = mod.run(ctx)
        except Exception as e:   # one broken benchmark must not lose the others
            results["benchmarks"][name] = {"error": f"{type(e).__name__}: {e}"}
        results["benchmarks"][name]["doc"] = (mod.__doc__ or "").strip().splitlines()[0]
    results["elapsed_s"] = round(time.monotonic() - t0, 1)
    results["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    print(f"\nwrote {out}\ncommand: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
