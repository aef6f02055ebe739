"""How far past `max_seconds` a run with the real local model ends (issue 13, item 2).

    PYTHONPATH=src python benchmarks/bench_time_limit.py --n 3 --max-seconds 25

Each run asks the local model for work it cannot finish in time (a sum over 3,000 records,
explained step by step), so the limit always ends it; prints each run's wall time, the
overshoot past the limit, status and how the answer was obtained, then the median overshoot.
Run it with another checkout first on PYTHONPATH to compare side by side.
"""

from __future__ import annotations

import argparse
import statistics
import time

from recursa import RLM

CTX = "".join(f"record {i}: the value of key-{i} is {i * 7 % 1000}\n" for i in range(3000))
QUERY = ("Add up every value whose key number is a multiple of 7 and explain each step in "
         "detail.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=25.0)
    ap.add_argument("--model", default="local:qwen2.5-coder-1.5b")
    args = ap.parse_args()
    rlm = RLM(model=args.model, sandbox="local", max_seconds=args.max_seconds)
    rlm.completion("Say hi.", context="warm-up", max_seconds=60)   # load the model once
    over = []
    for i in range(args.n):
        t0 = time.monotonic()
        res = rlm.completion(QUERY, context=CTX)
        wall = time.monotonic() - t0
        over.append(wall - args.max_seconds)
        print(f"run {i + 1}: wall {wall:6.1f} s  overshoot {over[-1]:+5.1f} s  "
              f"status {res.status:9s} limit {res.limit}  "
              f"source {getattr(res, 'answer_source', '-')}  answer {res.answer[:60]!r}",
              flush=True)
    print(f"median overshoot past max_seconds={args.max_seconds:g}: "
          f"{statistics.median(over):+.1f} s (n={args.n})")


if __name__ == "__main__":
    main()
