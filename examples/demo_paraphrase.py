"""A harder demo (work in progress, issue 20): the local Qwen2.5-Coder-1.5B over a long archive.

Needs the `search` extra. Not yet right often enough to be `make demo` (docs/bench/README.md).

The archive is real encyclopedic text, about 65,000 tokens (four times the 16,384-token window
the local model runs with), with five maintenance reports hidden in it. The question is asked as
a user would ask it, in words the report it is about never uses ("blackout", "electricity"), so
a search for its words finds nothing useful: the demo prints what that grep answers beside the
RLM's answer. The model never sees the archive: it picks a plan (strategy "plan"), the runtime
finds the passages closest in meaning with `search()` and has a sub-model read each, and the
model answers from what was read. The answer is judged strictly: the right contractor and cause,
and no other (a list of suspects is wrong).

    .venv/bin/python examples/demo_paraphrase.py [--seed N] [--strategy code|plan] [--model local:...]

Seeds from 1000 are the held-out test split (src/recursa/demos/paraphrase.py); 1000 is the default.
"""

from __future__ import annotations

import argparse
import sys
import time

from _spend import print_spend

from recursa import RLM
from recursa.demos.paraphrase import TEST_SEEDS_FROM, make_case
from recursa.obs.console import ConsoleView


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=TEST_SEEDS_FROM)
    ap.add_argument("--strategy", default="plan", choices=["code", "plan", "auto"])
    ap.add_argument("--model", default="local:qwen2.5-coder-1.5b")
    ap.add_argument("--max-seconds", type=float, default=170,
                    help="the run's time limit (on an idle 2-core machine it takes 1-3 minutes)")
    a = ap.parse_args()
    case = make_case(a.seed)
    print(f"context: {len(case.context):,} characters (~{len(case.context) // 4:,} tokens) of "
          "encyclopedic text with five maintenance reports somewhere inside")
    print(f"query:   {case.query}\n")
    view = ConsoleView()
    rlm = RLM(model=a.model, max_iterations=8, max_output_chars=2000, max_seconds=a.max_seconds,
              model_options={"temperature": 0.0, "max_tokens": 400},
              sub_model_options={"temperature": 0.0, "max_tokens": 200},
              trace_dir="traces", sinks=[view], strategy=a.strategy)
    t0 = time.monotonic()
    res = rlm.completion(case.query, context=case.context)
    view.close()
    right = case.check(res.answer)
    print(f"answer:    {res.answer.strip()[:600]}")
    print(f"status:    {res.status} (ready={res.ready})")
    print(f"right:     {'yes' if right else 'no'} under the strict judge (the report says: "
          f"{case.cause_word}, fixed by {case.fixer}; naming anyone or anything else is wrong)")
    grep = case.grep_answer()
    print(f"grep:      {grep.strip()[:160]!r} -> {'right' if case.check(grep) else 'wrong'} "
          "(the no-model baseline: the sentence with the query's rarest words)")
    print_spend(res, t0)
    return 0 if res.status != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
