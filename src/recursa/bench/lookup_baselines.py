"""The no-model baseline a lookup question over one document deserves beside grep: zero-shot
retrieval by meaning. The document's sentences (its hard-wrapped lines joined) are encoded
with the same pinned MiniLM as the record baselines (recursa.bench.embed), and the answer is
the sentence nearest the question: right under the strict scorer when that sentence is short,
names the answer and no look-alike."""

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
