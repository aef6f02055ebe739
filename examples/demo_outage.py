"""The first demo: a real RLM run with the local Qwen2.5-Coder-1.5B model over a long archive
(`make demo` runs examples/demo.py now, a question no grep can answer; this one a grep can).

The archive is real encyclopedic text, about 65,000 tokens (four times the 16,384-token window
the local model runs with), with one maintenance report hidden in it. The question is asked as
a user would ask it; nothing in it says which code to write. The model never sees the archive:
it writes code against the `context` variable, finds the report, and asks a sub-model to read it.

    .venv/bin/python examples/demo_outage.py [--seed N] [--model local:qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import sys
import time

from _spend import print_spend

from recursa import RLM
from recursa.demos.outage import make_case
from recursa.obs.console import ConsoleView


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="local:qwen2.5-coder-1.5b")
    a = ap.parse_args()
    case = make_case(a.seed)
    print(f"context: {len(case.context):,} characters (~{len(case.context) // 4:,} tokens) of "
          "encyclopedic text with one maintenance report somewhere inside")
    print(f"query:   {case.query}\n")
    view = ConsoleView()
    rlm = RLM(model=a.model, max_iterations=8, max_output_chars=2000, max_seconds=170,
              model_options={"temperature": 0.0, "max_tokens": 400},
              sub_model_options={"temperature": 0.0, "max_tokens": 200},
              trace_dir="traces", sinks=[view])
    t0 = time.monotonic()
    res = rlm.completion(case.query, context=case.context)
    view.close()
    right = case.check(res.answer)
    print(f"answer:    {res.answer.strip()[:600]}")
    print(f"status:    {res.status} (ready={res.ready})")
    print(f"right:     {'yes' if right else 'no'} under the strict judge (the report says: "
          f"{case.cause_word}, fixed by {case.fixer}; naming another cause or person is wrong)")
    from recursa.bench.baselines import grep_answer
    grep = grep_answer(case.query, case.context)
    print(f"grep:      {grep.strip()[:160]!r} -> {'right' if case.check(grep) else 'wrong'} "
          "(no model: the line with the query's rarest words; this question repeats its report's "
          "title, so a search for its words finds the report: examples/demo_paraphrase.py asks "
          "one worded unlike its report)")
    print_spend(res, t0)
    return 0 if res.status != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
