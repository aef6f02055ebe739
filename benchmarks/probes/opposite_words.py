"""Which opposite a two-sided leaf should be asked with, when the root's opposite repeats the
label's stem but is a word of its own ("unfavourable" for "favourable"), on the local 1.5B over
dev records only: "other", the root's own antonym, or the antonym first. Sentiment dev reviews
(30 of each side by a fixed seed) and WordNet dev glosses (30 of a kind, 30 others).
Prints recall of the counted side and false positives.

Usage: opposite_words.py
"""
import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.realdata import records
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.strategies.plan import leaf_question
from recursa.models.local import LocalClient

CASES = {   # (snapshot, counted label, its records' label), arms of [opposite, label] orders
    "favourable": ("sentiment", "positive", [["other", "favourable"], ["unfavourable", "favourable"],
                                             ["favourable", "unfavourable"]]),
    "unfavourable": ("sentiment", "negative", [["other", "unfavourable"],
                                               ["favourable", "unfavourable"]]),
    "unhappy": ("sentiment", "negative", [["other", "unhappy"], ["happy", "unhappy"]]),
}


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    sem = asyncio.Semaphore(3)
    for word, (snap, target, arms) in CASES.items():
        recs = records(snap, "dev")
        rng = random.Random(f"opp_{word}")
        pos = rng.sample([r for r in recs if r.label == target], 30)
        neg = rng.sample([r for r in recs if r.label != target], 30)
        for labels in arms:
            leaf, q = LeafType.of(labels=labels), leaf_question(labels)
            opts = leaf.options(c)

            async def one(r, leaf=leaf, q=q, opts=opts):
                async with sem:
                    comp = await c.complete([{"role": "user", "content": leaf_prompt(
                        f"Review 1 | {r.text}", q, leaf)}], **opts)
                    return leaf.parse(comp.text)
            got = await asyncio.gather(*(one(r) for r in pos + neg))
            tp = sum(g == word for g in got[:30]) / 30
            fp = sum(g == word for g in got[30:]) / 30
            print(json.dumps({"word": word, "asked": labels, "recall": round(tp, 2),
                              "false_pos": round(fp, 2)}), flush=True)
    await c.aclose()
asyncio.run(main())
