"""`pairs`: label every record, then pair the ids of records whose labels are kept; the root then
writes the condition on each id of a pair (`recursa.core.strategies.plans.answer_steps`) and code lists them."""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field

from recursa.core.strategies.plans import answer_steps as pa
from recursa.core.strategies.plans.base import AnswerStep, Body, Label, Labels, PlanKind, Text
from recursa.core.strategies.plans.label_count import label_call, leaf_question

if TYPE_CHECKING:
    from recursa.core.strategies.plans.repl.names import pairs, plan_labels, record_labels, records


class Pairs(BaseModel):
    """Label every record, then list the pairs of record ids whose labels are both in `keep`."""

    plan: Literal["pairs"]
    instruction: Text
    labels: Labels
    keep: list[Label] = Field(min_length=1, max_length=12)
    id_prefix: Annotated[str, Field(max_length=20)] = ""


# ------------------------------------------------------------------ REPL side
# what this function leaves in the REPL (declared for the checkers; only functions are sent)
record_ids: list[str | None]
kept_ids: list[str]
plan_pairs: list[tuple[str, str]]
id_counts: dict[str, collections.Counter[str]]
id_unlabelled: collections.Counter[str]


def _plan_pairs(prefix: str, keep: list[str]) -> None:
    # each record's id (the word after `prefix`, or its number), the ids with a kept label and
    # their pairs, and per id how many of its records got each label
    global record_ids, kept_ids, plan_pairs, id_counts, id_unlabelled

    def key(x: str) -> tuple[bool, int, str]:
        return (not x.isdecimal(), int(x) if x.isdecimal() else 0, x)

    # a record without the prefix has no id (its number would be taken for a real one)
    record_ids = [(re.search(re.escape(prefix) + r"[\s:#=]*(\w[\w-]*)", rec) or [None, None])[1]
                  if prefix else str(i + 1) for i, rec in enumerate(records)]
    kept_ids = sorted({i for i, x in zip(record_ids, record_labels, strict=False)
                       if i is not None and x in keep}, key=key)
    plan_pairs = pairs(kept_ids)
    id_counts, id_unlabelled = {}, collections.Counter()
    for i, x in zip(record_ids, record_labels, strict=False):
        if i is not None:
            id_counts.setdefault(i, collections.Counter()).update([x] if x else [])
            id_unlabelled[i] += x is None
    print(f"{len(id_counts)} ids; records per label:")
    for i in sorted(id_counts, key=key)[:100]:
        print(f"  {i}: " + ", ".join(f"{lab} {id_counts[i][lab]}" for lab in plan_labels))
    print(f"{len(records)} records, {len(kept_ids)} ids with a label in {keep}: "
          f"{kept_ids[:100]}")
    print(f"{len(plan_pairs)} pairs:", plan_pairs[:200])


# ------------------------------------------------------------------ host side
def body(plan: Pairs, dry: bool, query: str) -> Body:
    # the instruction is about the whole job ("label every record, then list the pairs ..."),
    # not a question one record can answer: the leaves get the sides, named as label_count
    # names them, the root's first side last (a small root lists the query's own side first,
    # and a 1.5B leaf leans to the side named first)
    code = label_call(leaf_question(plan.labels[::-1]), plan.labels, [], query, dry)
    if dry:
        return Body(code, "record_labels")
    return Body(f"{code}\n_plan_pairs({plan.id_prefix.strip()!r}, {plan.keep!r})", "plan_pairs")


def answer(plan: Pairs, query: str) -> AnswerStep:
    """The root writes the condition on each id of a pair as bounds on its label counts; the
    REPL builds the pairs from the per-id counts."""
    def code(reply: str) -> tuple[str, dict[str, Any]] | None:
        rule = pa.parse_pair_rule(reply, plan.labels)
        return (pa.pair_code(rule), {"pair_rule": rule.model_dump()}) if rule else None
    return AnswerStep(pa.pair_messages(query, plan.labels), pa.pair_schema(plan.labels),
                      pa.PAIR_MAX_TOKENS, code, pa.committed, {"pair_rule": True})


KIND = PlanKind(
    name="pairs", model=Pairs, body=body, repl=(_plan_pairs,),
    results=("records", "record_labels", "record_ids", "kept_ids", "plan_pairs", "id_counts"),
    noun="records judged", aggregate=True, answer=answer,
    prompt='- {"plan": "pairs", "instruction": "...", "labels": [...], "keep": [...], '
    '"id_prefix": "..."}: label every record, then list the pairs of ids whose records have a '
    'label in `keep`; `id_prefix` is the text before each record\'s id (e.g. "Kiln:"), or "" to '
    "use record numbers.")
