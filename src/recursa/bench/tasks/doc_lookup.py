"""Lookup questions over real documents: four licence texts as Debian ships them
(recursa.bench.documents), each longer than a 2,048-token window, and questions worded the
ways people ask ("within how many days", "which year", "who may", "what must"), each answered
by one passage.

The questions and their answers were written on 2026-12-06 from the documents, before any
method ran on them; the test questions were never used to tune anything (issue 34, item 6).
Answers are scored strictly: every required phrase present (any of its spellings), none of the
passage's look-alikes (GPL-3 names 30 days and 60 days two sentences apart: an answer naming
both is a hedge), and no more than ``MAX_ANSWER_WORDS`` words (a pasted passage is wrong).

A seed picks a question from its split: dev seeds below 1000, test seeds from 1000. The
context is the whole document the question is about; the requested length is not used (a
real document has the length it has: 2.8k-8.8k tokens here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..documents import document
from ..realdata import TEST_SEED_BASE, split_for_seed
from .base import Instance, Score, Task, answer_segment, estimate_tokens
from .real import check_seed
from .strict import MAX_ANSWER_WORDS, contains_words, is_dump

NUMBER_WORDS = {"3": "three", "5": "five", "25": "twenty-five", "30": "thirty", "60": "sixty"}


@dataclass(frozen=True)
class Lookup:
    doc: str
    question: str
    require: tuple[tuple[str, ...], ...]     # every group must be named (any spelling of it)
    forbid: tuple[str, ...] = ()             # look-alikes in the document: naming one is a hedge


def _n(value: str) -> tuple[str, ...]:
    """A number as digits or as a word."""
    return (value, NUMBER_WORDS[value]) if value in NUMBER_WORDS else (value,)


# Written before any run; dev for tuning prompts and rules, test never read by a method's author.
LOOKUPS: dict[str, tuple[Lookup, ...]] = {
    "dev": (
        Lookup("GPL-3", "For how many years at least must the written offer that comes with "
               "object code in a physical product stay valid?", (_n("3"),), ("30", "60")),
        Lookup("MPL-2.0", "Who is the license steward of this licence?",
               (("Mozilla Foundation", "Mozilla"),)),
        Lookup("Apache-2.0", "In which month and year was this version of the licence issued?",
               (("January",), ("2004",))),
        Lookup("GFDL-1.3", "How many words may a Back-Cover Text have at most?", (_n("25"),),
               ("5", "five", "100")),
        Lookup("MPL-2.0", "Where may litigation relating to this licence be brought?",
               (("defendant",),)),
        Lookup("GPL-3", "Who may publish revised and new versions of this licence?",
               (("Free Software Foundation", "FSF"),)),
        Lookup("GFDL-1.3", "Before what date could the operator of an MMC Site republish an "
               "MMC under CC-BY-SA on the same site?",
               (("August 1, 2009", "1 August 2009"),), ("2008",)),
        Lookup("Apache-2.0", "When do the patent licences of someone who sues claiming the Work "
               "infringes a patent end?", (("filed",),)),
    ),
    "test": (
        Lookup("GPL-3", "Within how many days after receiving a first notice of violation must "
               "you cure it for your licence to be reinstated permanently?", (_n("30"),),
               ("60", "sixty")),
        Lookup("GPL-3", "If you stop violating the licence, how many days does a copyright "
               "holder have to notify you before your licence is restored for good?",
               (_n("60"),), ("30", "thirty")),
        Lookup("GPL-3", "Which year is this version of the licence dated?", (("2007",),),
               ("2004", "2008")),
        Lookup("GPL-3", "Before what date must a discriminatory patent arrangement have been "
               "made for it to be allowed?", (("28 March 2007", "March 28, 2007"),),
               ("June",)),
        Lookup("GPL-3", "Which other licence may a covered work be combined with under section "
               "13?", (("Affero",),)),
        Lookup("MPL-2.0", "How many days after you come back into compliance does a Contributor "
               "have to notify you of the non-compliance to keep terminating your grants?",
               (_n("60"),), ("30", "thirty")),
        Lookup("MPL-2.0", "Who may modify or publish new versions of this licence?",
               (("Mozilla Foundation", "Mozilla", "license steward"),)),
        Lookup("Apache-2.0", "What must you cause any modified files to carry when you "
               "redistribute them?", (("notice", "notices"), ("changed", "modified", "changes"))),
        Lookup("Apache-2.0", "Does this licence grant permission to use the Licensor's "
               "trademarks?", (("no", "not", "does not"),), ("yes",)),
        Lookup("GFDL-1.3", "How many words long may a Front-Cover Text be at most?", (_n("5"),),
               ("25", "twenty-five", "100")),
        Lookup("GFDL-1.3", "For at least how long after the last distribution of an Opaque copy "
               "must a Transparent copy stay accessible at the stated location?",
               (("one year", "1 year", "year"),), ("four", "4")),
        Lookup("GFDL-1.3", "By what date must works have been incorporated into an MMC for it to "
               "be eligible for relicensing?", (("November 1, 2008", "1 November 2008"),),
               ("2009",)),
    ),
}


def lookup_for(seed: int) -> tuple[str, int, Lookup]:
    """(split, index, lookup) of a seed: dev below 1000, test from 1000, cycling its list."""
    split = split_for_seed(seed)
    items = LOOKUPS[split]
    i = (seed - (TEST_SEED_BASE if split == "test" else 0)) % len(items)
    return split, i, items[i]


def score_lookup(prediction: str, require: list[list[str]], forbid: list[str]) -> Score:
    """1 when the answer names every required phrase (any spelling), no look-alike, and is an
    answer rather than a passage."""
    seg = answer_segment(prediction)
    if is_dump(seg, MAX_ANSWER_WORDS):
        return Score(score=0.0, metrics={"exact": 0.0, "dump": 1.0})
    found = [any(contains_words(seg, s) for s in group) for group in require]
    hedge = [f for f in forbid if contains_words(seg, f)]
    ok = all(found) and not hedge
    return Score(score=float(ok), metrics={"exact": float(ok), "hedge": float(bool(hedge))},
                 parsed={"found": found, "look_alikes": hedge})


class RealDocLookup(Task):
    name: ClassVar[str] = "real_doc_lookup"
    answer_kinds = ("text",)
    record_kind = "document"
    complexity: ClassVar[str] = "constant"
    description: ClassVar[str] = ("lookup questions over real licence texts (GPL-3, Apache-2.0, "
                                  "MPL-2.0, GFDL-1.3), strict answers")
    default_length: ClassVar[int] = 8192

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, **options: Any) -> Instance:
        if split is not None:
            check_seed(seed, split)
        got_split, i, q = lookup_for(seed)
        text = document(q.doc)
        return Instance(
            id=f"{self.name}-{got_split}-{seed}", task=self.name, query=q.question, context=text,
            gold=[list(g) for g in q.require],
            meta={"doc": q.doc, "split": got_split, "question_index": i,
                  "forbid": list(q.forbid), "question_type": "lookup"},
            length_tokens=estimate_tokens(text))

    def score(self, prediction: str, inst: Instance) -> Score:
        return score_lookup(prediction, inst.gold, inst.meta.get("forbid", []))
