"""para_niah dev: each candidate sentence read alone by the 1.5B with the plan's reader prompt
(the question, "answer every part ... or reply 'none'"): does it answer the needle and say
'none' to its look-alikes (each shares the place or the object) and the filing notes?

Run as `.venv/bin/python benchmarks/probes/read_alone.py 8192 8` (length, dev seeds 0..N-1)."""

import asyncio
import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.models.local import LocalClient

READ = (" Answer every part of the question from the text above in one short sentence, "
        "or reply 'none' if the text does not say.")       # planner._PLAN_READ


def said(text: str) -> bool:
    return text.strip(" .'\"").lower() != "none"


async def main() -> None:
    length, n = int(sys.argv[1]), int(sys.argv[2])
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048, slots=1)
    task = para_niah.ParaNIAH()
    needle_right = alike_said = alike_n = notes_said = notes_n = alone = 0
    for seed in range(n):
        inst = task.generate(seed, length, split="dev")
        q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
        notes = [s for s in re.split(r"(?<=[.!?])\s+", inst.context)
                 if re.search(r"\b\d{7}\b", s) and s not in inst.meta["needles"]
                 and s not in inst.meta["distractors"]][:3]

        async def read(s: str, q: str = q) -> str:
            r = await c.complete([{"role": "user", "content": f"{s}\n\n---\n{q}{READ}"}],
                                 max_tokens=40, temperature=0)
            return r.text.strip()
        a_needle = await read(inst.meta["needles"][0])
        a_alike = [await read(s) for s in inst.meta["distractors"]]
        a_notes = [await read(s) for s in notes]
        ok = inst.gold in a_needle
        needle_right += ok
        alike_said += sum(map(said, a_alike))
        alike_n += len(a_alike)
        notes_said += sum(map(said, a_notes))
        notes_n += len(a_notes)
        alone += ok and not any(map(said, a_alike + a_notes))
        print(f"seed {seed}: needle {a_needle!r}; look-alikes answered "
              f"{sum(map(said, a_alike))} of {len(a_alike)}; notes {sum(map(said, a_notes))}",
              flush=True)
    print(f"needle answered right {needle_right} of {n}; look-alikes answered {alike_said} of "
          f"{alike_n}; notes answered {notes_said} of {notes_n}; the needle the only one "
          f"answered {alone} of {n}")
    await c.aclose()


asyncio.run(main())
