"""Cost limits exact, not timid (issue 35, item 6): runs whose true cost is under their cap
finish with the same answer as uncapped.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_cost_limit.py

Over the scripted model server (benchmarks/_serve.py: real HTTP, the OpenAI client), priced as
gpt-5-mini ($0.25 / $2 per 1M tokens in / out). Each program runs once uncapped, then under each
`--caps` cost limit; a row says how the run ended, whether its answer is the uncapped one, what
it cost and how many sub-calls ran. A call reserves its worst case (its input plus a 2,048-token
output cap: ~$0.005 here, ~100x its true cost), so before the patient ledger a cap that held
only a few worst cases refused the rest of a parallel batch and ended the run with no answer. And a call
whose worst case no longer fits beside what is spent goes out with max_tokens cut to the room
left (at least 256 tokens) instead of being refused.
Run it with another checkout first on PYTHONPATH to compare.
"""

from __future__ import annotations

import argparse
import time

from _common import Server

PRICES = {"openai:bench-model": (0.25, 2.0)}
PROGRAMS = {"batch-10": "ROOTQ-batch-10", "batch-32": "ROOTQ-batch-32",
            "tree-4x4": "ROOTQ-tree-4-4"}


def run(base_url: str, query: str, cap: float | None) -> tuple[object, float]:
    from recursa import RLM
    limits = {} if cap is None else {"max_cost_usd": cap}
    rlm = RLM(model="openai:bench-model", base_url=base_url, api_key="bench-key",
              sandbox="local", max_iterations=6, max_depth=1, prices=PRICES, **limits)
    t0 = time.monotonic()
    res = rlm.completion(query, context="CHILDQ 0 1")
    return res, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", default="0,0.005,0.01,0.02,0.05",
                    help="comma-separated cost limits in USD")
    ap.add_argument("--latency", type=float, default=0.05, help="model latency per call, s")
    args = ap.parse_args()
    caps = [float(c) for c in args.caps.split(",") if c]
    print(f"{'program':9s} {'cap $':>7s} {'status':8s} {'same':5s} {'cost $':>9s} "
          f"{'subcalls':>8s} {'wall s':>7s}  answer", flush=True)
    finished = total = 0
    with Server("scripted", latency=args.latency) as srv:
        for name, query in PROGRAMS.items():
            free, wall = run(srv.base_url, query, None)
            print(f"{name:9s} {'none':>7s} {free.status:8s} {'-':5s} {free.cost_usd:9.5f} "
                  f"{free.subcalls:8d} {wall:7.2f}  {free.answer[:40]!r}", flush=True)
            for cap in caps:
                res, wall = run(srv.base_url, query, cap)
                same = res.answer == free.answer
                under = free.cost_usd is not None and free.cost_usd <= cap
                if under:
                    total += 1
                    finished += same and res.status == free.status
                print(f"{name:9s} {cap:7.3f} {res.status:8s} {str(same):5s} "
                      f"{res.cost_usd or 0:9.5f} {res.subcalls:8d} {wall:7.2f}  "
                      f"{res.answer[:40]!r}" + ("" if res.limit is None else
                                                f"  (limit {res.limit})"), flush=True)
                assert res.cost_usd is None or res.cost_usd <= cap + 1e-9 or cap == 0
    print(f"runs whose uncapped cost is under their cap that finished as uncapped: "
          f"{finished} of {total}")


if __name__ == "__main__":
    main()
