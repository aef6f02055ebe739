"""The answer step after a labelling plan, alone (dev split): given the counts a plan prints when
every review is labelled right (the gold labels stand in for the sub-model, so only the root's
last step is measured), does the 1.5B answer the judge_agg question right?

`plain` asks for the answer from the printed table (planner.ANSWER_*); `count` asks which count
answers the query (planner.COUNT_*) and computes it here with the plan's own code on the same
counts. (An earlier `expr` arm, a Python expression over label_counts / group_counts, got the
differences right but summed one group for the total: 0 of 8 totals, the reason it was dropped.)
The plan's own REPL code runs here in a namespace of its own, with llm_map answering from gold.

Usage: answer.py [N] [LENGTH] [QUESTION_TYPE]   (dev seeds 0..N-1; default 20 seeds at 8192
tokens, question types drawn as the task draws them)
"""

import ast
import asyncio
import collections
import contextlib
import io
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import judge_agg
from recursa.core.strategies import plan as planner
from recursa.models.local import LocalClient


def plan_namespace(inst):
    """Run the labelling plan's real code over the instance, llm_map answering from gold."""
    gold = dict(zip(inst.context.splitlines()[-len(inst.meta["labels"]):],
                    inst.meta["labels"], strict=True))
    ns = {"json": json, "re": re, "collections": collections, "context": inst.context,
          "llm_map": lambda q, recs, labels=None, **kw: [gold.get(r) for r in recs]}
    plan = planner.LabelCount(plan="label_count", label="complaint", opposite="praise",
                              group_by=inst.meta["group"].capitalize())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(planner.plan_code(plan, dry=False), ns)
    return ns, plan, out.getvalue().strip()


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    qtype_only = sys.argv[3] if len(sys.argv) > 3 else None
    task = judge_agg.JudgeAgg()
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048, slots=1)
    right = collections.Counter()
    by_type = collections.defaultdict(collections.Counter)
    for seed in range(n):
        inst = task.generate(seed, length, split="dev", question=qtype_only)
        ns, plan, output = plan_namespace(inst)
        qtype = inst.meta["question_type"]
        plain = await c.complete(planner.answer_messages(inst.query, output),
                                 max_tokens=planner.ANSWER_MAX_TOKENS, temperature=0)
        reply = await c.complete(planner.count_messages(inst.query, plan.labels, plan.group_by),
                                 max_tokens=planner.COUNT_MAX_TOKENS, temperature=0,
                                 json_schema=planner.CountChoice.model_json_schema())
        op = planner.parse_count_choice(reply.text)
        value = None
        if op:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(planner.count_code(op, inst.query, plan.label), ns)
            value = ast.literal_eval(printed.getvalue().strip().splitlines()[-1])
        got = {"plain": plain.text.strip(), "count": planner.scalar_answer(value) or ""}
        for how, ans in got.items():
            ok = task.score(ans, inst).score == 1.0
            right[how] += ok
            by_type[qtype][how] += ok
        by_type[qtype]["n"] += 1
        print(f"seed {seed} {qtype}: gold {inst.gold!r}; plain {got['plain']!r}; "
              f"count {got['count']!r} ({op})", flush=True)
    print(f"\nright of {n}: plain {right['plain']}, count {right['count']}")
    for qtype, c_ in sorted(by_type.items()):
        print(f"  {qtype}: n {c_['n']}, plain {c_['plain']}, count {c_['count']}")


asyncio.run(main())
