"""Aggregation that needs a judgement per record: customer reviews whose sentiment is never
written as a label (see _reviews.py), asked as counts, most / least common groups and
differences between groups.

Shops and products occur about equally often, and each shop has its own hidden complaint rate,
so counting a shop's name, or the commonest value of any shape in the text, says nothing about
the answer. Counts are right within 5% of the gold, rounded down (so exact below 20; the tolerance is in
meta); names are right when the answer names the gold and no other shop or product.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ._hay import spread
from ._reviews import Reviews, make_reviews
from .base import Instance, Score, Task
from .split import pick, start
from .strict import strict_choice, strict_number

QUESTION_TYPES = ("count", "count_group", "most_group", "least_group", "diff")
NUMERIC = {"count", "count_group", "diff"}
# A review is a complaint when its customer was unhappy with the purchase.
DEFINE = {
    "test": "(a complaint is a review whose customer was unhappy with the purchase)",
    "dev": "(count a review as a complaint when the buyer was dissatisfied)",
}
QUESTIONS = {
    "test": {
        "count": "How many of the reviews are complaints {define}?",
        "count_group": "How many complaints {define} were written about the {gname} {g}?",
        "most_group": "Which {gkind} received the most complaints {define}?",
        "least_group": "Which {gkind} received the fewest complaints {define}?",
        "diff": ("How many more complaints {define} did the {gname} {a} receive than the "
                 "{gname} {b}?"),
    },
    "dev": {
        "count": "Count the complaints {define} among these reviews.",
        "count_group": "What number of complaints {define} concern the {gname} {g}?",
        "most_group": "Name the {gkind} with the largest number of complaints {define}.",
        "least_group": "Name the {gkind} with the smallest number of complaints {define}.",
        "diff": ("By how many complaints {define} does the {gname} {a} exceed the "
                 "{gname} {b}?"),
    },
}
SUFFIX = {"count": " Answer with a number.", "count_group": " Answer with a number.",
          "diff": " Answer with a number.", "most_group": " Answer with the name only.",
          "least_group": " Answer with the name only."}
REL_TOL = 0.05   # a count is right within 5% of the gold, rounded down (exact below 20)
MARGIN = 2       # most / least questions only when the winner leads by this many
ATTEMPTS = 500   # draws of the records before a seed gives up


def tolerance(gold: float) -> float:
    return float(math.floor(REL_TOL * abs(gold) + 1e-9))


def complaints_by(rs: Reviews, group: str) -> Counter[str]:
    names = rs.shop_names if group == "shop" else rs.product_names
    col = rs.shops if group == "shop" else rs.products
    c: Counter[str] = Counter({n: 0 for n in names})
    for g, lab in zip(col, rs.labels, strict=True):
        if lab == "complaint":
            c[g] += 1
    return c


def _extreme(c: Counter[str], most: bool) -> str | None:
    ranked = sorted(c.items(), key=lambda kv: kv[1], reverse=most)
    if len(ranked) >= 2 and abs(ranked[0][1] - ranked[1][1]) >= MARGIN:
        return ranked[0][0]
    return None


class JudgeAgg(Task):
    name = "judge_agg"
    answer_kinds = ("number", "choice")
    record_kind = "reviews"
    complexity = "linear"
    description = ("Count / compare customer complaints whose sentiment must be judged per "
                   "review; groups (shops, products) equally frequent.")
    default_length = 2**14

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, question: str | None = None, **_: Any) -> Instance:
        split, length, rng, inst_id = start(self, seed, length_tokens, split, question,
                                            QUESTION_TYPES)
        # one question type, drawn uniformly; records are redrawn until it has a clear answer
        order = [question or rng.choice(QUESTION_TYPES)]
        # short inputs (a dozen records) need more draws; a seed that found one sooner is unchanged
        for _attempt in range(ATTEMPTS):
            # an overall complaint rate per instance, then each shop and product above or
            # below it: counts vary widely between seeds, so no constant count is right often
            center = rng.uniform(0.15, 0.85)
            shop_rates, product_rates = (
                [min(0.98, max(0.02, center + d)) for d in spread(rng, 6, -0.3, 0.3)]
                for _ in range(2))
            rs = make_reviews(rng, length, split, shop_rates=shop_rates,
                              product_rates=product_rates)
            found = self._question(rng, rs, order)
            if found is not None:
                break
        else:
            raise RuntimeError(f"no instance with a unique answer in {ATTEMPTS} attempts")
        qtype, group, params, gold = found
        gkind = group
        gname = group
        q = pick(QUESTIONS, split)[qtype].format(define=pick(DEFINE, split), gkind=gkind,
                                                 gname=gname, **params)
        names = rs.shop_names if group == "shop" else rs.product_names
        shape: dict[str, Any] = ({"kind": "number"} if qtype in NUMERIC
                                 else {"kind": "choice", "choices": names})
        return Instance(
            id=inst_id,
            task=self.name, query=q + SUFFIX[qtype], context=rs.text(), gold=str(gold),
            meta={"split": split, "question_type": qtype, "group": group, **params,
                  "tolerance": tolerance(gold) if qtype in NUMERIC else None,
                  "answer_shape": shape, **rs.meta()},
            length_tokens=length)

    def _question(self, rng: Any, rs: Reviews, order: list[str]
                  ) -> tuple[str, str, dict[str, str], Any] | None:
        for qtype in order:
            for group in rng.sample(["shop", "product"], 2):
                c = complaints_by(rs, group)
                if qtype == "count":
                    return qtype, group, {}, sum(c.values())
                if qtype == "count_group":
                    g = rng.choice(sorted(c))
                    return qtype, group, {"g": g}, c[g]
                if qtype in ("most_group", "least_group"):
                    w = _extreme(c, qtype == "most_group")
                    if w is not None:
                        return qtype, group, {}, w
                if qtype == "diff":
                    a, b = rng.sample(sorted(c), 2)
                    if c[a] < c[b]:
                        a, b = b, a
                    if c[a] - c[b] >= 2:
                        return qtype, group, {"a": a, "b": b}, c[a] - c[b]
        return None

    def score(self, prediction: str, inst: Instance) -> Score:
        if inst.meta["question_type"] in NUMERIC:
            return strict_number(prediction, float(inst.gold),
                                 abs_tol=float(inst.meta["tolerance"]))
        return strict_choice(prediction, str(inst.gold), inst.meta["answer_shape"]["choices"])
