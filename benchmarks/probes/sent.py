import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import para_niah
from recursa.core.semantic import SemanticIndex

T = para_niah.ParaNIAH()
split = sys.argv[1]
L = int(sys.argv[2])
n = int(sys.argv[3])
top1 = {"semantic": 0, "hybrid": 0}
for seed in range(n):
    inst = T.generate(seed, L, split=split)
    q = inst.query.replace(para_niah.ANSWER_SUFFIX, "")
    cands = inst.meta["needles"][:1] + inst.meta["distractors"]
    idx = SemanticIndex(cands)
    for mode in top1:
        r = idx.rank(q, mode=mode)
        top1[mode] += idx._hit(r[0][0], r[0][1]).get("item") == 0
print(top1, n)
