"""The held-out protocol: every new family draws its seeds' randomness, its templates (phrasings
of needles, records and questions) and its haystack text from one of two disjoint splits.

- ``dev``: for tuning prompts, worked examples, tips and guards;
- ``test``: the split the committed tables report (the default).

Seeds: the split's name is part of every random key, so dev seed 3 and test seed 3 are unrelated
instances. Templates: each family keeps its phrasings in ``{"dev": [...], "test": [...]}`` lists
with no phrasing in both. Haystack sources: a corpus's paragraphs are assigned to a split by a
stable hash of their title (or text), a third to dev and two thirds to test, so no paragraph of
real text appears in both.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..corpora import Corpus, get_corpus

SPLITS = ("dev", "test")
DEFAULT_SPLIT = "test"
T = TypeVar("T")


def check_split(split: str | None) -> str:
    split = split or DEFAULT_SPLIT
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return split


def split_rng(task: str, split: str, seed: int, length: int, *extra: Any) -> random.Random:
    """A random stream per (task, split, seed, length): distinct splits never share one."""
    key = ":".join(str(x) for x in (task, split, seed, length, *extra))
    return random.Random(key)


def paragraph_split(title: str, text: str) -> str:
    """Which split a corpus paragraph belongs to (stable across machines and runs)."""
    h = zlib.crc32((title or text[:200]).encode("utf-8"))
    return "dev" if h % 3 == 0 else "test"


_SPLIT_CACHE: dict[tuple[str, str, str], Corpus] = {}


def split_corpus(name: str | None, split: str) -> Corpus:
    """The paragraphs of a corpus that belong to ``split`` (titles/labels kept parallel). The
    corpus is resolved first (fallback chain), so a machine without the wiki package gets the
    split of the corpus it has."""
    corp = get_corpus(name)
    key = (corp.name, corp.source, check_split(split))
    if key not in _SPLIT_CACHE:
        titles = corp.titles or ("",) * len(corp.paragraphs)
        keep = [i for i, (t, p) in enumerate(zip(titles, corp.paragraphs, strict=True))
                if paragraph_split(t, p) == split]
        _SPLIT_CACHE[key] = Corpus(
            name=corp.name, source=corp.source, license=corp.license,
            paragraphs=tuple(corp.paragraphs[i] for i in keep),
            titles=tuple(corp.titles[i] for i in keep) if corp.titles else (),
            labels=tuple(corp.labels[i] for i in keep) if corp.labels else (),
            extra={"split": split},
        )
    return _SPLIT_CACHE[key]


def pick(templates: Mapping[str, T], split: str) -> T:
    """The split's own templates."""
    return templates[check_split(split)]


def halves(items: Sequence[T]) -> dict[str, list[T]]:
    """Split a word list into dev (every third item) and test (the rest), disjoint."""
    return {"dev": [x for i, x in enumerate(items) if i % 3 == 0],
            "test": [x for i, x in enumerate(items) if i % 3 != 0]}


def start(task: Any, seed: int, length_tokens: int | None, split: str | None,
          choice: str | None = None, choices: Sequence[str] = (), what: str = "question"
          ) -> tuple[str, int, random.Random, str]:
    """What every held-out family's `generate` begins with: the checked split, the length, the
    random stream, and the instance id. ``choice`` is an optional fixed question type /
    condition, checked against ``choices``."""
    split = check_split(split)
    if choice is not None and choice not in choices:
        raise ValueError(f"{what} must be one of {tuple(choices)}")
    length = int(length_tokens or task.default_length)
    # families with a choice key their stream on it ('' when free), the others on nothing
    rng = split_rng(task.name, split, seed, length, *([choice or ""] if choices else []))
    inst_id = f"{task.name}-{length}-{split}-s{seed}" + (f"-{choice}" if choice else "")
    return split, length, rng, inst_id
