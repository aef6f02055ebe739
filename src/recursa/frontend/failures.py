"""What a front end says about failed rows: their commonest reasons, counted."""

from __future__ import annotations

from typing import Any


def failure_reasons(rows: list[dict[str, Any]], top: int = 5) -> list[tuple[str, int]]:
    """The most common reasons among failed rows, as (reason, count), commonest first."""
    from collections import Counter
    counts = Counter(" ".join(str(r.get("error") or "unknown error").split())[:200]
                     for r in rows)
    out = counts.most_common(top)
    rest = sum(counts.values()) - sum(n for _, n in out)
    if rest:
        out.append((f"(other reasons: {len(counts) - top})", rest))
    return out
