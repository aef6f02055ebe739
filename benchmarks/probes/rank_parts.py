"""para_niah dev: the question cut into the things it names (one sub-call), each candidate scored
per part by the 1.5B's yes log-odds ("does the text name this, maybe in other words?"), the
candidate's score its weakest part. Does the needle come first among its look-alikes (each
shares one part) and the filing notes (none)?

Run as `.venv/bin/python benchmarks/probes/rank_parts.py 8192 16` (length, dev seeds 0..N-1)."""

import asyncio
import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.core.combinators import RANK_TOP, yes_score
from recursa.models.local import LocalClient

PARTS = ("Question: {q}\nList the things, places and people this question names, one per line, "
         "nothing else.")
PART = ("Text: {s}\nDoes the text mention {p}, perhaps in other words (a synonym)? Reply yes or "
        "no.")


async def main() -> None:
    length, n = int(sys.argv[1]), int(sys.argv[2])
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048, slots=1)
    task = para_niah.ParaNIAH()
    first = 0
    for seed in range(n):
        inst = task.generate(seed, length, split="dev")
        q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
        comp = await c.complete([{"role": "user", "content": PARTS.format(q=q)}],
                                max_tokens=40, temperature=0)
        parts = [x.strip(" -*0123456789.") for x in comp.text.splitlines() if x.strip()][:4]
        noise = [s for s in re.split(r"(?<=[.!?])\s+", inst.context)
                 if re.search(r"\b\d{7}\b", s) and s not in inst.meta["needles"]
                 and s not in inst.meta["distractors"]][:3]
        cands = [inst.meta["needles"][0], *inst.meta["distractors"], *noise]
        scores = []
        for s in cands:
            per = []
            for p in parts:
                r = await c.complete([{"role": "user", "content": PART.format(s=s, p=p)}],
                                     max_tokens=1, temperature=0, logprobs=True,
                                     top_logprobs=RANK_TOP)
                per.append(yes_score(r.text, r.first_logprobs))
            scores.append(min(per) if per else 0.0)
        rank = 1 + sum(x > scores[0] for x in scores[1:])
        first += rank == 1
        print(f"seed {seed}: parts {parts}; needle ranked {rank} of {len(cands)}; "
              f"{[round(x, 2) for x in scores]}", flush=True)
    print(f"needle first: {first} of {n}")
    await c.aclose()


asyncio.run(main())
