"""Verbatim copy (Prime Intellect's verbatim-copy environment, offline): reproduce a text
exactly. Content types json, csv, codes, words, mixed; optionally split into fragments."""

from __future__ import annotations

import csv
import io
import json
import random
import re
import string
from difflib import SequenceMatcher
from functools import lru_cache
from typing import Any

from ..corpora import get_corpus
from ._words import ADJECTIVES, FIRST_NAMES, NOUNS
from .base import CHARS_PER_TOKEN, Instance, Score, Task

CONTENT_TYPES = ("json", "csv", "codes", "words", "mixed")


@lru_cache(maxsize=4)
def _vocab(corpus_name: str) -> tuple[str, ...]:
    corp = get_corpus(corpus_name)
    words: set[str] = set()
    for p in corp.paragraphs[:3000]:
        words.update(re.findall(r"\b[A-Za-z][a-z]{1,14}\b", p))
    return tuple(sorted(words))


def _json_item(rng: random.Random) -> str:
    rec = {
        "id": rng.randrange(10**5, 10**6),
        "name": f"{rng.choice(FIRST_NAMES)} {rng.choice(NOUNS).capitalize()}",
        "score": round(rng.uniform(-100, 100), rng.randrange(1, 5)),
        "active": rng.random() < 0.5,
        "tags": rng.sample(ADJECTIVES, rng.randrange(0, 4)),
        "ref": None if rng.random() < 0.2 else "".join(rng.choices(string.hexdigits.lower(), k=12)),
    }
    return json.dumps(rec, ensure_ascii=False)


def _csv_row(rng: random.Random) -> str:
    buf = io.StringIO()
    name = f"{rng.choice(NOUNS)}, {rng.choice(ADJECTIVES)}" if rng.random() < 0.2 else rng.choice(NOUNS)
    csv.writer(buf, lineterminator="").writerow(
        [rng.randrange(1, 10**6), name, f"{rng.uniform(0, 1e4):.2f}",
         f"20{rng.randrange(10, 30)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
         rng.choice(("yes", "no", ""))]
    )
    return buf.getvalue()


def _code(rng: random.Random) -> str:
    alphabet = string.ascii_uppercase + string.digits
    style = rng.randrange(3)
    if style == 0:
        return "-".join("".join(rng.choices(alphabet, k=4)) for _ in range(4))
    if style == 1:
        h = "".join(rng.choices("0123456789abcdef", k=32))
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return "".join(rng.choices(string.ascii_letters + string.digits + "_$#@", k=rng.randrange(8, 24)))


def _words_line(rng: random.Random, vocab: tuple[str, ...]) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randrange(6, 14)))


class VerbatimCopy(Task):
    name = "verbatim_copy"
    answer_kinds = ("text",)
    complexity = "linear (output)"
    description = "Reproduce a text exactly; exact match with char accuracy and Levenshtein metrics."
    default_length = 1_000

    def generate(
        self,
        seed: int = 0,
        length_tokens: int | None = None,
        *,
        content: str | None = None,
        fragments: int = 1,
        **_: Any,
    ) -> Instance:
        length = int(length_tokens or self.default_length)
        rng = self.rng(seed, length, content or "", fragments)
        content = content or rng.choice(CONTENT_TYPES)
        if content not in CONTENT_TYPES:
            raise ValueError(f"content must be one of {CONTENT_TYPES}")
        corp = get_corpus()
        vocab = _vocab(corp.name)
        budget = length * CHARS_PER_TOKEN
        lines: list[str] = []
        used = 0
        kind = content
        if content == "csv":
            lines.append("id,name,amount,date,flag")
            used = len(lines[0])
        while True:
            if content == "mixed" and (not lines or rng.random() < 0.15):
                kind = rng.choice(CONTENT_TYPES[:4])
            line = {
                "json": lambda: _json_item(rng),
                "csv": lambda: _csv_row(rng),
                "codes": lambda: _code(rng),
                "words": lambda: _words_line(rng, vocab),
            }[kind]()
            cost = len(line) + (1 if lines else 0)
            if used + cost > budget:
                # Close the gap with a code of exactly the right size (min 4 chars) so short
                # targets still land within a few characters.
                room = budget - used - (1 if lines else 0)
                if room >= 4:
                    lines.append("".join(rng.choices(string.ascii_letters + string.digits, k=room)))
                break
            lines.append(line)
            used += cost
        text = "\n".join(lines)
        context: str | list[str]
        if fragments > 1:
            cuts = sorted(rng.sample(range(1, len(text)), min(fragments - 1, len(text) - 1)))
            context = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            query = (
                f"The context is a list of {len(context)} text fragments. Concatenate them in "
                "order (no separators) and reproduce the result exactly, character for character."
            )
        else:
            context = text
            query = "Reproduce the text in the context exactly, character for character."
        return Instance(
            id=self.make_id(seed, length, content=content, fragments=fragments),
            task=self.name,
            query=query,
            context=context,
            gold=text,
            meta={"content": content, "fragments": fragments, "n_lines": len(lines), "corpus": corp.name},
            length_tokens=length,
        )

    def score(self, prediction: str, inst: Instance) -> Score:
        return copy_score(prediction, str(inst.gold))


def strip_wrapping(prediction: str) -> str:
    """Remove one surrounding markdown code fence, then outer blank lines (models add them)."""
    text = prediction or ""
    m = re.fullmatch(r"\s*```[^\n]*\n(.*?)\n?```\s*", text, re.DOTALL)
    if m:
        text = m.group(1)
    return text.strip("\n")


def char_accuracy(pred: str, gold: str) -> float:
    """Fraction of positions (over the longer string) where both strings hold the same char."""
    n = max(len(pred), len(gold))
    if n == 0:
        return 1.0
    return sum(1 for a, b in zip(pred, gold, strict=False) if a == b) / n


def levenshtein_similarity(pred: str, gold: str) -> float:
    """1 - edit distance / max length (rapidfuzz); difflib ratio as an approximation without it."""
    try:
        from rapidfuzz.distance import Levenshtein
    except ImportError:
        return SequenceMatcher(None, pred, gold, autojunk=False).ratio()
    return float(Levenshtein.normalized_similarity(pred, gold))


def copy_score(prediction: str, gold: str) -> Score:
    pred = strip_wrapping(prediction)
    exact = float(pred == gold)
    return Score(
        score=exact,
        metrics={
            "exact": exact,
            "char_accuracy": char_accuracy(pred, gold),
            "levenshtein_similarity": levenshtein_similarity(pred, gold),
        },
        parsed=pred,
    )
