"""Contextual calibration of a two-sided labelling leaf (Zhao et al. 2021, "Calibrate Before
Use"), on the local 1.5B over dev records only. The leaf is the planner's own ("Which fits the
text better: other or animal?"); the first reply token's probabilities are read (logprobs), and
the side is chosen (a) as the model's argmax, (b) dividing each side's probability by its
probability on content-free texts ("N/A", "", "..."), the model's prior for the side.
Prints recall and false-positive rate per arm, and the count each arm gives for an instance
whose base rate is the WordNet count family's (~12%).

Measured 2026-12-06 (dev, 30 animals, 60 other glosses): argmax recall 0.77, false positives
0.10 (a count 1.5x the truth at a 12% base rate); calibrated 0.83 / 0.23 (2.5x): the model's
prior on content-free text favours "other" a little, so dividing by it adds false positives.
Not adopted.

Usage: calibrate.py [wordnet KIND | sentiment negative|positive] [N_POS N_NEG]
"""
import asyncio
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.realdata import records
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.strategies.plan import leaf_question
from recursa.models.local import LocalClient

snap = sys.argv[1] if len(sys.argv) > 1 else "wordnet"
kind = sys.argv[2] if len(sys.argv) > 2 else "noun.animal"
n_pos, n_neg = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (30, 60)
recs = records(snap, "dev")
rng = random.Random(f"calib_{snap}_{kind}")
sample = rng.sample([r for r in recs if r.label == kind], n_pos) + \
    rng.sample([r for r in recs if r.label != kind], n_neg)
word = {"noun.food": "food", "noun.animal": "animal", "noun.person": "person",
        "noun.plant": "plant", "negative": "negative", "positive": "positive"}[kind]
labels = ["other", word] if snap == "wordnet" else \
    (["positive", "negative"] if kind == "negative" else ["negative", "positive"])
q = leaf_question(labels)
leaf = LeafType.of(labels=labels)
FREE = ["N/A", "", "...", "[text]"]


def first_probs(lp: dict[str, float] | None) -> dict[str, float]:
    # each side's probability: the mass of first tokens that begin it
    out = {lab: 0.0 for lab in labels}
    for tok, v in (lp or {}).items():
        t = tok.strip().lower()
        for lab in labels:
            if t and lab.startswith(t):
                out[lab] += math.exp(v)
    return out


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    opts = {"temperature": 0.0, "max_tokens": 1, "logprobs": True, "top_logprobs": 10}
    sem = asyncio.Semaphore(3)

    async def probs(text):
        async with sem:
            comp = await c.complete([{"role": "user", "content": leaf_prompt(
                f"Entry 1: {text}", q, leaf)}], **opts)
            return first_probs(comp.first_logprobs)
    cf = await asyncio.gather(*(probs(t) for t in FREE))
    prior = {lab: sum(p[lab] for p in cf) / len(cf) + 1e-6 for lab in labels}
    ps = await asyncio.gather(*(probs(r.text) for r in sample))
    target = labels[1] if snap == "wordnet" else kind
    for arm in ("argmax", "calibrated"):
        def pick(p, arm=arm):
            w = p if arm == "argmax" else {k: p[k] / prior[k] for k in labels}
            return max(labels, key=lambda k: w[k])
        got = [pick(p) for p in ps]
        tp = sum(g == target for g, r in zip(got, sample, strict=True) if r.label == kind) / n_pos
        fp = sum(g == target for g, r in zip(got, sample, strict=True) if r.label != kind) / n_neg
        base = 0.12
        print(json.dumps({"arm": arm, "kind": kind, "recall": round(tp, 2), "false_pos": round(fp, 2),
                          "count_ratio_at_12pct": round((tp * base + fp * (1 - base)) / base, 2),
                          "prior": {k: round(v, 3) for k, v in prior.items()}}), flush=True)
    await c.aclose()
asyncio.run(main())
