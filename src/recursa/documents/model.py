"""What a loaded document is, and where a piece of its text lies.

`Document` and `Part` are defined once in the sandbox worker (a stdlib-only program) so that the
objects a user loads here and the ones the model's code meets in the REPL are the same class.
`Location` is the position of a span of text: its file, page / slide / sheet / section, line and
character offsets; `locate()` finds it from offsets into a context's text.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Any

from recursa.base.types import Location  # one type for documents and sources (recursa.core.sources)
from recursa.sandbox.worker import DOC_MARK, Document, Part

__all__ = ["DOC_MARK", "Document", "Location", "Part", "locate", "locate_part", "revive",
           "to_wire"]


def _locate_in(text: str, start: int, end: int, file: str | None) -> Location:
    """The span [start, end) of `text` (a str, or a Document: then its page / sheet / ...)."""
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"span {start}-{end} is outside the text ({len(text):,} characters)")
    s, e = 0, len(text)
    unit: dict[str, Any] = {}
    if isinstance(text, Document) and text._raw:
        starts = [p[3] for p in text._raw]
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and start <= text._raw[i][4]:
            kind, number, name, s, e, _ = text._raw[i]
            unit = {"unit": kind, "number": number, "name": name or None}
    return _span(text, s, e, start, end, file=file, **unit)


def _span(text: str, s: int, e: int, start: int, end: int, **fields: Any) -> Location:
    """A Location of [start, end) (offsets in `text`) inside its unit text[s:e]."""
    stop = min(end, e)
    line = text.count("\n", s, start) + 1
    last = line + text.count("\n", start, max(start, stop - 1))
    return Location(line=line, end_line=None if last == line else last, start=start - s,
                    end=stop - s, doc_start=start, doc_end=end, **fields)


def locate_part(part: Part, start: int, end: int) -> Location:
    """The span [start, end) of one page / sheet / ... (a Part, as `doc.pages[1]`)."""
    if not 0 <= start <= end <= len(part):
        raise ValueError(f"span {start}-{end} is outside the text ({len(part):,} characters)")
    loc = _span(part, 0, len(part), start, end, file=part.doc or None, unit=part.kind,
                number=part.number, name=part.name or None)
    return replace(loc, doc_start=part.start + start, doc_end=part.start + end)


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
    return replace(_locate_in(value, start, end, file), item=(key,))


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
