"""What a plan kind is: its typed model, its line in the planning prompt, and how it runs.

A kind is one module of `recursa.core.strategies.plans` holding a pydantic model (the slots the root fills,
with `plan: Literal["<name>"]`) and a `PlanKind` row for the registry (`recursa.core.strategies.plans`).
Its REPL-side functions are plain typed Python in the same module, sent by source
(`recursa.core.strategies.plans.repl.source`); they may use only the REPL's names and the shared helpers of
`recursa.core.strategies.plans.repl.common`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from recursa.base.types import Message

Text = Annotated[str, Field(min_length=1, max_length=300)]
Label = Annotated[str, Field(min_length=1, max_length=40)]


def _distinct(labels: list[str]) -> list[str]:
    # a 1.5B root has filled ["code", "code"]: repeats dropped; a set that cannot tell two
    # records apart is not a plan
    out: dict[str, str] = {}
    for x in labels:
        out.setdefault(x.strip().lower(), x.strip())
    if len(out) < 2:
        raise ValueError("a label set needs at least two different labels")
    return list(out.values())


Labels = Annotated[list[Label], Field(min_length=2, max_length=12), AfterValidator(_distinct)]


@dataclass(frozen=True)
class Body:
    """A plan's own REPL code (after the shared helpers and its functions) and the variable a
    dry run prints as its bound."""

    code: str
    out: str


@dataclass(frozen=True)
class AnswerStep:
    """A typed root call after the plan whose reply fixed code turns into the answer: the
    messages, the reply's JSON schema and cap; `code(reply)` is the REPL code and what the trace
    keeps of the choice (None: the reply is no choice); `read(cell)` the answer in the cell
    (None: none); `mark` tags the turn in the trace."""

    messages: list[Message]
    schema: dict[str, Any]
    max_tokens: int
    code: Callable[[str], tuple[str, dict[str, Any]] | None]
    read: Callable[[Any], str | None]
    mark: dict[str, Any]


@dataclass(frozen=True)
class PlanKind:
    """One row of the plan registry.

    name: the `plan` value the root writes. model: its pydantic model. prompt: its line in the
    planning prompt (how the root is told to fill it). body(plan, dry, query): its REPL code,
    None for the kind that runs nothing (the code mode instead). repl: its REPL-side functions.
    results: the variables its code leaves for the root. noun: what a partial run did part of.
    sourced: it reads passages, which can be an answer's sources. aggregate: it labels every
    record, which only a query for an aggregate (a count, a most, pairs) needs.
    answer(plan, query): the typed answer step after it, or None for the plain answer call.
    of_query(query): the plan of this kind that takes the query as it stands (the kind that has
    one is what a labelling plan for a query asking no aggregate becomes). rescue(query): a
    valid plan of this kind from the query alone, in place of an invalid one the root wrote of
    this kind (None: the query gives none)."""

    name: str
    model: type[BaseModel]
    prompt: str
    body: Callable[[Any, bool, str], Body] | None
    repl: tuple[Callable[..., Any], ...] = ()
    results: tuple[str, ...] = ()
    noun: str = "pieces read"
    sourced: bool = False
    aggregate: bool = False
    answer: Callable[[Any, str], AnswerStep | None] | None = field(default=None)
    of_query: Callable[[str], BaseModel] | None = None
    rescue: Callable[[str], BaseModel | None] | None = None
