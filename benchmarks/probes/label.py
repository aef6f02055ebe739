"""How often the 1.5B labels a judge_agg review right (dev split): complaint or praise, one
call per review. `free` (the default) asks for one word and reads it; `schema` constrains the
reply to the label set by llama.cpp's json_schema, as the planned mode's llm_map does; `yesno`
asks the question as put and reads yes / no; `neutral` asks "pleased or dissatisfied?" with that
label set constrained; `plan:A,B` builds the leaf as the planned mode's label_count does from its
two labels (in that order; a label of NEGATIVE is the complaint side). Usage: label.py [N] [free|schema|yesno|neutral|plan:A,B]."""

import asyncio
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.tasks import judge_agg
from recursa.bench.tasks._reviews import make_reviews
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.strategies import plan as planner
from recursa.models.local import LocalClient

PROMPT = "{r}\n\n{q}\nReply with one word: complaint or praise."
YESNO = "{r}\n\n{q} Reply yes or no."
SCHEMA = {"type": "string", "enum": ["complaint", "praise"]}
NEUTRAL = "{r}\n\nWas the buyer of this review pleased or dissatisfied with the purchase?"
QFIRST = "--question-first" in sys.argv
NEGATIVE = {"complaint", "dissatisfied", "negative", "unhappy", "bad"}
NEUTRAL_SCHEMA = {"type": "string", "enum": ["pleased", "dissatisfied"]}


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
        if how.startswith("plan:"):
            labels = how[5:].split(",")
            leaf = LeafType.of(labels=labels)
            prompt = leaf_prompt(line, planner.leaf_question(labels), leaf)
            if QFIRST:    # the question before the record: a prefix the server's cache can reuse
                prompt = f"{planner.leaf_question(labels)}\n{leaf.instruction}\n---\n{line}"
            comp = await c.complete([{"role": "user", "content": prompt}], **leaf.options(c))
            got = "complaint" if leaf.parse(comp.text) in NEGATIVE else "praise"
        elif how == "neutral":
            comp = await c.complete([{"role": "user", "content": NEUTRAL.format(r=line)}],
                                    max_tokens=6, temperature=0, json_schema=NEUTRAL_SCHEMA)
            got = "complaint" if "dissatisfied" in comp.text.lower() else "praise"
        elif how == "yesno":
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
