"""`chained_lookup`: a lookup whose answer is the key of a second lookup."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from recursa.core.strategies.plans.base import Body, PlanKind, Text

if TYPE_CHECKING:
    from recursa.core.strategies.plans.repl.common import _plan_add, _plan_retrieve


class ChainedLookup(BaseModel):
    """Answer `first_question`, then `second_question` with `{answer}` replaced by that answer."""

    plan: Literal["chained_lookup"]
    first_question: Text
    second_question: Text


# ------------------------------------------------------------------ REPL side
# what this function leaves in the REPL (declared for the checkers; only functions are sent)
first_answers: list[str]
first_answer: str | None


def _plan_chained_lookup(first: str, second: str, dry: bool) -> Any:
    # dry: the second question's key is unknown yet, so its bound is taken as the first's
    global first_answers, first_answer
    if dry:
        bound = _plan_retrieve(first, [], True)
        return _plan_add(bound, bound)
    first_answers = _plan_retrieve(first, [], False)
    first_answer = collections.Counter(first_answers).most_common(1)[0][0] \
        if first_answers else None
    print("first answer:", first_answer)
    return _plan_retrieve(second.replace("{answer}", str(first_answer)), [], False) \
        if first_answer else []


# ------------------------------------------------------------------ host side
def body(plan: ChainedLookup, dry: bool, query: str) -> Body:
    out = "plan_bound" if dry else "plan_answers"
    return Body(f"{out} = _plan_chained_lookup({plan.first_question!r}, "
                f"{plan.second_question!r}, {dry})", out)


KIND = PlanKind(
    name="chained_lookup", model=ChainedLookup, body=body, repl=(_plan_chained_lookup,),
    sourced=True,
    results=("plan_answers", "first_answer", "plan_read"),
    prompt='- {"plan": "chained_lookup", "first_question": "...", "second_question": "... {answer} '
    '..."}: answer the first question, then the second with {answer} replaced by the first '
    "answer.")
