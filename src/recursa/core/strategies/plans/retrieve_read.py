"""`retrieve_read`: find the pieces of the context that answer a question, then read them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from recursa.core.strategies.plans.base import Body, Label, PlanKind, Text


class RetrieveRead(BaseModel):
    """Find the pieces of the context that answer `question`, then read them."""

    plan: Literal["retrieve_read"]
    question: Text
    keywords: list[Label] = Field(default_factory=list, max_length=6)


def body(plan: RetrieveRead, dry: bool, query: str) -> Body:
    return Body(f"plan_answers = _plan_retrieve({plan.question!r}, {plan.keywords!r}, {dry})",
                "plan_answers")


def of_query(query: str) -> RetrieveRead:
    """A retrieval of the query itself."""
    return RetrieveRead(plan="retrieve_read", question=query[:300], keywords=[])


KIND = PlanKind(
    name="retrieve_read", model=RetrieveRead, body=body, sourced=True, of_query=of_query,
    results=("plan_answers", "plan_read"),
    prompt='- {"plan": "retrieve_read", "question": "...", "keywords": [...]}: find the pieces of '
    "the context that answer `question` (a full question, in the query's words) and read them. "
    "`keywords`: 2-5 plain words or short phrases the passage itself probably uses for what the "
    'question is about, which need not be the query\'s own words (for "the kiln stopped heating": '
    '"element", "thermocouple"), or [] when unsure.')
