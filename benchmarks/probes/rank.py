import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.core.semantic import SemanticIndex

T = para_niah.ParaNIAH()
split = sys.argv[1] if len(sys.argv) > 1 else "dev"
L = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
res = {}
for seed in range(int(sys.argv[3]) if len(sys.argv) > 3 else 12):
    inst = T.generate(seed, L, split=split)
    ctx = inst.context
    needle = inst.meta["needles"][0]
    pos = ctx.index(needle)
    idx = SemanticIndex(ctx)
    q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
    pn, on = inst.meta["key_needle"]
    variants = {"q": q, "q+oracle": q + " " + pn + " " + on}
    for mode in ("hybrid", "bm25", "semantic"):
        for name, v in variants.items():
            ranked = idx.rank(v, mode=mode)
            r = None
            for i, (pi, s) in enumerate(ranked):
                h = idx._hit(pi, s)
                if h["start"] - 300 <= pos <= h["end"] + 1500 and h.get("item") is None:
                    r = i
                    break
            res.setdefault((mode, name), []).append(r)
for k, v in res.items():
    print(k, v, "top6:", sum(1 for x in v if x is not None and x < 6), "/", len(v))
