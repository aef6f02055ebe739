"""Whether a leaf that labels every record with one of a query's listed options should also be
offered "other", on the local 1.5B over dev records only (WordNet dev glosses: N of each of
the four kinds a "which has the most" question lists, N of each of the four kinds it does not).
Prints each arm's confusion (true kind -> share of leaf answers), then the expected score of
"which has the most" over dev instances (seeds 0-49 at 8k) when every record's label is drawn
from that confusion and the most is taken over the listed options only.

Usage: options_other.py [N] [ARMS_JSON]   (ARMS_JSON: {"name": [labels...]}, default below)
"""
import asyncio
import collections
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.realdata import records
from recursa.bench.tasks.real import KINDS, RealWordnetMost
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.strategies.plans.label_count import leaf_question
from recursa.models.local import LocalClient

OPTIONS = ["animals", "plants", "foods", "people"]
ARMS = {"options": OPTIONS, "options+other": [*OPTIONS, "other"],
        "other+options": ["other", *OPTIONS]}


async def confusion(n: int) -> dict[str, dict[str, collections.Counter]]:
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    sem = asyncio.Semaphore(3)
    recs = records("wordnet", "dev")
    by = collections.defaultdict(list)
    for r in recs:
        by[r.label].append(r)
    rng = random.Random("options_other")
    sample = [(k, r) for k in sorted(by) for r in rng.sample(by[k], n)]
    out: dict[str, dict[str, collections.Counter]] = {}
    for arm, spec in ARMS.items():
        # an arm: its labels, or {"labels": [...], "question": "..."} to word the leaf otherwise
        labels = spec["labels"] if isinstance(spec, dict) else spec
        q = spec["question"] if isinstance(spec, dict) else leaf_question(labels)
        leaf = LeafType.of(labels=labels)
        opts = leaf.options(c)

        async def one(r, leaf=leaf, q=q, opts=opts):
            async with sem:
                comp = await c.complete([{"role": "user", "content": leaf_prompt(
                    f"Entry 1: {r.text}", q, leaf)}], **opts)
                return leaf.parse(comp.text)
        got = await asyncio.gather(*(one(r) for _, r in sample))
        conf: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for (k, _), g in zip(sample, got, strict=True):
            conf[k][g or "none"] += 1
        out[arm] = conf
        print(json.dumps({"arm": arm, "confusion": {k: dict(v) for k, v in conf.items()}}),
              flush=True)
    await c.aclose()
    return out


def expected_most(conf: dict[str, collections.Counter], seeds: range, draws: int = 40) -> float:
    rng = random.Random("sim")
    task, right, total = RealWordnetMost(), 0, 0
    plural = {k: p for k, (_, p) in KINDS.items()}
    for seed in seeds:
        inst = task.generate(seed, 8192, split="dev")
        for _ in range(draws):
            counts = collections.Counter()
            for true in inst.meta["labels"]:
                dist = conf[true]
                counts[rng.choices(list(dist), list(dist.values()))[0]] += 1
            ranked = sorted(OPTIONS, key=lambda o: -counts[o])
            won = ranked[0] if counts[ranked[0]] > counts[ranked[1]] else None
            right += won == inst.gold
            total += 1
    assert set(plural.values()) == set(OPTIONS)
    return right / total


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    if len(sys.argv) > 2:
        ARMS = json.loads(sys.argv[2])
    conf = asyncio.run(confusion(n))
    for arm, c in conf.items():
        print(json.dumps({"arm": arm, "expected_most_dev_8k": round(
            expected_most(c, range(50)), 3)}), flush=True)
