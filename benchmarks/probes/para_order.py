"""Which reader's answer a retrieval should keep, on paraphrased retrieval's dev seeds with the
local 1.5B: the retrieval of the plan mode (a made-up answer as the search query, the top hits
widened and cut into ~320-token pieces, one reader each), with the pieces in the search's rank
order. Prints, per seed, the rank of the piece holding the needle, every reader's answer, and
whether each rule would be right: the first answer (not "none") in rank order, the answer most
readers gave, and any reader (the ceiling).

Usage: para_order.py [N] [LENGTH]
"""
import asyncio
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks.para_niah import ParaNIAH
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.semantic import SemanticIndex
from recursa.core.strategies.plans.repl import common
from recursa.models.local import LocalClient

K, BEFORE, AFTER, PIECE_CHARS = common._PLAN_K, common._PLAN_BEFORE, common._PLAN_AFTER, 1280


def pieces_in_rank_order(text: str, hits: list[dict]) -> list[tuple[int, str]]:
    # each hit widened, overlapping windows merged into the better-ranked one, then cut
    windows: list[list[int]] = []
    for rank, h in enumerate(hits):
        a, b = max(0, h["start"] - BEFORE), h["end"] + AFTER
        for w in windows:
            if a <= w[2] and w[1] <= b:
                w[1], w[2] = min(w[1], a), max(w[2], b)
                break
        else:
            windows.append([rank, a, b])
    out = []
    for rank, a, b in windows:
        w = text[a:b]
        start = 0
        while start < len(w):
            end = min(len(w), start + PIECE_CHARS)
            if end < len(w):
                cut = w.rfind("\n", start + PIECE_CHARS * 4 // 5, end)
                end = cut + 1 if cut > start else end
            out.append((rank, w[start:end]))
            start = end
    return out


async def main(n: int, length: int) -> None:
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    task, tally = ParaNIAH(), collections.Counter()
    leaf = LeafType.of()
    for seed in range(n):
        inst = task.generate(seed, length, split="dev")
        q, gold = inst.query, str(inst.gold)
        guess = (await c.complete([{"role": "user", "content": common._PLAN_GUESS + q}],
                                  max_tokens=60, temperature=0.0)).text
        hits = SemanticIndex(inst.context).search(guess or q, k=K)
        pieces = pieces_in_rank_order(inst.context, hits)
        answers = []
        for rank, p in pieces:
            comp = await c.complete([{"role": "user", "content": leaf_prompt(
                p, q + common._PLAN_READ, leaf)}], max_tokens=120, temperature=0.0)
            a = comp.text.strip()
            answers.append((rank, a, None if common._PLAN_NONE.search(a.strip(" .'\"")) else a))
        found = [a for _, _, a in answers if a]
        codes = [re.findall(r"\d{5,}", a) for a in found]
        first = codes[0][0] if codes and codes[0] else None
        common_code = collections.Counter(x for cs in codes for x in cs).most_common(1)
        needle_rank = next((r for r, p in pieces if gold in p), None)
        row = {"seed": seed, "gold": gold, "needle_hit_rank": needle_rank,
               "first_in_rank_order": first == gold,
               "most_common": bool(common_code) and common_code[0][0] == gold,
               "any_reader": any(gold in a for a in found),
               "answers": [(r, a[:80]) for r, a, _ in answers]}
        tally.update(k for k in ("first_in_rank_order", "most_common", "any_reader") if row[k])
        print(json.dumps(row), flush=True)
    print(json.dumps({"n": n, **tally}), flush=True)
    await c.aclose()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10,
                     int(sys.argv[2]) if len(sys.argv) > 2 else 8192))
