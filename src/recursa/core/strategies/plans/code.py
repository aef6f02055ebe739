"""`code`: no plan fits; the root writes code instead (the code mode)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from recursa.core.strategies.plans.base import PlanKind


class CodeInstead(BaseModel):
    """No plan fits: write code instead."""

    plan: Literal["code"]


KIND = PlanKind(
    name="code", model=CodeInstead, body=None,
    prompt='- {"plan": "code"}: none fits (e.g. a question about the context itself, such as how '
    "many lines it has, or exact text search); you will write Python code instead.")
