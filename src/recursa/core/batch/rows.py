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
