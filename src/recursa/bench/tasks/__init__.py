"""Offline task families, one per complexity class of the RLM paper (plus PI's environments)."""

from __future__ import annotations

from .base import CHARS_PER_TOKEN, Instance, Score, Task, estimate_tokens
from .browsecomp import BrowseComp
from .codeqa import CodeQA
from .doc_lookup import RealDocLookup
from .judge_agg import JudgeAgg
from .judge_pairs import JudgePairs
from .math_python import MathPython
from .meta import Meta
from .oolong import Oolong
from .oolong_pairs import OolongPairs
from .para_niah import ParaNIAH, ParaNIAHMultiValue
from .real import REAL_TASKS
from .sniah import SNIAH
from .two_hop import TwoHop
from .verbatim_copy import VerbatimCopy

TASKS: dict[str, Task] = {
    t.name: t
    for t in (SNIAH(), Oolong(), OolongPairs(), CodeQA(), BrowseComp(), VerbatimCopy(), MathPython(),
              ParaNIAH(), ParaNIAHMultiValue(), JudgeAgg(), JudgePairs(), TwoHop(), Meta(),
              *REAL_TASKS, RealDocLookup())
}
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
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASKS)}") from None


__all__ = ["CHARS_PER_TOKEN", "HELD_OUT", "LOOKUP", "REAL", "SPLIT_FAMILIES", "TASKS", "Instance", "Score", "Task", "estimate_tokens", "get_task"]
