"""S-NIAH (constant complexity): one needle in a haystack of real text, RULER-style."""

from __future__ import annotations

import re
from typing import Any

from ..corpora import filler_text, get_corpus
from ._words import ADJECTIVES, NOUNS
from .base import CHARS_PER_TOKEN, Instance, Score, Task, answer_segment


class SNIAH(Task):
    name = "sniah"
    answer_kinds = ("digits",)
    complexity = "constant"
    description = "Find the 7-digit magic number for a key hidden at a seeded depth in real text."
    default_length = 2**13

    def generate(
        self,
        seed: int = 0,
        length_tokens: int | None = None,
        *,
        depth: float | None = None,
        corpus: str | None = None,
        **_: Any,
    ) -> Instance:
        length = int(length_tokens or self.default_length)
        rng = self.rng(seed, length)
        key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        value = str(rng.randrange(1_000_000, 10_000_000))
        needle = f" One of the special magic numbers for {key} is: {value}. "
        explicit_depth = depth
        if depth is None:
            depth = rng.random()
        corp = get_corpus(corpus)
        total_chars = length * CHARS_PER_TOKEN
        hay = filler_text(corp, max(0, total_chars - len(needle)), rng)
        # Insert at the sentence/paragraph boundary nearest the requested depth so the needle
        # does not split a word (which would make it trivially visible or unfindable).
        pos = int(depth * len(hay))
        boundary = _nearest_boundary(hay, pos)
        context = hay[:boundary] + needle + hay[boundary:]
        query = (
            f"What is the special magic number for {key} mentioned in the provided text? "
            "Answer with the number only."
        )
        return Instance(
            id=self.make_id(seed, length, depth=explicit_depth),
            task=self.name,
            query=query,
            context=context,
            gold=value,
            meta={
                "key": key,
                "needle": needle.strip(),
                "depth": depth,
                "needle_char_offset": boundary + 1,
                "corpus": corp.name,
                "corpus_source": corp.source,
            },
            length_tokens=length,
        )

    def score(self, prediction: str, inst: Instance) -> Score:
        gold = str(inst.gold)
        seg = answer_segment(prediction)
        # Accept "1,234,567" / "1 234 567" groupings; consider only numbers of the gold's size
        # so "7-digit" or list markers don't count as answers.
        cands = [re.sub(r"[ ,]", "", m) for m in re.findall(r"\d[\d, ]*\d|\d", seg)]
        cands = [c for c in cands if len(c) == len(gold)]
        contains = float(gold in cands)
        # A hedge that lists several different numbers is not an answer.
        exact = float(contains == 1.0 and len(set(cands)) == 1)
        return Score(score=exact, metrics={"exact": exact, "contains": contains}, parsed=cands)


def _nearest_boundary(text: str, pos: int) -> int:
    if pos <= 0:
        return 0
    if pos >= len(text):
        return len(text)
    window = 400
    lo, hi = max(0, pos - window), min(len(text), pos + window)
    best = None
    for m in re.finditer(r"(?<=[.!?])\s", text[lo:hi]):
        b = lo + m.start()
        if best is None or abs(b - pos) < abs(best - pos):
            best = b
    if best is None:
        sp = text.rfind(" ", lo, pos + 1)
        best = sp if sp >= 0 else pos
    return best
