"""para_niah dev: does ranking by the 1.5B's yes log-odds (llm_rank's leaf) put the needle
first among its look-alike distractors and filing notes? Beside it, the plain yes / no reply.

Run as `.venv/bin/python benchmarks/probes/rank_yes.py 8192 8 [FIRST] [TEMPLATE ...]` (length,
seeds FIRST..N-1 of the dev split, FIRST 0 by default; templates by name below, default:
llm_rank's own)."""

import asyncio
import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.core.combinators import RANK_PROMPT, RANK_TOP, yes_score
from recursa.models.local import LocalClient

TEMPLATES = {
    # llm_rank's leaf as it is
    "rank": RANK_PROMPT.replace("{item}", "{s}"),
    # the text after the question and a rule, as llm_map's leaves are: 1 of 8 first on seeds 0-7
    "rule": "{s}\n\n---\nQuestion: {q}\nThe text above may use other words for the same "
            "things. Is it about the very same thing the question asks about, and does it "
            "give the answer? Reply yes or no.",
    "sentence": "Sentence: {s}\nQuestion: {q}\nThe sentence may use other words for the same "
                "things. Is it about the very same thing the question asks about, and does it "
                "give the answer? Reply yes or no.",
}


async def main() -> None:
    length, n = int(sys.argv[1]), int(sys.argv[2])
    first, names = 0, sys.argv[3:]
    if names and names[0].isdigit():       # seeds FIRST..N-1
        first, names = int(names[0]), names[1:]
    for name in names or ["rank"]:
        print(f"template {name!r}")
        await probe(length, n, TEMPLATES[name], first)


async def probe(length: int, n: int, template: str, n0: int = 0) -> None:
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048, slots=1)
    task = para_niah.ParaNIAH()
    first = said_yes_needle = said_no_other = others = 0
    for seed in range(n0, n):
        inst = task.generate(seed, length, split="dev")
        q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
        noise = [s for s in re.split(r"(?<=[.!?])\s+", inst.context)
                 if re.search(r"\b\d{7}\b", s) and s not in inst.meta["needles"]
                 and s not in inst.meta["distractors"]][:3]
        cands = [inst.meta["needles"][0], *inst.meta["distractors"], *noise]
        scores, words = [], []
        for s in cands:
            comp = await c.complete(
                [{"role": "user", "content": template.replace("{s}", s).replace("{q}", q)}],
                max_tokens=1, temperature=0, logprobs=True, top_logprobs=RANK_TOP)
            scores.append(yes_score(comp.text, comp.first_logprobs))
            words.append(comp.text.strip().lower())
        rank = 1 + sum(x > scores[0] for x in scores[1:])
        first += rank == 1
        said_yes_needle += words[0].startswith("yes")
        said_no_other += sum(w.startswith("no") for w in words[1:])
        others += len(words) - 1
        print(f"seed {seed}: needle ranked {rank} of {len(cands)}; "
              f"{[round(x, 2) for x in scores]}", flush=True)
    print(f"needle first: {first} of {n}; plain reply: yes to the needle {said_yes_needle} of "
          f"{n}, no to the others {said_no_other} of {others}")
    await c.aclose()


asyncio.run(main())
