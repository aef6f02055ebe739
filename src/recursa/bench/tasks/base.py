"""Shared types for the offline task families: Instance, Score, Task, and the token estimator."""

from __future__ import annotations

import math
import random
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

Context = str | list[str] | dict[str, str]

# What the record-labelling baselines (recursa.bench.record_baselines) find in a family's
# context, which decides which of them run and how the answer is made:
#   labelled  records one a line from a snapshot with a labelled dev half (tasks/real.py):
#             lexicon, embed and the classifier label each record
#   reviews   synthetic reviews with no labelled half: lexicon and embed label each review
#             complaint / praise as a negative / positive review (no classifier to train)
#   document  one document to look passages up in: embed, as retrieval by meaning
RecordKind = Literal["labelled", "reviews", "document"]

# One documented estimator for every family: ~4 characters per token. tiktoken would be closer
# for OpenAI models but needs its BPE files from the network on first use, which this
# project cannot assume; chars/4 is deterministic, dependency-free and fast on 4M chars.
CHARS_PER_TOKEN = 4


def estimate_tokens(context: Context | None) -> int:
    """Estimated tokens of a context: ceil(chars / 4), summed over list items or dict keys+values."""
    return math.ceil(context_chars(context) / CHARS_PER_TOKEN)


def context_chars(context: Context | None) -> int:
    if context is None:
        return 0
    if isinstance(context, str):
        return len(context)
    if isinstance(context, dict):
        return sum(len(k) + len(v) for k, v in context.items())
    return sum(len(x) for x in context)


class Instance(BaseModel):
    """One generated problem. ``gold`` is JSON-serialisable; ``meta`` holds what scorers and
    tests need to recompute it (labels, positions, corpus used)."""

    id: str
    task: str
    query: str
    context: Context
    gold: Any
    meta: dict[str, Any] = Field(default_factory=dict)
    length_tokens: int


class Score(BaseModel):
    score: float
    metrics: dict[str, float] = Field(default_factory=dict)
    parsed: Any = None

    @field_validator("score")
    @classmethod
    def _in_unit_interval(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"score must be in [0, 1], got {v}")
        return v


class Task(ABC):
    """A task family. Stateless: ``generate`` is a pure function of (seed, length, options)."""

    name: ClassVar[str]
    complexity: ClassVar[str]  # "constant" | "linear" | "quadratic" | "n/a"
    description: ClassVar[str]
    # the kinds of answer it asks for (recursa.frontend.tasks.ANSWER_KINDS); every family
    # declares them, the registry refuses one that does not
    answer_kinds: ClassVar[tuple[str, ...]]
    default_length: ClassVar[int] = 32_000
    # what the record baselines can read in its context (RecordKind); None: they do not run
    record_kind: ClassVar[RecordKind | None] = None

    @abstractmethod
    def generate(self, seed: int = 0, length_tokens: int | None = None, **options: Any) -> Instance:
        ...

    @abstractmethod
    def score(self, prediction: str, inst: Instance) -> Score:
        ...

    def answer_shape(self, inst: Instance) -> dict[str, Any]:
        """What an answer to `inst` looks like: `{"kind": ..., ...}`. The one the instance
        declares (meta's `answer_shape`), else read off its gold and meta; a family whose
        shape its gold does not show says it by overriding this."""
        shape = inst.meta.get("answer_shape")
        if shape:
            return dict(shape)
        gold = inst.gold
        if isinstance(gold, str) and gold.isdigit() and len(gold) >= 4:
            return {"kind": "digits", "n": len(gold)}
        if isinstance(gold, str) and re.fullmatch(r"-?\d+(\.\d+)?", gold):
            return {"kind": "number"}
        for key in ("choices", "candidates", "label_space"):
            if isinstance(inst.meta.get(key), list) and inst.meta[key]:
                return {"kind": "choice", "choices": [str(c) for c in inst.meta[key]]}
        return {"kind": "text"}

    def rng(self, seed: int, length_tokens: int, *extra: Any) -> random.Random:
        # A str seed is hashed with SHA-512 by `random`, so this is stable across processes
        # (unlike hash()) and distinct per (task, seed, length).
        key = ":".join(str(x) for x in (self.name, seed, length_tokens, *extra))
        return random.Random(key)

    def make_id(self, seed: int, length_tokens: int, **options: Any) -> str:
        opts = "".join(f"-{k}={v}" for k, v in sorted(options.items()) if v is not None)
        return f"{self.name}-{length_tokens}-s{seed}{opts}"


# ---------------------------------------------------------------- answer extraction helpers

def answer_segment(prediction: str) -> str:
    """The part of a free-text prediction that states the answer: text after the last
    'Answer:' / 'final answer' marker if any, else the whole prediction."""
    text = prediction or ""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    matches = list(re.finditer(r"(?:final answer|answer)\s*(?:is)?\s*[:=]", text, re.IGNORECASE))
    if matches:
        return text[matches[-1].end():].strip()
    return text.strip()


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (brace-balanced), or None."""
    idx = text.rfind("\\boxed{")
    if idx < 0:
        return None
    i = idx + len("\\boxed{")
    depth = 1
    start = i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


def normalize(text: str) -> str:
    """Lowercase, drop punctuation except inner hyphens/digits grouping, collapse whitespace."""
    text = (text or "").lower()
    text = re.sub(r"\b(the|a|an)\b", " ", text)
    text = re.sub(r"[^\w\s-]", " ", text)
    return " ".join(text.split())


def mentioned_choices(segment: str, choices: list[str]) -> list[str]:
    """Which of ``choices`` appear (normalised, whole-word) in ``segment``. Longer choices
    win over choices they contain (e.g. 'physical sciences' vs 'sciences')."""
    norm = " " + normalize(segment) + " "
    found: list[tuple[int, str]] = []
    for c in sorted(set(choices), key=len, reverse=True):
        nc = normalize(c)
        if not nc:
            continue
        pat = re.compile(r"(?<![\w-])" + re.escape(nc) + r"(?![\w-])")
        m = pat.search(norm)
        if m:
            found.append((m.start(), c))
            norm = pat.sub(" ", norm)  # so a shorter choice inside it is not double-counted
    return [c for _, c in sorted(found)]


def match_choice(prediction: str, gold: str, choices: list[str]) -> tuple[float, Any]:
    """Exact match after normalisation, or: the answer mentions exactly one candidate and it is
    gold. Mentioning several candidates (hedging) scores 0."""
    seg = answer_segment(prediction)
    if normalize(seg) == normalize(gold):
        return 1.0, gold
    found = mentioned_choices(seg, list(choices) + [gold])
    if len(found) == 1:
        return float(normalize(found[0]) == normalize(gold)), found[0]
    return 0.0, found or None


_NUM_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    out: list[float] = []
    for m in _NUM_RE.finditer(text or ""):
        s = m.group().replace(",", "")
        try:
            out.append(float(s))
        except ValueError:
            continue
    return out
