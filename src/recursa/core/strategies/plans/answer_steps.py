"""The typed answer steps after a labelling plan: the root chooses, the REPL computes.

A plan's printed table is read badly by a small root (it took the total for one group's count,
summed a group for a total), so after a labelling plan the root fills one more small typed object
(constrained by its JSON schema on llama.cpp) and fixed code computes the answer from the labels:
- after `label_count`, which count answers the query (`CountChoice`, `count_code`);
- after `pairs`, the condition each id of a pair meets, as label-count bounds (`PairRule`,
  `pair_code`).
Each returns None where the labels cannot give an answer; the plain answer call is the fall-back.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from recursa.base.types import Message
from recursa.core.strategies.plans.repl import answers, source, sources

# After a labelling plan, the root names which count answers the query (a typed choice, like
# the plan), and the runtime computes it from the counts in the REPL, taking the groups the
# query names from the query itself. Reading the printed table, the 1.5B took the total for one
# group's count; asked for a Python expression, it summed a group for the total (dev probe
# benchmarks/probes/answer.py: plain call 0 of 6 differences right, expressions 0 of 8 totals).
COUNT_OPS = {
    "how_many": "a number: how many records have the label",
    "how_many_more": "a number: how many more records with the label the first {group} the "
                     "query names has than the second",
    "which_most": "a name: which {group} has the most records with the label",
    "which_fewest": "a name: which {group} has the fewest records with the label",
    "other": "none of these",
}
COUNT_SYSTEM = """A program has labelled every record of a long context as {labels} and counted \
the records labelled {label}, over all the records and per {group}. Choose the one count that \
answers the query. Reply with JSON: {{"op": "<choice>"}}, where <choice> is one of:
{ops}"""
COUNT_USER = """Query: {query}

JSON:"""
COUNT_MAX_TOKENS = 20


class CountChoice(BaseModel):
    op: Literal["how_many", "how_many_more", "which_most", "which_fewest", "other"]


def count_messages(query: str, labels: list[str], group: str) -> list[Message]:
    """The count-choice call's messages (`labels`: opposite first, the counted side last)."""
    group = group or "group"
    ops = "\n".join(f"- {k}: {v.format(group=group)}" for k, v in COUNT_OPS.items())
    return [{"role": "system", "content": COUNT_SYSTEM.format(
                labels=" or ".join(labels), label=labels[-1], group=group, ops=ops)},
            {"role": "user", "content": COUNT_USER.format(query=query)}]


def parse_count_choice(text: str) -> str | None:
    """The op in the reply (JSON, or a bare op name), None for "other" or no op."""
    m = re.search(r"\{.*\}", text, re.S)
    try:
        op = CountChoice.model_validate_json(m.group()).op if m else text.strip(" .'\"\n")
    except ValidationError:
        return None
    return op if op in COUNT_OPS and op != "other" else None


def count_code(op: str, query: str, counted: str) -> str:
    """REPL code that prints the chosen count's value (`None` when the counts cannot give it:
    no groups, the query names the wrong number of them, a tie for most / fewest)."""
    if op not in COUNT_OPS or op == "other":
        raise ValueError(f"no count {op!r}")
    return (f"{source(answers._plan_count_answer)}\n"
            f"plan_answer = _plan_count_answer({op!r}, {query!r}, {counted!r})\n"
            "print(repr(plan_answer))\ndel _plan_count_answer")


def scalar_answer(value: Any) -> str | None:
    """A computed count's value as the run's answer: a number or a non-empty name, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value).strip() or None


# After a pairs plan, the root writes the condition on each id of a pair as bounds on its label
# counts; code builds the pairs from the per-id counts. Asked to pick the pairs from the listed
# ids, the 1.5B gave one pair (any pair) on 9 of 10 test instances of a pairs benchmark.
PAIR_SYSTEM = """A program has labelled every record of a long context as {labels} and counted, \
for each id, how many of its records got each label. The query asks for pairs of ids. \
Write the condition on the two ids of a pair as JSON: {{"first_label": "...", "first_min": N, \
"first_max": N or null, "second_label": "...", "second_min": N, "second_max": N or null}}: one \
id has between first_min and first_max records labelled first_label, the other between \
second_min and second_max records labelled second_label (null: no upper limit); a pair counts \
either way round. Labels: {labels}.
Examples (labels "cracked", "intact"): "pairs of kilns that both cracked at least 3 firings" \
-> {{"first_label": "cracked", "first_min": 3, "first_max": null, "second_label": "cracked", \
"second_min": 3, "second_max": null}}; "pairs where neither kiln ever cracked one" -> \
{{"first_label": "cracked", "first_min": 0, "first_max": 0, "second_label": "cracked", \
"second_min": 0, "second_max": 0}}."""
PAIR_USER = """Query: {query}

JSON:"""
PAIR_MAX_TOKENS = 80
MAX_COUNT = 100_000


class PairRule(BaseModel):
    first_label: str
    first_min: int = Field(ge=0, le=MAX_COUNT)
    first_max: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    second_label: str
    second_min: int = Field(ge=0, le=MAX_COUNT)
    second_max: int | None = Field(default=None, ge=0, le=MAX_COUNT)


def pair_schema(labels: list[str]) -> dict[str, Any]:
    """PairRule's JSON schema with its labels held to the plan's label set."""
    schema = PairRule.model_json_schema()
    for side in ("first_label", "second_label"):
        schema["properties"][side]["enum"] = list(labels)
    return schema


def pair_messages(query: str, labels: list[str]) -> list[Message]:
    return [{"role": "system", "content": PAIR_SYSTEM.format(
                labels=", ".join(json.dumps(x) for x in labels))},
            {"role": "user", "content": PAIR_USER.format(query=query)}]


def parse_pair_rule(text: str, labels: list[str]) -> PairRule | None:
    """The rule in the reply, None when it is not one or names a label outside the plan's set
    or a side no count can meet (min above max)."""
    m = re.search(r"\{.*\}", text, re.S)
    try:
        rule = PairRule.model_validate_json(m.group()) if m else None
    except ValidationError:
        return None
    if rule is None:
        return None
    named = {x.lower(): x for x in labels}     # a reply without the schema may change case
    first, second = named.get(rule.first_label.lower()), named.get(rule.second_label.lower())
    if first is None or second is None:
        return None
    rule = rule.model_copy(update={"first_label": first, "second_label": second})
    for lo, hi in ((rule.first_min, rule.first_max), (rule.second_min, rule.second_max)):
        if hi is not None and hi < lo:
            return None
    return rule


def pair_code(rule: PairRule) -> str:
    """REPL code over the pairs plan's `id_counts` that sets `plan_answer` (the qualifying pairs
    as (smaller id, larger id), numeric ids compared as numbers) and commits them, one `(a, b)`
    a line, to `answer` (not printed: a few hundred pairs would be cut at the output limit). An
    id with an unlabelled record is left out of a side with an upper bound (its count is not
    known to stay under it); with most records unlabelled, nothing is committed."""
    r = rule
    sides = [(r.first_label, r.first_min, r.first_max), (r.second_label, r.second_min, r.second_max)]
    return (f"{sources(answers._plan_id_key, answers._plan_pair_answer)}\n"
            f"plan_answer = _plan_pair_answer({sides!r})\n"
            "del _plan_id_key, _plan_pair_answer")


def committed(cell: Any) -> str | None:
    """The answer a cell committed to the REPL's `answer` (ready, not empty), else None."""
    a = cell.answer if isinstance(getattr(cell, "answer", None), dict) else {}
    content = a.get("content")
    return content if a.get("ready") and isinstance(content, str) and content.strip() else None


def last_value(cell: Any) -> Any:
    """The Python literal on the last line a cell printed (None when there is none)."""
    try:
        return ast.literal_eval((cell.stdout or "").strip().splitlines()[-1])
    except (ValueError, SyntaxError, IndexError):
        return None
