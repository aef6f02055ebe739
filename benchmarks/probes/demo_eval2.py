import asyncio
import random
import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
from recursa import demo_paraphrase as D
from recursa.models.local import LocalClient

READ = " Answer from the text above in a few words, or reply 'none' if it does not say."
CHOOSE = (
    "Question: {q}\n\nWhich of these passages is about what the question asks (it may use other words)?\n\n{ps}\n\n"
    "Reply with the passage's number only."
)


async def main():
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    ok = {"choose": 0, "read_plain": 0, "n": 0}
    for seed in range(int(sys.argv[1]), int(sys.argv[2])):
        case = D.make_case(seed)
        ctx = case.context
        reps = [
            ctx[m.start() : ctx.index("Costs:", m.start())]
            for m in re.finditer("MAINTENANCE REPORT", ctx)
        ]
        power = [r for r in reps if "loss of power" in r][0]
        order = reps[:]
        random.Random(seed).shuffle(order)
        ps = "\n\n".join(f"[{i + 1}] " + r[:400].replace("\n", " ") for i, r in enumerate(order))
        comp = await c.complete(
            [{"role": "user", "content": CHOOSE.format(q=case.query, ps=ps)}],
            max_tokens=4,
            temperature=0,
        )
        m = re.search(r"\d", comp.text)
        pick = int(m.group()) - 1 if m else -1
        ok["choose"] += 0 <= pick < len(order) and order[pick] is power
        # plain report: drop the staff sentences
        plain = power
        for s in re.findall(
            r"[^.\n]*(?:duty engineer|morning shift|wrote to the board)[^.\n]*\.", power
        ):
            plain = plain.replace(s, "")
        comp2 = await c.complete(
            [{"role": "user", "content": plain + "\n\n" + case.query + READ}],
            max_tokens=60,
            temperature=0,
        )
        ok["read_plain"] += case.check(comp2.text)
        ok["n"] += 1
        print(
            seed,
            case.fixer,
            case.cause_word,
            "pick",
            pick,
            comp.text.strip(),
            "| read:",
            comp2.text.strip()[:150],
            flush=True,
        )
    print(ok)


asyncio.run(main())
