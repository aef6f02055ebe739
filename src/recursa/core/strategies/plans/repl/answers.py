"""REPL side: the answer steps after a plan, each one function the runtime sends with a call.

After a labelling plan the root chooses a count (or writes a pair rule) and these compute the
answer from the labels; after a retrieval, the pieces an answer came from are attached by code.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recursa.core.strategies.plans.repl.names import (
        id_counts,
        id_unlabelled,
        label_counts,
        plan_labels,
        plan_read,
        record_labels,
    )

answer: dict[str, Any]


def _plan_count_answer(op: str, query: str, counted: str) -> Any:
    # the chosen count's value, None when the counts cannot give it: no groups, the query names
    # the wrong number of them, a tie for most / fewest
    g = globals().get("group_counts") or {}
    if not g and op in ("which_most", "which_fewest"):
        # no groups: the labels the query names are what it compares ("which of red, green or
        # blue ...": each record was labelled "other" or one of them), counted over all the
        # records; "other" is the side for records of none, never an answer
        g = {x: {counted: label_counts[x]} for x in plan_labels
             if x != "other" and re.search(r"(?<!\w)" + re.escape(x) + r"(?!\w)", query, re.I)}
    hits = [(re.search(r"(?<!\w)" + re.escape(x) + r"(?!\w)", query, re.I), x) for x in g]
    named = [x for _, x in sorted((m.start(), x) for m, x in hits if m)]
    ranked = sorted(g, key=lambda x: -g[x][counted])
    if op == "how_many":
        # the one group the query names, or all the records when it names none (asked to
        # choose between the two, the 1.5B chose the total for 5 of 8 one-group questions)
        return g[named[0]][counted] if len(named) == 1 else None if named \
            else label_counts[counted]
    if op == "how_many_more":
        return g[named[0]][counted] - g[named[1]][counted] if len(named) == 2 else None
    if op == "which_most":
        return ranked[0] if len(ranked) > 1 and g[ranked[0]][counted] > g[ranked[1]][counted] \
            else None
    if op == "which_fewest":
        return ranked[-1] if len(ranked) > 1 and g[ranked[-1]][counted] < \
            g[ranked[-2]][counted] else None
    raise ValueError(f"no count {op!r}")


def _plan_id_key(x: Any) -> tuple[bool, int, str]:
    # numeric ids in numeric order, before the others
    return (not str(x).isdecimal(), int(x) if str(x).isdecimal() else 0, str(x))


def _plan_pair_answer(sides: list[tuple[str, int, int | None]]) -> Any:
    # the pairs of ids whose counts meet `sides` (label, min, max), either way round, committed
    # one "(a, b)" a line to `answer`; an id with an unlabelled record is left out of a side with
    # an upper bound, and with most records unlabelled nothing is committed (None)
    global answer
    meets = [{i for i, c in id_counts.items() if lo <= c.get(lab, 0) and
              (hi is None or (c.get(lab, 0) <= hi and not id_unlabelled.get(i)))}
             for lab, lo, hi in sides]
    found = None if 2 * sum(id_unlabelled.values()) > len(record_labels) else \
        sorted({tuple(sorted((u, v), key=_plan_id_key)) for u in meets[0] for v in meets[1]
                if u != v}, key=lambda p: (_plan_id_key(p[0]), _plan_id_key(p[1])))
    if found is not None:
        answer = {"content": "\n".join(f"({a}, {b})" for a, b in found) or
                  "No pair meets the condition.", "ready": True}
    print(None if found is None else len(found), "pairs")
    return found


def _plan_sourced(final: str) -> None:
    # `final` committed with the pieces whose reader's answer and `final` hold one another
    # (words compared, case and punctuation aside), or when none do, every piece read
    global answer

    def words(s: Any) -> str:
        return " ".join(re.findall(r"\w+", str(s).lower()))

    matched = [p for p, a in plan_read if words(a) and (
        f" {words(a)} " in f" {words(final)} " or f" {words(final)} " in f" {words(a)} ")]
    answer = {"content": final, "ready": True,
              "sources": matched or [p for p, _ in plan_read]}
    print(len(answer["sources"]), "sources")
