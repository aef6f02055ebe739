"""One JSON row per batch item: what `recursa batch` appends to --out and what a resume reads."""

from __future__ import annotations

import platform
import time
from typing import Any

from recursa.base.types import Result

from .items import BatchItem

SCHEMA_VERSION = 1


def spend_of(res: Result) -> tuple[int, int, float | None]:
    """(input tokens, output tokens, cost) of a run across its roles."""
    inp = sum(u.usage.input_tokens for u in res.usage.values())
    out = sum(u.usage.output_tokens for u in res.usage.values())
    return inp, out, res.cost_usd


def item_row(item: BatchItem, res: Result, *, attempt: int = 1, host: str | None = None,
             started_at: float | None = None, wall_s: float | None = None) -> dict[str, Any]:
    """The row of a finished item (a run that failed is a row with status "error")."""
    inp, out, cost = spend_of(res)
    now = time.time()
    parsed = res.parsed
    if hasattr(parsed, "model_dump"):
        parsed = parsed.model_dump(mode="json")
    return {
        "schema": SCHEMA_VERSION, "key": item.key, "index": item.index, "source": item.source,
        **item.fields, "query": item.query, "answer": res.answer, "parsed": parsed,
        "output_error": res.output_error, "status": res.status, "error": res.error,
        "limit": res.limit, "cost_usd": cost, "input_tokens": inp, "output_tokens": out,
        "tokens": inp + out, "turns": res.turns, "subcalls": res.subcalls,
        "wall_s": round(wall_s if wall_s is not None else res.elapsed_s, 3),
        "attempt": attempt, "host": host or platform.node(), "trace_path": res.trace_path,
        "started_at": started_at or now - res.elapsed_s, "finished_at": now,
    }


def error_result(message: str) -> Result:
    """A Result for an item whose run never produced one (a crash, a lost worker)."""
    return Result(answer="", status="error", error=message, cost_usd=0.0)


def row_failed(row: dict[str, Any]) -> bool:
    """A failed item: an error, or a typed answer that did not validate."""
    return row.get("status") == "error" or (row.get("output_error") is not None
                                            and row.get("parsed") is None)


def row_cut(row: dict[str, Any]) -> bool:
    """An item a limit (its own max_cost_usd, max_tokens, max_seconds, max_iterations...)
    ended with no answer (status "limit", or "extracted" with nothing to extract): not done,
    so a re-run retries it."""
    return (row.get("status") != "error" and bool(row.get("limit"))
            and not str(row.get("answer") or "").strip())


def row_done(row: dict[str, Any]) -> bool:
    """An item whose row a resume keeps: neither failed nor cut by a limit to no answer."""
    return not row_failed(row) and not row_cut(row)


_STATUSES = ("final", "extracted", "limit", "error")
_TEXT = ("answer", "error", "output_error", "limit", "query", "source", "trace_path", "host")
_NUMBERS = ("cost_usd", "input_tokens", "output_tokens", "tokens", "turns", "subcalls",
            "wall_s", "started_at", "finished_at", "attempt", "index")


def row_problem(row: Any) -> str | None:
    """What is wrong with a row read back from a rows file (None: nothing). A resume trusts
    these rows (which items are done, what they cost), so a row another program or a person
    changed is named, not half-read."""
    if not isinstance(row, dict):
        return f"a row must be a JSON object, not {type(row).__name__}"
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return f"its key must be a non-empty string, not {key!r:.60}"
    if row.get("status") not in _STATUSES:
        return (f"its status must be one of {', '.join(_STATUSES)}, not "
                f"{row.get('status')!r:.60}")
    for name in _TEXT:
        v = row.get(name)
        if v is not None and not isinstance(v, str):
            return f"its {name} must be a string or null, not {type(v).__name__}"
    for name in _NUMBERS:
        v = row.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            return f"its {name} must be a number or null, not {v!r:.60}"
    return None
