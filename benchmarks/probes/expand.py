import asyncio
import json
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.core.semantic import SemanticIndex
from recursa.models.local import LocalClient

T = para_niah.ParaNIAH()
PROMPTS = {
    "hyde": "Write one short sentence, in plain everyday words, that a document answering this question might contain (invent the details): {q}",
    "syn": "A document answers this question but uses different words. List 8 other words or short phrases (synonyms) for the places, things and actions in it, comma-separated, nothing else: {q}",
}


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    L = int(sys.argv[1])
    n = int(sys.argv[2])
    split = sys.argv[3] if len(sys.argv) > 3 else "dev"
    res = {}
    for seed in range(n):
        inst = T.generate(seed, L, split=split)
        ctx = inst.context
        pos = ctx.index(inst.meta["needles"][0])
        idx = SemanticIndex(ctx)
        q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
        outs = {}
        for name, p in PROMPTS.items():
            comp = await c.complete(
                [{"role": "user", "content": p.format(q=q)}], max_tokens=60, temperature=0
            )
            outs[name] = comp.text
        print(seed, inst.meta["key_needle"], json.dumps(outs))
        variants = {
            "q": q,
            "q+hyde": q + " " + outs["hyde"],
            "q+syn": q + " " + outs["syn"],
            "q+hyde+syn": q + " " + outs["hyde"] + " " + outs["syn"],
            "syn": outs["syn"],
        }
        for mode in ("hybrid", "semantic"):
            for name, v in variants.items():
                r = None
                for i, (pi, s) in enumerate(idx.rank(v, mode=mode)):
                    h = idx._hit(pi, s)
                    if h["start"] - 300 <= pos <= h["end"] + 1500:
                        r = i
                        break
                res.setdefault((mode, name), []).append(r)
    for k, v in res.items():
        print(
            k,
            v,
            "top6:",
            sum(1 for x in v if x is not None and x < 6),
            "top10:",
            sum(1 for x in v if x is not None and x < 10),
            "/",
            len(v),
        )


asyncio.run(main())
