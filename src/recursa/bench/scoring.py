"""Scoring helpers shared by the task families, re-exported in one place for runners.

Every family's ``Task.score(prediction, inst)`` uses these; call them directly to score
predictions against hand-made golds."""

from __future__ import annotations

from .tasks.base import Score, answer_segment, last_boxed, match_choice, normalize, numbers_in
from .tasks.codeqa import parse_choice_letter
from .tasks.math_python import equivalent as math_equivalent
from .tasks.math_python import extract_answer as math_extract_answer
from .tasks.math_python import math_score
from .tasks.oolong_pairs import pairs_f1, parse_pairs
from .tasks.strict import (
    contains_words,
    is_dump,
    mentioned,
    strict_choice,
    strict_digits,
    strict_number,
    strict_set,
)
from .tasks.verbatim_copy import char_accuracy, copy_score, levenshtein_similarity, strip_wrapping


def numeric_score(pred: float, gold: float, base: float = 0.75) -> float:
    """OOLONG's partial credit for counts: base ** |error|."""
    return float(base ** abs(pred - gold))


__all__ = [
    "Score", "answer_segment", "char_accuracy", "copy_score", "last_boxed", "levenshtein_similarity",
    "match_choice", "math_equivalent", "math_extract_answer", "math_score", "normalize",
    "numbers_in", "numeric_score", "pairs_f1", "parse_choice_letter", "parse_pairs",
    "strip_wrapping", "contains_words", "is_dump", "mentioned", "strict_choice", "strict_digits",
    "strict_number", "strict_set",
]
