import asyncio
import random
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.bench.tasks.split import halves
from recursa.models.local import LocalClient

P = 'Do "{a}" and "{b}" mean the same thing (name the same kind of {kind})? Reply yes or no.'


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    rng = random.Random(1)
    places = halves(para_niah.PLACES)["dev"]
    objects = halves(para_niah.OBJECTS)["dev"]
    res = {"same": [0, 0], "diff": [0, 0]}
    for kind, pairs in (("place", places), ("object", objects)):
        for q, n in pairs:
            for b, want in ((n, "same"), (rng.choice([x[1] for x in pairs if x[1] != n]), "diff")):
                comp = await c.complete(
                    [{"role": "user", "content": P.format(a=q, b=b, kind=kind)}],
                    max_tokens=3,
                    temperature=0,
                )
                yes = comp.text.strip().lower().startswith("yes")
                res[want][0] += yes if want == "same" else not yes
                res[want][1] += 1
                print(kind, q, "|", b, want, comp.text.strip(), flush=True)
    print(res)


asyncio.run(main())
