import asyncio
import json
import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa import demo_paraphrase as D
from recursa.core.semantic import SemanticIndex
from recursa.models.local import LocalClient

HYDE = "Write one short sentence, in plain everyday words, that a document answering this question might contain (invent the details): "
READ = " Answer from the text above in a few words, or reply 'none' if it does not say."
FILT = "{w}\n\nQuestion: {q}\nIs the text above about what the question asks (the same event, perhaps in other words)? Reply yes or no."


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    seeds = range(int(sys.argv[1]), int(sys.argv[2]))
    stats = {}
    for seed in seeds:
        case = D.make_case(seed)
        ctx = case.context
        reps = [m.start() for m in re.finditer("MAINTENANCE REPORT", ctx)]
        power = ctx.index("MAINTENANCE REPORT - loss of power")

        idx = SemanticIndex(ctx)
        comp = await c.complete(
            [{"role": "user", "content": HYDE + case.query}], max_tokens=60, temperature=0
        )
        hyde = comp.text
        for name, v in (("q", case.query), ("q+hyde", case.query + " " + hyde), ("hyde", hyde)):
            for mode in ("semantic", "hybrid", "bm25"):
                r = None
                for i, (pi, s) in enumerate(idx.rank(v, mode=mode)[:10]):
                    h = idx._hit(pi, s)
                    if h["start"] - 300 <= power + 1500 and h["end"] + 1500 >= power and r is None:
                        r = i
                stats.setdefault((name, mode), []).append(r)
        # reading each report alone
        reads = {}
        for s in reps:
            w = ctx[max(0, s - 300) : s + 1800]
            comp = await c.complete(
                [{"role": "user", "content": w + "\n\n" + case.query + READ}],
                max_tokens=60,
                temperature=0,
            )
            f = await c.complete(
                [{"role": "user", "content": FILT.format(w=w, q=case.query)}],
                max_tokens=3,
                temperature=0,
            )
            reads["P" if s == power else f"o{s}"] = (comp.text.strip()[:100], f.text.strip())
        pr = reads["P"]
        print(
            seed,
            case.fixer,
            case.cause_word,
            "hyde:",
            hyde[:80],
            json.dumps(reads)[:900],
            flush=True,
        )
        stats.setdefault("read_ok", []).append(case.check(pr[0]))
        stats.setdefault("filt_power_yes", []).append(pr[1].lower().startswith("yes"))
        stats.setdefault("filt_other_no", []).extend(
            v[1].lower().startswith("no") for k, v in reads.items() if k != "P"
        )
        stats.setdefault("other_none", []).extend(
            "none" in v[0].lower() for k, v in reads.items() if k != "P"
        )
    for k, v in stats.items():
        if isinstance(k, tuple):
            print(
                k,
                v,
                "top4",
                sum(1 for x in v if x is not None and x < 4),
                "top6",
                sum(1 for x in v if x is not None and x < 6),
                "/",
                len(v),
            )
        else:
            print(k, sum(v), "/", len(v))


asyncio.run(main())
