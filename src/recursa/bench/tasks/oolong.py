"""OOLONG-style (linear complexity): aggregate over records whose labels must be inferred."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from ._records import RecordSet, make_records
from .base import Instance, Score, Task, answer_segment, match_choice, numbers_in

QUESTION_TYPES = ("count", "most_common", "least_common", "user_most", "month_most", "user_count")
NUMERIC = {"count", "user_count"}


def month_name(iso: str) -> str:
    return dt.date.fromisoformat(iso).strftime("%B %Y")


def n_users_for(length_tokens: int) -> int:
    # ~20 records per user keeps per-user questions meaningful at every length.
    return max(8, min(400, length_tokens // 1500))


def unique_argmax(counter: Counter[Any]) -> Any | None:
    top = counter.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def unique_argmin(counter: Counter[Any], keys: list[Any]) -> Any | None:
    vals = sorted((counter.get(k, 0), k) for k in keys)
    if len(vals) >= 2 and vals[0][0] == vals[1][0]:
        return None
    return vals[0][1]


def answer_question(rs: RecordSet, qtype: str, label: str | None, user: int | None) -> Any:
    """Gold answer computed from the hidden labels; None when the question has no unique answer.
    Public so tests and runners can recompute gold from meta."""
    labels, users, dates = rs.labels, rs.users, rs.dates
    if qtype == "count":
        return sum(1 for x in labels if x == label)
    if qtype == "most_common":
        return unique_argmax(Counter(labels))
    if qtype == "least_common":
        return unique_argmin(Counter(labels), list(rs.label_space))
    if qtype == "user_most":
        c = Counter(u for u, x in zip(users, labels, strict=True) if x == label)
        u = unique_argmax(c)
        return None if u is None else str(u)
    if qtype == "month_most":
        months = Counter(month_name(d) for d, x in zip(dates, labels, strict=True) if x == label)
        return unique_argmax(months)
    if qtype == "user_count":
        return sum(1 for u, x in zip(users, labels, strict=True) if x == label and u == user)
    raise ValueError(f"unknown question type {qtype!r}")


def question_text(qtype: str, label: str | None, user: int | None) -> str:
    return {
        "count": f"How many records in the data have the label '{label}'? Answer with a number.",
        "most_common": "Which label is the most common across all records? Answer with the label.",
        "least_common": "Which label is the least common across all records? Answer with the label.",
        "user_most": f"Which user id has the most records with the label '{label}'? Answer with the user id.",
        "month_most": (
            f"In which month (for example 'March 2023') were there the most records with the "
            f"label '{label}'? Answer with the month and year."
        ),
        "user_count": (
            f"How many records of user {user} have the label '{label}'? Answer with a number."
        ),
    }[qtype]


class Oolong(Task):
    name = "oolong"
    answer_kinds = ("choice", "number")
    complexity = "linear"
    description = "Count/compare labels that must be inferred per record (OOLONG-synth style)."
    default_length = 32_000

    def generate(
        self,
        seed: int = 0,
        length_tokens: int | None = None,
        *,
        question: str | None = None,
        label_source: str = "auto",
        **_: Any,
    ) -> Instance:
        length = int(length_tokens or self.default_length)
        rng = self.rng(seed, length, question or "")
        rs = make_records(rng, length, n_users_for(length), label_source=label_source)
        order = [question] if question else rng.sample(QUESTION_TYPES, len(QUESTION_TYPES))
        if question and question not in QUESTION_TYPES:
            raise ValueError(f"question must be one of {QUESTION_TYPES}")
        qtype = label = user = gold = None
        for qt in order + ["count"]:
            labels = list(rs.label_space)
            rng.shuffle(labels)
            for lab in labels:
                u = rng.choice(rs.users) if qt == "user_count" else None
                g = answer_question(rs, qt, lab, u)
                if g is not None:
                    qtype, label, user, gold = qt, lab, u, g
                    break
            if gold is not None:
                break
        assert qtype is not None
        if qtype in ("most_common", "least_common"):
            label = None
        answer_type = "numeric" if qtype in NUMERIC else {
            "most_common": "label", "least_common": "label", "user_most": "user",
            "month_most": "month",
        }[qtype]
        return Instance(
            id=self.make_id(seed, length, question=question),
            task=self.name,
            query=question_text(qtype, label, user),
            context=rs.text(),
            gold=str(gold),
            meta={
                "question_type": qtype,
                "answer_type": answer_type,
                "label": label,
                "user": user,
                **rs.meta(),
            },
            length_tokens=length,
        )

    def answer_shape(self, inst: Instance) -> dict[str, Any]:
        """A count (numeric questions) or one of the question's candidates."""
        if inst.meta.get("answer_type") == "numeric":
            return {"kind": "number"}
        return {"kind": "choice", "choices": choices_for(inst)}

    def score(self, prediction: str, inst: Instance) -> Score:
        return score_oolong(prediction, inst)


def choices_for(inst: Instance) -> list[str]:
    at = inst.meta["answer_type"]
    if at == "label":
        return list(inst.meta["label_space"])
    if at == "user":
        return sorted({str(u) for u in inst.meta["users"]})
    if at == "month":
        return sorted({month_name(d) for d in inst.meta["dates"]})
    return []


def score_oolong(prediction: str, inst: Instance) -> Score:
    if inst.meta["answer_type"] == "numeric":
        nums = numbers_in(answer_segment(prediction))
        if not nums:
            return Score(score=0.0, metrics={"abs_error": float("inf"), "exact": 0.0}, parsed=None)
        # The last number stated is the answer ("... so the total is 12").
        pred = nums[-1]
        err = abs(pred - float(inst.gold))
        s = 0.75**err
        return Score(score=s, metrics={"abs_error": err, "exact": float(err == 0)}, parsed=pred)
    s, parsed = match_choice(prediction, str(inst.gold), choices_for(inst))
    return Score(score=s, metrics={"exact": s}, parsed=parsed)
