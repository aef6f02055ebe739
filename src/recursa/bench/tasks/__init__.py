"""Offline task families, one per complexity class of the RLM paper (plus PI's environments)."""

from __future__ import annotations

from .base import CHARS_PER_TOKEN, Instance, Score, Task, estimate_tokens
from .browsecomp import BrowseComp
from .codeqa import CodeQA
from .math_python import MathPython
from .oolong import Oolong
from .oolong_pairs import OolongPairs
from .sniah import SNIAH
from .verbatim_copy import VerbatimCopy

TASKS: dict[str, Task] = {
    t.name: t
    for t in (SNIAH(), Oolong(), OolongPairs(), CodeQA(), BrowseComp(), VerbatimCopy(), MathPython())
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASKS)}") from None


__all__ = ["CHARS_PER_TOKEN", "TASKS", "Instance", "Score", "Task", "estimate_tokens", "get_task"]
