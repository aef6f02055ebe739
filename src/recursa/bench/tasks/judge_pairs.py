"""Pairs over judged records (OOLONG-Pairs style): list the pairs of customers whose reviews,
judged one by one, jointly meet a condition. The answer is a set of pairs from the cross product
of customers, scored by F1; few pairs qualify (at most ~8% of all pairs), so listing every pair
of ids scores little.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations
from typing import Any

from ._hay import spread
from ._reviews import Reviews, make_reviews
from .base import Instance, Score, Task
from .oolong_pairs import pairs_f1
from .split import pick, start

CONDITIONS = ("both_complaints", "cross", "both_praise_only")
MAX_FRACTION = 0.08
TEXT = {
    "test": {
        "both_complaints": "both customers wrote at least {k} complaints",
        "cross": ("one customer wrote at least {k} complaints and the other wrote at least {k} "
                  "reviews praising the purchase (either way round)"),
        "both_praise_only": "neither customer wrote a single complaint",
    },
    "dev": {
        "both_complaints": "each of the two buyers complained at least {k} times",
        "cross": ("one buyer complained at least {k} times while the other was delighted at "
                  "least {k} times (in either order)"),
        "both_praise_only": "no review by either buyer is a complaint",
    },
}
DEFINE = {
    "test": " (a complaint is a review whose customer was unhappy with the purchase)",
    "dev": " (count a review as a complaint when the buyer was dissatisfied)",
}


def per_customer(rs: Reviews) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = defaultdict(lambda: {"complaint": 0, "praise": 0})
    for c, lab in zip(rs.customers, rs.labels, strict=True):
        out[c][lab] += 1
    return out


def pairs_for(stats: dict[int, dict[str, int]], cond: str, k: int) -> list[tuple[int, int]]:
    """The gold pair set; public so tests recompute it from meta."""
    def ok(u: int, v: int) -> bool:
        a, b = stats[u], stats[v]
        if cond == "both_complaints":
            return a["complaint"] >= k and b["complaint"] >= k
        if cond == "cross":
            return ((a["complaint"] >= k and b["praise"] >= k)
                    or (b["complaint"] >= k and a["praise"] >= k))
        if cond == "both_praise_only":
            return a["complaint"] == 0 and b["complaint"] == 0
        raise ValueError(cond)
    return [(u, v) for u, v in combinations(sorted(stats), 2) if ok(u, v)]


class JudgePairs(Task):
    name = "judge_pairs"
    answer_kinds = ("pairs",)
    complexity = "quadratic"
    description = ("List the customer pairs whose reviews, judged one by one, jointly meet a "
                   "condition; F1 over pairs.")
    default_length = 2**14

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, condition: str | None = None,
                 **_: Any) -> Instance:
        split, length, rng, inst_id = start(self, seed, length_tokens, split, condition,
                                            CONDITIONS, what="condition")
        chosen = None
        for _attempt in range(30):
            n_cust = max(8, min(40, length // 900))
            # customers' tempers spread from very content to very cross
            rs = make_reviews(rng, length, split, n_customers=n_cust,
                              customer_rates=spread(rng, n_cust, 0.0, 1.0))
            stats = per_customer(rs)
            limit = max(3, int(MAX_FRACTION * len(stats) * (len(stats) - 1) / 2))
            conds = [condition] if condition else rng.sample(CONDITIONS, len(CONDITIONS))
            for cond in conds:
                ks = [0] if cond == "both_praise_only" else list(range(1, 12))
                for k in ks:
                    pairs = pairs_for(stats, cond, k)
                    if 2 <= len(pairs) <= limit:
                        chosen = (cond, k, pairs)
                        break
                if chosen:
                    break
            if chosen:
                break
        if chosen is None:
            raise RuntimeError("no condition with a small pair set in 30 attempts")
        cond, k, pairs = chosen
        query = (f"List every pair of customer ids such that "
                 f"{pick(TEXT, split)[cond].format(k=k)}{pick(DEFINE, split)}. Whether a "
                 "review is a complaint is not written; judge it from the customer's words. "
                 "Write each pair as (smaller_id, larger_id), one pair per line, and nothing "
                 "else.")
        return Instance(
            id=inst_id,
            task=self.name, query=query, context=rs.text(), gold=[list(p) for p in pairs],
            meta={"split": split, "condition": cond, "k": k, "n_pairs": len(pairs),
                  "answer_shape": {"kind": "pairs", "ids": rs.customer_ids}, **rs.meta()},
            length_tokens=length)

    def score(self, prediction: str, inst: Instance) -> Score:
        valid = {int(u) for u in inst.meta["customer_ids"]}
        return pairs_f1(prediction, [(int(a), int(b)) for a, b in inst.gold], valid)
