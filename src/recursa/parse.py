"""Extracting code from model replies and formatting cell output for the model."""

from __future__ import annotations

import re

from recursa.types import Cell

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)


def code_blocks(text: str) -> list[str]:
    """The ```repl blocks of a reply, in order; ```python blocks only when there is no repl block.

    An unterminated last fence still counts (models often stop mid-fence at their output cap).
    """
    blocks: dict[str, list[str]] = {"repl": [], "python": []}
    for m in _FENCE.finditer(text):
        lang = m.group(1).lower()
        body = m.group(2)
        if lang == "repl":
            blocks["repl"].append(body)
        elif lang in ("python", "py", "python3"):
            blocks["python"].append(body)
    chosen = blocks["repl"] or blocks["python"]
    return [b for b in chosen if b.strip()]


def cap(text: str, limit: int, total: int | None = None) -> str:
    """Cut `text` to `limit` characters with a marker saying how much was cut."""
    total = len(text) if total is None else max(total, len(text))
    if total <= limit:
        return text
    return text[:limit] + f"\n... [output truncated: {total - limit:,} of {total:,} characters not shown]"


def format_cell(cell: Cell, limit: int) -> str:
    """Everything one cell produced, as the model will read it, within `limit` characters."""
    parts: list[tuple[str, str, int]] = []
    if cell.stdout_chars or cell.stdout:
        parts.append(("", cell.stdout, cell.stdout_chars))
    if cell.stderr_chars or cell.stderr:
        parts.append(("[stderr]\n", cell.stderr, cell.stderr_chars))
    if cell.value is not None:
        parts.append(("[value] ", cell.value, len(cell.value)))
    if cell.error:
        parts.append(("[error]\n", cell.error, len(cell.error)))
    if not parts:
        return "[no output]"
    # Errors and values are short and matter most: give them their room, the rest shares.
    out: list[str] = []
    budget = limit
    for label, text, total in parts:
        share = max(200, budget // max(1, len(parts) - len(out)))
        chunk = label + cap(text, share, total)
        out.append(chunk)
        budget = max(0, budget - len(chunk))
    return "\n".join(out)
