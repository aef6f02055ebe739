"""How the 1.5B root fills the planned mode's slots (dev split only): the planning call alone,
as `strategy="plan"` makes it, for judge_agg dev questions of every type (and any extra queries
given on the command line), printing the plan it returns. Usage: plan_fill.py [N_SEEDS]."""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks.judge_agg import QUESTION_TYPES, JudgeAgg
from recursa.core.context import describe as describe_context
from recursa.core.strategies import plan as planner
from recursa.models.local import LocalClient


class _Env:
    strategy = "plan"
    root_options: dict = {}

    def __init__(self, client):
        self.root_client = client


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    client = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    env = _Env(client)
    cases = []
    for seed in range(n):
        for qt in QUESTION_TYPES:
            try:
                inst = JudgeAgg().generate(seed=seed, length_tokens=3000, split="dev",
                                           question=qt)
            except RuntimeError:     # no clear answer of that type for this seed
                continue
            cases.append((inst.query, inst.context))
    for q in sys.argv[2:]:
        cases.append((q, cases[0][1]))
    for query, ctx in cases:
        messages, options = planner.request(env, query, describe_context(ctx))
        t0 = time.monotonic()
        comp = await client.complete(messages, **options)
        try:
            plan = planner.describe(planner.fits(planner.parse(comp.text), query))
        except ValueError as e:
            plan = f"INVALID ({e}): {comp.text[:200]}"
        print(f"{time.monotonic() - t0:5.1f}s  {query}\n        -> {plan}", flush=True)


asyncio.run(main())
