"""The no-model baseline a lookup question deserves beside grep: zero-shot retrieval by meaning.
The text's sentences (hard-wrapped lines joined) are encoded with the same pinned MiniLM as the
record baselines (recursa.bench.embed). Over a document, the answer is the sentence nearest the
question: right under the strict scorer when that sentence is short, names the answer and no
look-alike. Where the answer is one n-digit code (a needle among look-alikes), it is the code of
the nearest sentence that holds one."""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.;:?!])\s+(?=[A-Z(\"0-9])")


def sentences(text: str) -> list[str]:
    """The document's sentences, paragraphs' wrapped lines joined, empty ones dropped."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        flat = " ".join(para.split())
        out.extend(s.strip() for s in _SENTENCE_END.split(flat) if len(s.split()) >= 3)
    return out


def nearest_sentence(query: str, text: str) -> str:
    """The sentence of ``text`` most similar to ``query`` (cosine of MiniLM mean-pooled vectors)."""
    from .embed import encoder
    sents = sentences(text)
    if not sents:
        return ""
    enc = encoder()
    sims = enc.encode(sents) @ enc.encode([query])[0]
    return sents[int(sims.argmax())]


def nearest_code(query: str, text: str, n: int) -> str:
    """The n-digit code of the sentence nearest ``query`` among the sentences holding one."""
    from .embed import encoder
    code = re.compile(r"(?<![\d,])\d{" + str(n) + r"}(?![\d,])")
    held = [(s, m.group(0)) for s in sentences(text) if (m := code.search(s))]
    if not held:
        return ""
    enc = encoder()
    sims = enc.encode([s for s, _ in held]) @ enc.encode([query])[0]
    return held[int(sims.argmax())][1]
