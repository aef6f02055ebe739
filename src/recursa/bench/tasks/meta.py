"""Plain questions about the input itself: how many lines, how many records, which record is the
longest. A regression check: every mode must keep these right (a 1.5B once answered a line count
by copying its worked example's search for another question). The text ends with a newline, as a
file does, so `len(context.split("\\n"))` is one too many; the gold counts lines as
`str.splitlines` does.
"""

from __future__ import annotations

import re
from typing import Any

from ..corpora import filler_paragraphs
from .base import CHARS_PER_TOKEN, Instance, Score, Task
from .split import pick, split_corpus, start
from .strict import strict_choice, strict_number

QUESTION_TYPES = ("line_count", "record_count", "longest")
QUESTIONS = {
    "test": {
        "line_count": "How many lines does the text have? Answer with a number.",
        "record_count": ("How many records (lines that start with an ID such as ID-1234) are "
                         "there? Answer with a number."),
        "longest": "Which record has the longest text? Answer with its ID only.",
    },
    "dev": {
        "line_count": "Count the lines of the input. Answer with a number.",
        "record_count": "What is the number of ID-labelled records in the input? Answer with "
                        "a number.",
        "longest": "Give the ID of the record whose text is longest. Answer with the ID only.",
    },
}
NOTES = ["# --- section break ---", "# (continued)", "# checked by the archivist",
         "# end of batch"]


def _sentences(text: str, k: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", text)
    return " ".join(parts[:k])


class Meta(Task):
    name = "meta"
    answer_kinds = ("choice", "number")
    complexity = "constant"
    description = "Questions about the input itself (line / record count, longest record)."
    default_length = 2**13

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, question: str | None = None, **_: Any) -> Instance:
        split, length, rng, inst_id = start(self, seed, length_tokens, split, question,
                                            QUESTION_TYPES)
        qtype = question or rng.choice(QUESTION_TYPES)
        corpus = split_corpus(None, split)
        budget = length * CHARS_PER_TOKEN
        paras = filler_paragraphs(corpus, budget * 3, rng)   # records keep 1-3 sentences
        ids = rng.sample(range(1000, 10_000), len(paras))
        lines = ["Archive extract: one record per line, with a few note lines."]
        records: dict[str, str] = {}
        used = len(lines[0]) + 1
        for (_i, p), n in zip(paras, ids, strict=True):
            text = _sentences(p, rng.randint(1, 3))
            line = f"ID-{n}: {text}"
            if used + len(line) + 1 > budget:
                break
            lines.append(line)
            records[f"ID-{n}"] = text
            used += len(line) + 1
            if rng.random() < 0.04:
                note = rng.choice(NOTES)
                lines.append(note)
                used += len(note) + 1
        # the longest record is unique by construction: lengthen it a little past the next
        ranked = sorted(records, key=lambda k: len(records[k]), reverse=True)
        longest = ranked[0]
        if len(ranked) > 1 and len(records[ranked[0]]) == len(records[ranked[1]]):
            idx = lines.index(f"{longest}: {records[longest]}")
            records[longest] += " (end)"
            lines[idx] = f"{longest}: {records[longest]}"
        context = "\n".join(lines) + "\n"
        gold: Any = {"line_count": len(context.splitlines()), "record_count": len(records),
                     "longest": longest}[qtype]
        shape: dict[str, Any] = ({"kind": "choice", "choices": sorted(records)}
                                 if qtype == "longest" else {"kind": "number"})
        return Instance(
            id=inst_id,
            task=self.name, query=pick(QUESTIONS, split)[qtype], context=context,
            gold=str(gold),
            meta={"split": split, "question_type": qtype, "ids": sorted(records),
                  "answer_shape": shape, "corpus": corpus.name},
            length_tokens=length)

    def score(self, prediction: str, inst: Instance) -> Score:
        if inst.meta["question_type"] == "longest":
            return strict_choice(prediction, str(inst.gold), inst.meta["ids"])
        return strict_number(prediction, float(inst.gold))
