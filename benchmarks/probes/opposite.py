"""A labelling leaf's opposite side, on the local 1.5B (WordNet dev glosses: 30 of a kind, 30
of other kinds, drawn by a fixed seed). Arms: the root's negated opposite first ("non-food or
food?"), the counted side first, "other or food?", and a yes / no question of the query's
condition. Prints recall (of the 30 of the kind) and the false-positive share (of the 30 others).

Measured 2026-12-06 (a loaded 2-core machine; accuracy does not depend on speed):
  noun.food:   non-X,X recall 0.40 fp 0.00 | X,non-X 0.50 / 0.00 | other,X 0.83 / 0.03 | yes/no 0.27 / 0.00
  noun.animal: non-X,X recall 0.03 fp 0.00 | X,non-X 0.27 / 0.00 | other,X 0.90 / 0.27 | yes/no 0.00 / 0.00
So a negated opposite is asked as "other" (planner.plain_opposite).

Usage: opposite.py [noun.food|noun.animal|noun.person|noun.plant]
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

kind = sys.argv[1] if len(sys.argv) > 1 else "noun.food"
recs = records("wordnet", "dev")
rng = random.Random("wn_probe")
pos = rng.sample([r for r in recs if r.label == kind], 30)
neg = rng.sample([r for r in recs if r.label != kind], 30)
sample = pos + neg
word = {"noun.food": ("food", "a food or a drink"), "noun.animal": ("animal", "an animal"),
        "noun.person": ("person", "a person"), "noun.plant": ("plant", "a plant")}[kind]
def lab(labels, q=None):
    leaf = LeafType.of(labels=labels)
    q = q or leaf_question(labels)
    return leaf, q
arms = {
  "A non-X,X": (["non-" + word[0], word[0]], None),
  "B X,non-X": ([word[0], "non-" + word[0]], None),
  "C other,X": (["other", word[0]], None),
  "D yes/no": (["no", "yes"], f'Does the text below match this description: "about {word[1]}"? Answer yes or no.'),
}
async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    sem = asyncio.Semaphore(3)
    for name, (labels, q) in arms.items():
        leaf, q = lab(labels, q)
        opts = leaf.options(c)
        async def one(r, leaf=leaf, q=q, opts=opts):
            async with sem:
                comp = await c.complete([{"role": "user", "content": leaf_prompt(f"Entry 1: {r.text}", q, leaf)}], **opts)
                return leaf.parse(comp.text)
        out = await asyncio.gather(*(one(r) for r in sample))
        yes_label = labels[1] if name != "B X,non-X" else labels[0]
        tp = sum(v == yes_label for v, r in zip(out, sample, strict=True) if r.label == kind)
        fp = sum(v == yes_label for v, r in zip(out, sample, strict=True) if r.label != kind)
        print(json.dumps({"arm": name, "kind": kind, "recall": tp / 30, "false_pos": fp / 30}), flush=True)
    await c.aclose()
asyncio.run(main())
