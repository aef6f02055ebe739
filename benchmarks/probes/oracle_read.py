"""An oracle read for the lookup family: the 1.5B reader given only the paragraph that holds
the answer (found by its required phrase), with the planned mode's reader prompt. Separates
"search did not bring the passage" from "the reader misread it" (issue 34 item 7).

Run on 2026-12-06 after the sealed test cell of real_doc_lookup had run once (its questions are
now spent for tuning: any change informed by this needs new test questions).

Measured 2026-12-06: test 7 of 12 (the RLM's sealed cell: 4 of 12), dev 5 of 8 (the RLM end to end:
7 of 8: it reads several pieces, and one right reader is enough). Given the
paragraph holding the answer, the 1.5B says "none" to the patent-arrangement date, the Affero
combination, the notices on modified files, the trademark question and the MMC date.

Usage: oracle_read.py [dev|test]
"""
import asyncio
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa.bench.documents import document
from recursa.bench.tasks.base import normalize
from recursa.bench.tasks.doc_lookup import LOOKUPS, score_lookup
from recursa.models.local import LocalClient

READ = (" Answer every part of the question from the text in one short sentence, or reply "
        "'none' if the text does not say.")


def paragraph(text: str, phrases: tuple[str, ...]) -> str:
    """The first paragraph naming the answer that is not a heading (15 words or more), else the
    first naming it at all (a title line: "Version 2.0, January 2004")."""
    hits = [para.strip() for para in re.split(r"\n\s*\n", text)
            if any(normalize(p) in normalize(para) for p in phrases)]
    if not hits:
        raise LookupError(phrases)
    return next((h for h in hits if len(h.split()) >= 15), hits[0])


async def main(split: str) -> None:
    c = LocalClient("qwen2.5-coder-1.5b", n_ctx=2048)
    right = 0
    for q in LOOKUPS[split]:
        para = paragraph(document(q.doc), q.require[0])
        prompt = f"{q.question}{READ}\n\nText:\n{para}\n---\n{q.question}{READ}"
        comp = await c.complete([{"role": "user", "content": prompt}], temperature=0.0,
                                max_tokens=60)
        ok = score_lookup(comp.text, [list(g) for g in q.require], list(q.forbid)).score
        right += ok
        print(f"{ok:.0f} {len(para):5d} chars | {q.question[:60]} -> {comp.text.strip()[:80]!r}",
              flush=True)
    print(f"oracle read: {right:.0f} of {len(LOOKUPS[split])} ({split})")
    await c.aclose()

asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "dev"))
