"""`label_count`: judge every record as a label or its opposite, then count the judgements by
code, over all the records and per value of one record field; the root then chooses which count
answers the query (`recursa.core.strategies.plans.answer_steps`) and code computes it."""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from recursa.core.strategies.plans import answer_steps as pa
from recursa.core.strategies.plans.base import AnswerStep, Body, Label, PlanKind

if TYPE_CHECKING:
    from recursa.core.strategies.plans.repl.names import plan_labels, record_labels, records


def _word(x: str) -> str:
    return x.strip().strip("'\".").lower()


class LabelCount(BaseModel):
    """Judge every record as `label` or `opposite`, then count the judgements by code, per
    value of the record field `group_by` when one is named. recursa writes the per-record
    question from the two sides: a root that wrote its own asked the aggregate question
    ("Count the <label>s for each <group>") or a leading one, and a 1.5B leaf answers a leading
    question with the same label for every record."""

    plan: Literal["label_count"]
    label: Label
    opposite: Label
    group_by: Annotated[str, Field(max_length=40)] = ""

    @model_validator(mode="after")
    def _two_sides(self) -> LabelCount:
        if _word(self.label) == _word(self.opposite):
            raise ValueError("label and opposite must differ")
        return self

    @property
    def labels(self) -> list[str]:
        # the opposite first: asked "<label> or <opposite>?", the 1.5B said the label to 33 of
        # 40 records (18 were); asked the other way round, it was right on 40 of 40 (dev split)
        return [plain_opposite(self.label, self.opposite), self.label.strip()]


def plain_opposite(label: str, opposite: str) -> str:
    """The opposite side as a leaf is asked it: "other" in place of the label negated by a
    word ("non-X", "not an X", "no X", "without X"). The 1.5B picks a side that repeats the
    record's topic word: asked "non-X or X?" it found 12 of 30 dev records of one topic X,
    "other or X?" 25 of 30; for a second topic 1 of 30 against 27 of 30
    (benchmarks/probes/opposite.py). An antonym of its own ("intact" for "cracked") is kept:
    against "other" it halved the false positives at the same recall on dev records
    (benchmarks/probes/opposite_words.py: 0.37 against 0.77, 0.33 against 0.53)."""
    lab, opp = label.strip(), opposite.strip()
    stem = re.sub(r"[^a-z]", "", lab.lower())[:4]
    negated = re.match(r"(?i)\s*(non|not|no|without)\b[\s-]*(an?\s+|the\s+)?(.*)$", opp)
    if len(stem) == 4 and negated and stem in re.sub(r"[^a-z]", "", negated.group(3).lower()):
        return "other"      # the label negated: non-X, not an X, without X
    return opp


def leaf_question(labels: list[str]) -> str:
    """The per-record question of a labelling plan, written from its sides: it names every
    side, so it does not lead (asked "is this a <label>?", the 1.5B says yes to every record;
    asked which of two sides fits, it was right on 37 of 40, dev split)."""
    *head, last = labels
    return f"Which fits the text better: {', '.join(head)} or {last}?"


# Words of a query that frame the aggregate or the answer, not the condition one record must
# meet: what is left of a query without them (and without proper names, which name groups) is
# what a leaf has to judge.
_FRAME = frozenset("""
how many much which what who whose whom most least fewest fewer often frequently number numbers
count counted counting total share proportion percentage ratio these those them their here there
record records entry entries item items line lines one ones text texts all each every any among
between answer reply name names only just give tell list write word words please with without
more less than greater compare comparison average majority minority times time say says said
get gets got gotten receive receives received trail trails lead leads ahead behind beat beats
exceed exceeds describe describes described define defines defined mention mentions
mentioned concern concerns refer refers express expresses
reviews messages notes tickets comments posts emails documents rows reports sentences entries
definitions descriptions responses replies questions answers statements passages paragraphs
writers authors
the and for are was were been being has have had does did doing not nor but from into onto over
under about above below after before again also you your our its it's they them then this that
some such same other own very can could would should will shall may might must
""".split())


def condition_words(query: str) -> list[str]:
    """The query's words that say what a record must be to count (its content words, minus the
    aggregate frame, the answer instruction and capitalised names), lowercased."""
    out: list[str] = []
    for m in re.finditer(r"[A-Za-z][A-Za-z'-]+", query):
        w = m.group().strip("'-")
        low = w.lower().removesuffix("'s")
        if len(low) < 3 or low in _FRAME or low in out:
            continue
        if w[0].isupper() and m.start() > 0:      # a name (a group's value), not a condition
            continue
        out.append(low)
    return out


QUERY_LEAF = 'Does the text below match this description: "{condition}"? Answer yes or no.'

# A list of three or more one-word options ("red, green, blue or grey") in a query that asks
# for the most or the fewest: the answer is one of them, so every record is labelled with one.
# Two sides the root picked from such a list cannot say the others: on a sealed cell of
# four-way questions it took two of the four and answered one of those two, 1 of 10 right.
# Lowercase words only: capitalised ones are names, the values of a group ("North, South or
# East"), which a grouped count compares instead. The list opens the query or follows a colon
# or "of / among / between / from", so that a word before it ("most common, red or blue") is
# not taken for an option.
_CHOICES = re.compile(r"(?:^|[:;(]\s*|\b(?i:of|among|between|from)\s+)"
                      r"([a-z][a-z'-]*(?:,\s*[a-z][a-z'-]*)+,?\s+(?:or|and)\s+[a-z][a-z'-]*)"
                      r"(?![\w-])")
_EXTREME = re.compile(r"(?i)\b(most|least|fewest|commonest|rarest|majority)\b")


def query_choices(query: str) -> list[str]:
    """The options a most / fewest query lists (three or more single words, in its order), or
    [] when it lists none or asks for something else."""
    if not _EXTREME.search(query):
        return []
    m = _CHOICES.search(query)
    items = re.split(r"\s*,\s*(?:(?:or|and)\s+)?|\s+(?:or|and)\s+", m.group(1)) if m else []
    out = list(dict.fromkeys(x.strip("'") for x in items if x.strip("'")))
    return out if len(out) >= 3 and not {x.lower() for x in out} & _FRAME else []


def condition_phrase(query: str) -> str:
    """The query's condition in its own words: its first sentence from its first condition
    word on ("How many of the notes say the pump leaked?" -> "pump leaked")."""
    first = re.split(r"(?<=[?.!])\s", query.strip(), maxsplit=1)[0].rstrip("?.! ")
    words = condition_words(first)
    if not words:
        return first
    m = re.search(r"(?i)\b" + re.escape(words[0]), first)
    start = m.start() if m else 0
    # keep the little words just before it ("about a", "not") that carry its sense
    head = first[:start].split()
    while head and head[-1].lower() in ("a", "an", "the", "about", "not", "no"):
        start = first.rfind(head.pop(), 0, start)
    return first[start:].strip()


def label_call(question: str, labels: list[str], words: list[str], query: str,
               dry: bool) -> str:
    """The REPL line that labels every record with one of `labels` (`_plan_label`,
    repl/common.py), asking `question`; with the query's condition `words`, a leaf may judge the
    query itself instead."""
    leaf = QUERY_LEAF.format(condition=condition_phrase(query)[:300]) if words else ""
    return f"_plan_label({question!r}, {labels!r}, {words!r}, {leaf!r}, {dry})"


# ------------------------------------------------------------------ REPL side
# what these functions leave in the REPL (declared for the checkers; only functions are sent)
record_groups: list[str | None]
group_counts: dict[str, collections.Counter[str]]
label_counts: collections.Counter[str]


def _plan_field(rec: str, name: str) -> str | None:
    m = re.search(r"(?<!\w)" + re.escape(name) + r"\s*[:=]\s*([^|\n;]+)", rec, re.I)
    return m.group(1).strip().rstrip(".,") if m else None


def _plan_by_group(name: str, labels: list[str]) -> None:
    # the judgements counted per value of one record field, the way a grouped question asks
    global record_groups, group_counts
    record_groups = [_plan_field(x, name) for x in records]
    missing = sum(g is None for g in record_groups)
    group_counts = {}
    for g, x in zip(record_groups, record_labels, strict=False):
        if g is not None:
            group_counts.setdefault(g, collections.Counter())[x] += 1
    if not group_counts:
        print(f"no record has a field {name!r}: no counts by group")
        return
    counted = labels[-1]          # LabelCount.labels: the opposite first, the counted last
    ranked = sorted(group_counts, key=lambda g: -group_counts[g][counted])
    print(f"by {name} ({' / '.join(labels)}):")
    for g in ranked:
        print(f"  {g}: " + ", ".join(f"{group_counts[g][x]} {x}" for x in labels))
    print(f"most {counted}: {ranked[0]} ({group_counts[ranked[0]][counted]}) | fewest "
          f"{counted}: {ranked[-1]} ({group_counts[ranked[-1]][counted]})")
    if missing:
        print(f"({missing} records have no field {name!r})")


def _plan_count(group_by: str) -> None:
    # the labels counted, then per group when the plan names a field
    global label_counts
    label_counts = collections.Counter(x for x in record_labels if x)
    print(f"{len(records)} records labelled; counts:")
    for label in plan_labels:
        print(f"  {label}: {label_counts[label]}")
    print("unlabelled:", sum(x is None for x in record_labels))
    if group_by:
        _plan_by_group(group_by, plan_labels)


# ------------------------------------------------------------------ host side
# The side for a record that is none of a query's listed options, asked first: offered only the
# options, the 1.5B put every record somewhere, so records of no listed kind swelled two of them
# and "which has the most" came out right on 0.40 of dev instances (a simulation from the
# leaves' answers on 160 dev records, benchmarks/probes/options_other.py; 0.40 on a sealed
# block too); with "other" last it said "other" to 12 of 80 such records (0.40), with "other"
# first to 54 of 80, at a small cost on the listed kinds (0.62).
OTHER = "other"


def sides(plan: LabelCount, query: str) -> list[str]:
    """What each record is labelled: "other" or one of the options the query lists, when it
    asks which of them is the most or fewest over all the records; else the plan's two sides."""
    choices = query_choices(query) if not plan.group_by.strip() else []
    return [OTHER, *choices] if choices else plan.labels


def body(plan: LabelCount, dry: bool, query: str) -> Body:
    labels = sides(plan, query)
    words = condition_words(query) if labels == plan.labels else []
    code = label_call(leaf_question(labels), labels, words, query, dry)
    if dry:
        return Body(code, "record_labels")
    return Body(f"{code}\n_plan_count({plan.group_by.strip()!r})", "label_counts")


def answer(plan: LabelCount, query: str) -> AnswerStep:
    """The root chooses which count answers the query; the REPL computes it."""
    def code(reply: str) -> tuple[str, dict[str, Any]] | None:
        op = pa.parse_count_choice(reply)
        return (pa.count_code(op, query, plan.label), {"count_op": op}) if op else None
    return AnswerStep(pa.count_messages(query, sides(plan, query), plan.group_by.strip()),
                      pa.CountChoice.model_json_schema(), pa.COUNT_MAX_TOKENS, code,
                      lambda cell: pa.scalar_answer(pa.last_value(cell)), {"count_choice": True})


def rescue(query: str) -> LabelCount | None:
    """For a most / fewest query that lists its options, an invalid labelling plan (one word
    for both sides: "entry" / "entry") is still a plan: the records are labelled with the
    query's options (`sides`), so the root's sides would not be used."""
    choices = query_choices(query)
    return LabelCount(plan="label_count", label=choices[-1], opposite=choices[0]) \
        if choices else None


KIND = PlanKind(
    name="label_count", model=LabelCount, body=body, rescue=rescue,
    repl=(_plan_field, _plan_by_group, _plan_count),
    results=("records", "record_labels", "label_counts", "record_groups", "group_counts"),
    noun="records judged", aggregate=True, answer=answer,
    prompt='- {"plan": "label_count", "label": "...", "opposite": "...", "group_by": "..."}: '
    "judge every record (line or entry) as `label` or `opposite`, then count them with code. "
    "For how many / which is most or least common / compare groups, when the judgement is not "
    "written in the record. `label`: one word for what the query counts, as said of one record "
    '(e.g. "cracked"); `opposite`: one word for a record that is not that (e.g. "intact"); '
    '`group_by`: the name of the record field the query groups or filters by (e.g. "Kiln", '
    '"Glaze"), or "" for none. Examples: "Which kiln\'s firings most often came out cracked?" -> '
    '{"plan": "label_count", "label": "cracked", "opposite": "intact", "group_by": "Kiln"}; '
    '"How many of the seed trays sprouted?" -> {"plan": "label_count", "label": "sprouted", '
    '"opposite": "bare", "group_by": ""}.')
