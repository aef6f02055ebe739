"""The answer step after a pairs plan, alone (dev split): given the per-id label counts a pairs
plan prints when every review is labelled right (the gold labels stand in for the sub-model, so
only the root's last step is measured), does the 1.5B answer the judge_pairs question?

`plain` asks for the answer from the printed results (planner.ANSWER_*); `rule` asks for the
condition on each id of a pair (answer_steps.PAIR_*, constrained by its JSON schema) and builds
the pairs here with the plan's own code on the same counts. Scores are the task's pair F1.

Usage: pairs.py [N] [LENGTH]   (dev seeds 0..N-1; default 20 seeds at 8192 tokens)
"""

import asyncio
import collections
import contextlib
import io
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import judge_pairs
from recursa.core.strategies import plan as planner
from recursa.models.local import LocalClient

PLAN = planner.Pairs(plan="pairs", instruction="Label every record.",
                     labels=["praise", "complaint"], keep=["complaint"], id_prefix="Customer:")


def plan_namespace(inst):
    """Run the pairs plan's real code over the instance, llm_map answering from gold."""
    gold = dict(zip(inst.context.splitlines()[-len(inst.meta["labels"]):],
                    inst.meta["labels"], strict=True))
    ns = {"json": json, "re": re, "collections": collections, "context": inst.context,
          "pairs": lambda ids: [(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]],
          "llm_map": lambda q, recs, labels=None, **kw: [gold.get(r) for r in recs]}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(planner.plan_code(PLAN, dry=False), ns)
    return ns, out.getvalue().strip()


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    task = judge_pairs.JudgePairs()
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048, slots=1)
    total = collections.Counter()
    for seed in range(n):
        inst = task.generate(seed, length, split="dev")
        ns, output = plan_namespace(inst)
        plain = await c.complete(planner.answer_messages(inst.query, output[:3000]),
                                 max_tokens=planner.ANSWER_MAX_TOKENS, temperature=0)
        reply = await c.complete(planner.pair_messages(inst.query, PLAN.labels),
                                 max_tokens=planner.PAIR_MAX_TOKENS, temperature=0,
                                 json_schema=planner.pair_schema(PLAN.labels))
        rule = planner.parse_pair_rule(reply.text, PLAN.labels)
        got = {"plain": plain.text.strip(), "rule": ""}
        if rule:
            ns["answer"] = {"content": "", "ready": False}
            with contextlib.redirect_stdout(io.StringIO()):
                exec(planner.pair_code(rule), ns)
            got["rule"] = planner.committed(SimpleNamespace(answer=ns["answer"])) or ""
        scores = {how: task.score(ans, inst).score for how, ans in got.items()}
        total.update(scores)
        print(f"seed {seed} {inst.meta['condition']} k={inst.meta['k']}: "
              f"plain {scores['plain']:.2f}, rule {scores['rule']:.2f} "
              f"({reply.text.strip()})", flush=True)
    print(f"\nmean F1 over {n}: plain {total['plain'] / n:.2f}, rule {total['rule'] / n:.2f}")


asyncio.run(main())
