"""A haystack of real text with sentences slipped into its paragraphs at given depths."""

from __future__ import annotations

import random

from ..corpora import Corpus, filler_text
from .base import CHARS_PER_TOKEN


def haystack(rng: random.Random, corpus: Corpus, length_tokens: int,
             inserts: list[tuple[float, str]]) -> str:
    """About ``length_tokens`` tokens of the corpus's paragraphs, with each (depth, sentence) of
    ``inserts`` appended to the paragraph at that depth (0 = first, 1 = last), so inserted
    sentences read as part of the prose rather than standing alone."""
    extra = sum(len(s) + 1 for _, s in inserts)
    text = filler_text(corpus, max(1_000, length_tokens * CHARS_PER_TOKEN - extra), rng)
    paras = text.rstrip().split("\n\n")
    added: dict[int, list[str]] = {}
    for depth, sentence in inserts:
        i = min(len(paras) - 1, max(0, int(depth * len(paras))))
        added.setdefault(i, []).append(sentence)
    out = []
    for i, p in enumerate(paras):
        if i in added:
            p = p.rstrip() + " " + " ".join(added[i])
        out.append(p)
    return "\n\n".join(out)


def spread(rng: random.Random, n: int, lo: float = 0.0, hi: float = 1.0) -> list[float]:
    """``n`` depths in [lo, hi), random but not bunched (one per equal slice, shuffled)."""
    if n <= 0:
        return []
    w = (hi - lo) / n
    out = [lo + w * (i + rng.random()) for i in range(n)]
    rng.shuffle(out)
    return out
