"""Strict scoring rules for the families a grep cannot pass (and the demo's judge).

Three rules, each with its own test in tests/test_scoring.py:

- **whole words**: a candidate counts only as whole words ("rat" is not in "generator",
  "12" is not in "4127");
- **no hedges, no dumps**: an answer naming several different candidates of the answer's shape
  (two numbers, two labels, two names) scores 0, and so does a passage: an answer segment longer
  than ``MAX_ANSWER_WORDS`` words is a dump of the input, not an answer;
- **numbers**: exact, or within the tolerance the task states (``abs_tol`` / ``rel_tol``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .base import Score, answer_segment, normalize

# A right answer with a sentence of justification fits easily; a pasted paragraph does not.
MAX_ANSWER_WORDS = 40

_NUMBER_RE = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?![\d,]*\d)|(?<![\w.])-?\d+(?:\.\d+)?(?!\w)")


def word_count(text: str) -> int:
    return len((text or "").split())


def is_dump(segment: str, max_words: int = MAX_ANSWER_WORDS) -> bool:
    """True when the answer is a passage rather than an answer."""
    return word_count(segment) > max_words


def contains_words(text: str, phrase: str) -> bool:
    """Whole-word, case- and punctuation-insensitive containment of ``phrase`` in ``text``."""
    p = normalize(phrase)
    if not p:
        return False
    return re.search(r"(?<![\w-])" + re.escape(p) + r"(?![\w-])", normalize(text)) is not None


def mentioned(text: str, candidates: Iterable[str]) -> list[str]:
    """The candidates named (whole words) in ``text``, longest first so that a candidate inside a
    longer one ('Ada' in 'Ada Lovelace') is not counted twice; in order of appearance."""
    norm = " " + normalize(text) + " "
    found: list[tuple[int, str]] = []
    seen: set[str] = set()
    for c in sorted({c for c in candidates if normalize(c)}, key=lambda c: -len(normalize(c))):
        nc = normalize(c)
        if nc in seen:
            continue
        seen.add(nc)
        pat = re.compile(r"(?<![\w-])" + re.escape(nc) + r"(?![\w-])")
        m = pat.search(norm)
        if m:
            found.append((m.start(), c))
            norm = pat.sub(lambda x: " " * len(x.group()), norm)
    return [c for _, c in sorted(found)]


def numbers(text: str) -> list[float]:
    """Numbers written in ``text`` ('1,234' is one number; '7-digit' gives 7)."""
    out = []
    for m in _NUMBER_RE.finditer(text or ""):
        try:
            out.append(float(m.group().replace(",", "")))
        except ValueError:
            continue
    return out


def strict_choice(prediction: str, gold: str, candidates: Sequence[str],
                  max_words: int = MAX_ANSWER_WORDS) -> Score:
    """1 when the answer names ``gold`` (whole words) and no other candidate; 0 for a hedge
    (several candidates), a dump, or a wrong one."""
    seg = answer_segment(prediction)
    if is_dump(seg, max_words):
        return Score(score=0.0, metrics={"exact": 0.0, "dump": 1.0}, parsed=None)
    found = mentioned(seg, [*candidates, gold])
    distinct = {normalize(c) for c in found}
    hedge = len(distinct) > 1
    ok = not hedge and distinct == {normalize(gold)}
    return Score(score=float(ok), metrics={"exact": float(ok), "hedge": float(hedge)},
                 parsed=found or None)


def strict_number(prediction: str, gold: float, *, abs_tol: float = 0.0, rel_tol: float = 0.0,
                  max_words: int = MAX_ANSWER_WORDS) -> Score:
    """1 when the answer states one number and it is within max(abs_tol, rel_tol * |gold|) of
    gold; several different numbers (a hedge or a range) or a dump score 0."""
    seg = answer_segment(prediction)
    if is_dump(seg, max_words):
        return Score(score=0.0, metrics={"exact": 0.0, "dump": 1.0}, parsed=None)
    nums = sorted(set(numbers(seg)))
    if len(nums) != 1:
        return Score(score=0.0, metrics={"exact": 0.0, "hedge": float(len(nums) > 1)},
                     parsed=nums or None)
    err = abs(nums[0] - float(gold))
    tol = max(abs_tol, rel_tol * abs(float(gold)))
    return Score(score=float(err <= tol + 1e-9),
                 metrics={"exact": float(err == 0), "abs_error": err, "hedge": 0.0},
                 parsed=nums[0])


def strict_digits(prediction: str, gold: str, max_words: int = MAX_ANSWER_WORDS) -> Score:
    """A code of a fixed number of digits ('4827193'; '4,827,193' also accepted): 1 when it is
    the only code of that length in the answer."""
    seg = answer_segment(prediction)
    if is_dump(seg, max_words):
        return Score(score=0.0, metrics={"exact": 0.0, "dump": 1.0}, parsed=None)
    codes = digit_codes(seg, len(gold))
    hedge = len(set(codes)) > 1
    ok = not hedge and set(codes) == {gold}
    return Score(score=float(ok), metrics={"exact": float(ok), "hedge": float(hedge)},
                 parsed=codes or None)


def digit_codes(text: str, n_digits: int) -> list[str]:
    """Whole runs of exactly ``n_digits`` digits (with optional thousands separators)."""
    out = []
    for m in re.finditer(r"(?<![\w,])\d[\d,]*\d(?![\w]|,\d)|(?<![\w,])\d(?![\w,])", text or ""):
        digits = m.group().replace(",", "")
        if len(digits) == n_digits:
            out.append(digits)
    return out


def strict_set(prediction: str, gold: Sequence[str], candidates: Sequence[str] | None = None,
               *, n_digits: int | None = None, max_words: int = MAX_ANSWER_WORDS) -> Score:
    """Several values asked for at once (RULER's multi-value): F1 of the values named against the
    gold set, so listing every value of the shape (a hedge) earns little precision."""
    seg = answer_segment(prediction)
    if is_dump(seg, max_words):
        return Score(score=0.0, metrics={"f1": 0.0, "dump": 1.0}, parsed=None)
    if n_digits is not None:
        pred = set(digit_codes(seg, n_digits))
        g = set(gold)
    else:
        pred = {normalize(c) for c in mentioned(seg, [*(candidates or []), *gold])}
        g = {normalize(x) for x in gold}
    tp = len(pred & g)
    p = tp / len(pred) if pred else 0.0
    r = tp / len(g) if g else 0.0
    f1 = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return Score(score=f1, metrics={"f1": f1, "precision": p, "recall": r}, parsed=sorted(pred))
