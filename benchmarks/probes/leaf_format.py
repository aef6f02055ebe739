"""How a labelling leaf is worded and constrained, on the local 1.5B (dev records only).

Arms, each over the same dev records of a real-label snapshot, sent as a map sends them (3 at a
time, the server's slots):
  text_first_json   the text, "---", the question, a JSON-string constraint (recursa before
                    issue 33: nothing shared between leaves)
  question_first_json   the question first (a prefix every leaf shares), the text, the answer line
  question_first_token  the same, one reply token under a grammar of the bare labels (the default
                        where the labels' first letters differ)

Prints each arm's accuracy against the data's own labels, its wall time and the prompt tokens
the server took from its cache.

Usage: leaf_format.py [N_PER_SITE] [SNAPSHOT]   (default 40 records per site, sentiment)
"""

import asyncio
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.realdata import records
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.strategies.plan import leaf_question
from recursa.models.local import LocalClient

LABELS = ["positive", "negative"]          # the opposite first, the counted last (planner)


def old_prompt(item: str, instruction: str, leaf: LeafType) -> str:
    return f"{item}\n\n---\n{instruction.replace('the text', 'the text above')}\n" \
        f"{leaf.instruction}"


async def arm(client: LocalClient, name: str, recs, build, opts) -> None:
    leaf = LeafType.of(labels=LABELS)
    question = leaf_question(LABELS)
    sem = asyncio.Semaphore(3)

    async def one(r):
        async with sem:
            c = await client.complete([{"role": "user", "content": build(r.text, question,
                                                                          leaf)}], **opts)
            return leaf.parse(c.text), c.usage.cached_tokens, c.usage.input_tokens
    t0 = time.perf_counter()
    out = await asyncio.gather(*(one(r) for r in recs))
    wall = time.perf_counter() - t0
    right = sum(v == r.label for (v, _, _), r in zip(out, recs, strict=True))
    none = sum(v is None for v, _, _ in out)
    cached = sum(c for _, c, _ in out)
    prompt = sum(n for _, _, n in out)
    print(json.dumps({"arm": name, "n": len(recs), "accuracy": round(right / len(recs), 3),
                      "unparsed": none, "wall_s": round(wall, 1),
                      "prompt_tokens": prompt, "cached_tokens": cached}), flush=True)


async def main() -> None:
    per = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    pool = records(sys.argv[2] if len(sys.argv) > 2 else "sentiment", "dev")
    rng = random.Random("leaf_format")
    recs = []
    for site in ("amazon", "imdb", "yelp"):
        recs += rng.sample([r for r in pool if r.source == site], per)
    client = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    json_opts = {"json_schema": {"type": "string", "enum": LABELS}, "max_tokens": 8,
                 "temperature": 0.0}
    token_opts = LeafType.of(labels=LABELS).options(client)
    await client.complete([{"role": "user", "content": "hi"}], max_tokens=1)   # load
    await arm(client, "text_first_json", recs, old_prompt, json_opts)
    await arm(client, "question_first_json", recs, leaf_prompt, json_opts)
    await arm(client, "question_first_token", recs, leaf_prompt, token_opts)
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
