import asyncio
import json
import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.core.semantic import SemanticIndex
from recursa.models.local import LocalClient

T = para_niah.ParaNIAH()
READ_A = "{w}\n\n{q} Answer from the text above in a few words, or reply 'none' if it does not say."
READ_B = (
    "{w}\n\nQuestion: {q}\nThe text above may use other words for the same things (synonyms). "
    "If a sentence above answers the question, meaning the same place and the same object, reply with the answer only; otherwise reply 'none'."
)
VERIFY = (
    "Question: {q}\nSentence: {s}\nDoes the sentence answer the question? It may use other words "
    "for the same place and thing, but both must be the same. Reply yes or no."
)


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    L = int(sys.argv[1])
    n = int(sys.argv[2])
    split = "dev"
    acc = {"A": 0, "B": 0, "Vneedle": 0, "Vdis_no": 0, "Vdis_n": 0}
    for seed in range(n):
        inst = T.generate(seed, L, split=split)
        ctx = inst.context
        needle = inst.meta["needles"][0]
        pos = ctx.index(needle)
        q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
        idx = SemanticIndex(ctx)
        hit = None
        for pi, s in idx.rank(q, mode="semantic"):
            h = idx._hit(pi, s)
            if h["start"] <= pos <= h["end"]:
                hit = h
                break
        w = ctx[max(0, hit["start"] - 300) : hit["end"] + 300]
        gold = inst.gold
        out = {}
        for name, p in (("A", READ_A), ("B", READ_B)):
            comp = await c.complete(
                [{"role": "user", "content": p.format(w=w, q=q)}], max_tokens=30, temperature=0
            )
            out[name] = comp.text.strip()
            acc[name] += gold in comp.text and len(re.findall(r"\d{7}", comp.text)) == 1
        comp = await c.complete(
            [{"role": "user", "content": VERIFY.format(q=q, s=needle)}], max_tokens=3, temperature=0
        )
        out["Vn"] = comp.text.strip()
        acc["Vneedle"] += comp.text.strip().lower().startswith("yes")
        for d in inst.meta["distractors"][:3]:
            comp = await c.complete(
                [{"role": "user", "content": VERIFY.format(q=q, s=d)}], max_tokens=3, temperature=0
            )
            acc["Vdis_n"] += 1
            acc["Vdis_no"] += comp.text.strip().lower().startswith("no")
        nd = sum(d in w for d in inst.meta["distractors"])
        print(seed, gold, "distractors in window:", nd, len(w), json.dumps(out), flush=True)
    print(acc)


asyncio.run(main())
