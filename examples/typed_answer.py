"""A typed answer, and the response cache: the demo's question, answered as a pydantic object.

The root is told the schema; an answer that does not validate is sent back with the error. The
run is made twice with `cache=` on: the second is answered from the cache (no model call, no
cost) and gives the same object.

    .venv/bin/python examples/typed_answer.py [--seed N] [--model local:qwen2.5-coder-1.5b]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from recursa import RLM
from recursa.demos.outage import make_case


class Incident(BaseModel):
    site: str = Field(description="where the power failed")
    cause: str = Field(description="what caused the failure, in a few words")
    fixed_by: str = Field(description="full name of the person who fixed it")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="local:qwen2.5-coder-1.5b")
    a = ap.parse_args()
    case = make_case(a.seed)
    cache = Path(tempfile.mkdtemp()) / "responses.sqlite"
    rlm = RLM(model=a.model, max_iterations=8, max_output_chars=2000, max_seconds=240,
              model_options={"temperature": 0.0, "max_tokens": 400},
              sub_model_options={"temperature": 0.0, "max_tokens": 200}, cache=cache,
              trace_dir="traces")
    for attempt in ("first run", "again, from the cache"):
        t0 = time.monotonic()
        res = rlm.completion(case.query, context=case.context, output=Incident)
        print(f"{attempt}: {time.monotonic() - t0:.1f} s, status {res.status}, "
              f"turns {res.turns}, sub-calls {res.subcalls}, cache hits {res.cache_hits}")
        if res.parsed is None:
            print(f"  no valid answer: {res.output_error}\n  raw: {res.answer[:300]}")
            return 1
        print(f"  {res.parsed!r}")
    print(f"right: {'yes' if case.check(res.parsed.model_dump_json()) else 'no'} "
          f"(the report says: {case.cause_word}, fixed by {case.fixer})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
