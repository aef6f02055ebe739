"""OOLONG-Pairs-style (quadratic complexity): list user pairs whose records jointly satisfy a
condition over inferred labels. Scored by F1 over the predicted set of pairs."""

from __future__ import annotations

import re
from collections import defaultdict
from itertools import combinations
from typing import Any

from ._records import RecordSet, make_records
from .base import Instance, Score, Task
from .oolong import month_name

CONDITIONS = ("both_at_least", "cross", "both_either_at_least", "same_month", "both_exactly")


def per_user(rs: RecordSet) -> dict[int, dict[str, Any]]:
    stats: dict[int, dict[str, Any]] = defaultdict(lambda: {"counts": defaultdict(int), "months": defaultdict(set)})
    for u, lab, d in zip(rs.users, rs.labels, rs.dates, strict=True):
        stats[u]["counts"][lab] += 1
        stats[u]["months"][lab].add(month_name(d))
    return stats


def pairs_for(stats: dict[int, dict[str, Any]], cond: str, a: str, b: str, k: int) -> list[tuple[int, int]]:
    """The gold pair set for a condition; public so tests can recompute it from meta."""
    def n(u: int, lab: str) -> int:
        return stats[u]["counts"].get(lab, 0)

    def ok(u: int, v: int) -> bool:
        if cond == "both_at_least":
            return n(u, a) >= k and n(v, a) >= k
        if cond == "cross":
            return (n(u, a) >= k and n(v, b) >= k) or (n(v, a) >= k and n(u, b) >= k)
        if cond == "both_either_at_least":
            return n(u, a) + n(u, b) >= k and n(v, a) + n(v, b) >= k
        if cond == "same_month":
            return len(stats[u]["months"].get(a, set()) & stats[v]["months"].get(a, set())) >= k
        if cond == "both_exactly":
            return n(u, a) == k and n(v, a) == k
        raise ValueError(cond)

    return [(u, v) for u, v in combinations(sorted(stats), 2) if ok(u, v)]


def condition_text(cond: str, a: str, b: str, k: int) -> str:
    rec = "record" if k == 1 else "records"
    return {
        "both_at_least": f"both users have at least {k} {rec} with the label '{a}'",
        "cross": (
            f"one user has at least {k} {rec} with the label '{a}' and the other user has at "
            f"least {k} {rec} with the label '{b}' (either way round)"
        ),
        "both_either_at_least": (
            f"each of the two users has at least {k} {rec} whose label is '{a}' or '{b}' "
            "(counted together)"
        ),
        "same_month": (
            f"the two users have records with the label '{a}' in at least {k} common "
            f"calendar month{'s' if k > 1 else ''} (same month and year)"
        ),
        "both_exactly": f"both users have exactly {k} {rec} with the label '{a}'",
    }[cond]


class OolongPairs(Task):
    name = "oolong_pairs"
    answer_kinds = ("pairs",)
    complexity = "quadratic"
    description = "List all user pairs satisfying a condition over inferred labels; F1 over pairs."
    default_length = 32_000

    def generate(
        self,
        seed: int = 0,
        length_tokens: int | None = None,
        *,
        condition: str | None = None,
        max_pairs: int = 300,
        label_source: str = "auto",
        **_: Any,
    ) -> Instance:
        length = int(length_tokens or self.default_length)
        if condition is not None and condition not in CONDITIONS:
            raise ValueError(f"condition must be one of {CONDITIONS}")
        rng = self.rng(seed, length, condition or "")
        n_users = max(8, min(150, length // 2000))
        rs = make_records(rng, length, n_users, label_source=label_source)
        stats = per_user(rs)
        conds = [condition] if condition else rng.sample(CONDITIONS, len(CONDITIONS))
        chosen = None
        for cond in conds:
            labs = list(rs.label_space)
            rng.shuffle(labs)
            for a, b in zip(labs, labs[1:] + labs[:1], strict=True):
                for k in range(1, 16):
                    pairs = pairs_for(stats, cond, a, b, k)
                    if 3 <= len(pairs) <= max_pairs:
                        chosen = (cond, a, b, k, pairs)
                        break
                if chosen:
                    break
            if chosen:
                break
        if chosen is None:  # tiny inputs: accept whatever the simplest condition yields
            a = rs.label_space[0]
            chosen = ("both_at_least", a, a, 1, pairs_for(stats, "both_at_least", a, a, 1))
        cond, a, b, k, pairs = chosen
        query = (
            f"List every pair of user ids such that {condition_text(cond, a, b, k)}. "
            "Labels are not given and must be inferred from each instance text. "
            "Write each pair as (smaller_id, larger_id), one pair per line, and nothing else."
        )
        return Instance(
            id=self.make_id(seed, length, condition=condition),
            task=self.name,
            query=query,
            context=rs.text(),
            gold=[list(p) for p in pairs],
            meta={
                "condition": cond,
                "label_a": a,
                "label_b": b,
                "k": k,
                "n_pairs": len(pairs),
                **rs.meta(),
            },
            length_tokens=length,
        )

    def answer_shape(self, inst: Instance) -> dict[str, Any]:
        """Pairs of the instance's user ids."""
        return {"kind": "pairs", "ids": inst.meta.get("users", [])}

    def score(self, prediction: str, inst: Instance) -> Score:
        valid = {int(u) for u in inst.meta.get("users", [])} or None
        return pairs_f1(prediction, [tuple(p) for p in inst.gold], valid)


_PAIR_RE = re.compile(
    r"(?<!\d)(\d+)\s*(?:,|-|–|—|&|/|:|\band\b|\bwith\b|\bx\b|\s)\s*(?:user\s*(?:id)?\s*)?(\d+)(?!\d)",
    re.IGNORECASE,
)


def parse_pairs(text: str, valid_ids: set[int] | None = None) -> set[tuple[int, int]]:
    """Unordered id pairs from free text: "(12, 45)", "12-45", "[12, 45]", "user 12 and user 45",
    JSON lists. Pairs with an id outside ``valid_ids`` (dates, counts) and self-pairs are
    dropped."""
    text = re.sub(r"\buser\s*(?:id)?\s*", "", text or "", flags=re.IGNORECASE)
    if valid_ids is not None:
        # Blank out numbers that are not user ids first, so a stray count or year cannot pair
        # with (and swallow) a real id next to it.
        text = re.sub(r"\d+", lambda m: m.group() if int(m.group()) in valid_ids else " ~ ", text)
    out: set[tuple[int, int]] = set()
    for m in _PAIR_RE.finditer(text):
        a, b = int(m.group(1)), int(m.group(2))
        if a == b:
            continue
        if valid_ids is not None and (a not in valid_ids or b not in valid_ids):
            continue
        out.add((min(a, b), max(a, b)))
    return out


def pairs_f1(prediction: str, gold: list[tuple[int, int]], valid_ids: set[int] | None = None) -> Score:
    g = {(min(a, b), max(a, b)) for a, b in gold}
    p = parse_pairs(prediction, valid_ids)
    tp = len(g & p)
    precision = tp / len(p) if p else (1.0 if not g else 0.0)
    recall = tp / len(g) if g else (1.0 if not p else 0.0)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return Score(
        score=f1,
        metrics={"precision": precision, "recall": recall, "f1": f1, "n_pred": float(len(p))},
        parsed=sorted(p),
    )
