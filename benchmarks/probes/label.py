"""How often the 1.5B labels a judge_agg review right (dev split): complaint or praise, one
call per review. `free` (the default) asks for one word and reads it; `schema` constrains the
reply to the label set by llama.cpp's json_schema, as the planned mode's llm_map does; `yesno`
asks the question as put and reads yes / no. Usage: label.py [N] [free|schema|yesno]."""

import asyncio
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import judge_agg
from recursa.bench.tasks._reviews import make_reviews
from recursa.models.local import LocalClient

PROMPT = "{r}\n\n{q}\nReply with one word: complaint or praise."
YESNO = "{r}\n\n{q} Reply yes or no."
SCHEMA = {"type": "string", "enum": ["complaint", "praise"]}


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    how = sys.argv[2] if len(sys.argv) > 2 else "free"
    replies: Counter[str] = Counter()
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=4096, slots=1)
    rs = make_reviews(random.Random(7), 4096, "dev")
    q = "Is this review a complaint " + judge_agg.DEFINE["dev"] + "?"
    lines = [x for x in rs.text().splitlines() if x.startswith("Review")]
    ok = fp = fn = 0
    for line, label in list(zip(lines, rs.labels, strict=True))[:n]:
        if how == "yesno":
            comp = await c.complete([{"role": "user", "content": YESNO.format(r=line, q=q)}],
                                    max_tokens=3, temperature=0)
            got = "complaint" if comp.text.strip().lower().startswith("yes") else "praise"
        else:
            extra = {"json_schema": SCHEMA} if how == "schema" else {}
            comp = await c.complete([{"role": "user", "content": PROMPT.format(r=line, q=q)}],
                                    max_tokens=6, temperature=0, **extra)
            got = "complaint" if "complaint" in comp.text.lower() else "praise"
        replies[comp.text.strip()[:20]] += 1
        ok += got == label
        fp += got == "complaint" and label == "praise"
        fn += got == "praise" and label == "complaint"
    print(f"{how}: right {ok}/{n}; complaint for praise {fp}, praise for complaint {fn}; "
          f"replies {dict(replies.most_common(4))}")


asyncio.run(main())
