"""What a loaded document is, and where a piece of its text lies.

`Document` and `Part` are defined once in the sandbox worker (a stdlib-only program) so that the
objects a user loads here and the ones the model's code meets in the REPL are the same class.
`Location` is the position of a span of text: its file, page / slide / sheet / section, line and
character offsets; `locate()` finds it from offsets into a context's text.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from recursa.sandbox.worker import DOC_MARK, Document, Part

__all__ = ["DOC_MARK", "Document", "Location", "Part", "locate", "revive", "to_wire"]


@dataclass(frozen=True, slots=True)
class Location:
    """Where a span of a context's text lies.

    `file`: the document's name or its path inside a folder/archive (None for a plain text
    context); `unit`: "page", "slide", "sheet", "section", "chapter" or "table" (None when the span
    is outside any part, or the text has no parts); `number` (1-based) and `name` of that unit;
    `line`: 1-based line in the unit (else in the whole text) where the span starts; `start`/`end`:
    character offsets in the unit's text (else the whole text); `doc_start`/`doc_end`: offsets in
    the whole text of the document (`context`, or `context[key]`)."""

    file: str | None
    unit: str | None
    number: int | None
    name: str | None
    line: int
    start: int
    end: int
    doc_start: int
    doc_end: int

    def __str__(self) -> str:
        bits = [self.file] if self.file else []
        if self.unit:
            bits.append(f"{self.unit} {self.number}" + (f" ({self.name})" if self.name else ""))
        bits.append(f"line {self.line}")
        bits.append(f"chars {self.start}-{self.end}")
        return ", ".join(bits)


def _locate_in(text: str, start: int, end: int, file: str | None) -> Location:
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"span {start}-{end} is outside the text ({len(text):,} characters)")
    if isinstance(text, Document) and text._raw:
        starts = [p[3] for p in text._raw]
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0:
            kind, number, name, s, e, _ = text._raw[i]
            if start <= e:
                return Location(file, kind, number, name or None,
                                text.count("\n", s, start) + 1, start - s,
                                min(end, e) - s, start, end)
    return Location(file, None, None, None, text.count("\n", 0, start) + 1, start, end,
                    start, end)


def locate(context: Any, start: int, end: int, key: str | int | None = None) -> Location:
    """The Location of characters start..end of `context` (a str or Document), or of
    `context[key]` for a dict (a folder: key is the file's path) or a list of texts."""
    if key is None:
        if not isinstance(context, str):
            raise TypeError("locate() needs key= for a list or dict context")
        return _locate_in(context, start, end, context.name if isinstance(context, Document)
                          and context.name else None)
    value = context[key]
    if not isinstance(value, str):
        raise TypeError(f"context[{key!r}] is a {type(value).__name__}, not text")
    file = str(key) if isinstance(context, dict) else (
        value.name if isinstance(value, Document) and value.name else f"[{key}]")
    return _locate_in(value, start, end, file)


def to_wire(value: Any) -> Any:
    """`value` with every Document replaced by its JSON form (json.dumps would write a Document,
    a str, as bare text and lose its structure)."""
    if isinstance(value, Document):
        return value._wire()
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    return value


def revive(d: dict[str, Any]) -> Any:
    """json.load(..., object_hook=revive): a payload's documents as Document, all else as is."""
    if d.get(DOC_MARK) == 1 and "text" in d:
        return Document(d["text"], d.get("name", ""), d.get("kind", "text"),
                        d.get("parts") or (), d.get("meta"), d.get("notes") or ())
    return d


def has_documents(value: Any) -> bool:
    if isinstance(value, Document):
        return True
    if isinstance(value, dict):
        return any(has_documents(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_documents(v) for v in value)
    return False
