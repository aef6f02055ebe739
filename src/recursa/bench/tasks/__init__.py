"""Offline task families, one per complexity class of the RLM paper (plus PI's environments).

A family is a module here plus a row in `registry.py`; the families are looked up through the
front ends' registry (recursa.frontend.tasks), where other packages add theirs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import cast

from recursa.frontend import tasks as _registry

from .base import CHARS_PER_TOKEN, Instance, Score, Task, estimate_tokens
from .real import REAL_TASKS


class _Families(Mapping[str, Task]):
    """Every registered family by name (recursa's own first, in their table's order); a family
    is built on first use."""

    def __getitem__(self, name: str) -> Task:
        if name not in _registry.task_names():
            raise KeyError(name)
        return get_task(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_registry.task_names())

    def __len__(self) -> int:
        return len(_registry.task_names())


TASKS: Mapping[str, Task] = _Families()
# The families built so that no grep, regex or constant passes them (issue 20), with a held-out
# dev / test split of seeds, templates and haystack text.
HELD_OUT = ("para_niah", "para_niah_mv", "two_hop", "judge_agg", "judge_pairs", "meta")
# Real records with labels their publishers assigned (issue 34; tasks/real.py): the records too
# are split into dev / test halves, and dev seeds are below 1000, test seeds 1000 up.
REAL = tuple(t.name for t in REAL_TASKS)
# Lookup questions over real documents (issue 34 item 6; tasks/doc_lookup.py): dev seeds below
# 1000, test seeds from 1000, each split its own questions.
LOOKUP = ("real_doc_lookup",)
# every family that takes split="dev" | "test"
SPLIT_FAMILIES = HELD_OUT + REAL + LOOKUP


def get_task(name: str) -> Task:
    """The family called `name` (KeyError naming the known ones if there is none)."""
    return cast(Task, _registry.get_task(name))


__all__ = ["CHARS_PER_TOKEN", "HELD_OUT", "LOOKUP", "REAL", "SPLIT_FAMILIES", "TASKS", "Instance", "Score", "Task", "estimate_tokens", "get_task"]
