"""The plan library: one module per plan kind, registered in `KINDS`.

A new plan kind is one module (its pydantic model, its prompt line, its REPL code; see
`recursa.core.strategies.plans.base`) plus one row below. The order of the rows is the order the root
reads them in the planning prompt and in the plans' JSON schema; `code` (no plan fits) stays
last.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from recursa.core.strategies.plans import chained_lookup, code, label_count, pairs, retrieve_read
from recursa.core.strategies.plans.base import PlanKind
from recursa.core.strategies.plans.repl import common, sources

KINDS: dict[str, PlanKind] = {k.name: k for k in (
    retrieve_read.KIND,
    label_count.KIND,
    chained_lookup.KIND,
    pairs.KIND,
    code.KIND,
)}

Plan = Annotated[Union[tuple(k.model for k in KINDS.values())],  # type: ignore[valid-type]  # noqa: UP007
                 Field(discriminator="plan")]
PLAN: TypeAdapter[Any] = TypeAdapter(Plan)  # type: ignore[arg-type]


def kind_of(plan: Any) -> PlanKind:
    return KINDS[plan.plan]


def query_plan(query: str) -> Any:
    """The plan that takes the query as it stands: the first kind that has one (`of_query`)."""
    make = next(k.of_query for k in KINDS.values() if k.of_query is not None)
    return make(query)


def parse(text: str) -> Any:
    """The plan in the root's reply (ValueError when there is none)."""
    t = text.strip()
    m = re.search(r"\{.*\}", t, re.S)
    if not m:
        raise ValueError("no JSON object in the reply")
    value = json.loads(m.group())
    if isinstance(value, dict) and set(value) == {"choice"}:
        value = value["choice"]
    try:
        return PLAN.validate_python(value)
    except ValidationError as e:
        raise ValueError(f"not a valid plan: {e.errors(include_url=False)[:2]}") from None


def plan_schema() -> dict[str, Any]:
    """The plans' JSON schema with its references inlined (grammar converters and small
    models both do better without $ref)."""
    raw = PLAN.json_schema()
    defs = raw.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()
                    if k not in ("discriminator", "title", "description")}
        if isinstance(node, list):
            return [inline(x) for x in node]
        return node
    return inline(raw)


# the plan's helpers (every name the REPL-side code defines starts with _plan or _PLAN) leave
# the REPL; its results stay
TIDY = ("for _n in [n for n in globals() if n.startswith(('_plan', '_PLAN', 'plan_bound'))]:\n"
        "    del globals()[_n]\ndel _n")


def plan_code(plan: Any, dry: bool, query: str = "") -> str:
    """The REPL code of a plan: the shared helpers, its kind's functions, its own lines and the
    tidy-up. `dry`: it prints its bound as JSON instead of running. `query`: the run's query,
    whose condition a labelling plan's leaves judge when the plan's labels do not say all of it."""
    kind = kind_of(plan)
    if kind.body is None:
        raise ValueError(f"no code for plan {plan!r}")
    body = kind.body(plan, dry, query)
    head = sources(common, *kind.repl)
    if dry:
        return f"{head}\n{body.code}\nprint(json.dumps({body.out}))\n{TIDY}"
    return f"{head}\n{body.code}\n{TIDY}"


def describe(plan: Any) -> str:
    return json.dumps(plan.model_dump(), ensure_ascii=False)
