"""Assemble a document's pieces (pages, slides, ...) into its text and part table, either as a
Document in memory or streamed straight into the sandbox's JSON payload file."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from recursa.documents import limits
from recursa.documents.errors import DocumentError
from recursa.documents.model import DOC_MARK, Document
from recursa.documents.source import Source

PREVIEW_CHARS = 400


@dataclass
class Piece:
    """One part as an extractor yields it. `text` may be an iterable of chunks (streamed); `meta`
    may be filled in while they are read (a table's row count)."""

    kind: str                                   # page | slide | sheet | section | chapter | table
    name: str = ""
    text: str | Iterable[str] = ""
    meta: dict[str, Any] = field(default_factory=dict)
    header: str | None = None                   # a line written before the part, e.g. "[page 3]"


@dataclass
class Extraction:
    """What an extractor says about the whole document besides its pieces."""

    name: str
    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    max_chars: int = 0          # the most text the document may make (limits.text_cap)


@dataclass
class DocStats:
    """A loaded document in numbers: what the root model's description is made from."""

    name: str
    kind: str
    chars: int
    lines: int
    parts: list[tuple[str, int, str, int, dict[str, Any]]]  # (kind, number, name, chars, meta)
    preview: str
    notes: list[str]
    meta: dict[str, Any]

    @classmethod
    def of(cls, doc: Document) -> DocStats:
        return cls(doc.name, doc.kind, len(doc), doc.count("\n") + 1,
                   [(k, n, nm, e - s, m or {}) for k, n, nm, s, e, m in doc._raw],
                   doc[:PREVIEW_CHARS + 1], list(doc.notes), dict(doc.meta))

    def part_kinds(self) -> Counter[str]:
        return Counter(p[0] for p in self.parts)

    def spread(self) -> str:
        sizes = [p[3] for p in self.parts]
        if not sizes:
            return "none"
        return (f"min {min(sizes):,}, median {int(statistics.median(sizes)):,}, "
                f"max {max(sizes):,} chars")


Extractor = Callable[[Source, Extraction], Iterator[Piece]]
Emit = Callable[[str], object]


class TextOverLimit(Exception):
    """Raised by an extractor whose text would pass Extraction.max_chars (before it is made)."""


def over_limit(name: str, size: int, *, held: bool = False) -> DocumentError:
    cap = limits.text_cap(size, held=held)
    if held and cap == limits.MAX_LOADED_CHARS:
        return DocumentError(f"{name}: its text is over {cap:,} characters, the most one "
                             "document loaded into this process may hold (recursa.documents."
                             "limits.MAX_LOADED_CHARS; a file given to `recursa run` is "
                             "streamed to the sandbox instead)")
    if cap == limits.MAX_TEXT_CHARS:
        return DocumentError(f"{name}: its text is over {cap:,} characters "
                             "(recursa.documents.limits.MAX_TEXT_CHARS)")
    return DocumentError(
        f"{name}: its text grew past {cap:,} characters, more than "
        f"{limits.MAX_TEXT_RATIO} per byte of its {size:,} bytes: refused as a likely "
        "decompression bomb (recursa.documents.limits.MAX_TEXT_RATIO and TEXT_RATIO_FLOOR; "
        "raise them to read it)")


class _Writer:
    """Counts characters and lines of what passes through, keeps the first PREVIEW_CHARS;
    refuses text past the document's cap (limits.text_cap of its size; `held`: the text is
    kept in memory, not streamed)."""

    def __init__(self, emit: Emit, name: str, size: int, *, held: bool = False):
        self.emit, self.name, self.size, self.held = emit, name, size, held
        self.cap = limits.text_cap(size, held=held)
        self.pos = 0
        self.lines = 1
        self.head: list[str] = []
        self.head_len = 0

    def write(self, s: str) -> None:
        if not s:
            return
        self.pos += len(s)
        if self.pos > self.cap:
            raise over_limit(self.name, self.size, held=self.held)
        self.lines += s.count("\n")
        if self.head_len <= PREVIEW_CHARS:
            self.head.append(s[:PREVIEW_CHARS + 1])
            self.head_len += len(self.head[-1])
        self.emit(s)


def _run(src: Source, extract: Extractor, kind: str, emit: Emit, *,
         held: bool = False) -> tuple[Extraction, list[list[Any]], _Writer]:
    size = src.size
    w = _Writer(emit, src.name, size, held=held)
    info = Extraction(src.name, kind, max_chars=w.cap)
    raw: list[list[Any]] = []
    numbers: Counter[str] = Counter()
    try:
        for i, piece in enumerate(extract(src, info)):
            if i:
                w.write("\n\n")
            if piece.header:
                w.write(piece.header + "\n")
            start = w.pos
            if isinstance(piece.text, str):
                w.write(piece.text)
            else:
                for chunk in piece.text:
                    w.write(chunk)
            numbers[piece.kind] += 1
            raw.append([piece.kind, numbers[piece.kind], piece.name, start, w.pos,
                        piece.meta or None])
    except TextOverLimit:
        raise over_limit(src.name, size, held=held) from None
    return info, raw, w


def materialize(src: Source, extract: Extractor, kind: str) -> Document:
    """The document in memory."""
    chunks: list[str] = []
    info, raw, _ = _run(src, extract, kind, chunks.append, held=True)
    text = "".join(chunks)
    chunks.clear()          # at most two copies of the text at once: the joined one and the
    return Document(text, src.name, kind, raw, info.meta, info.notes)   # Document's own


def stream(src: Source, extract: Extractor, kind: str, out: TextIO) -> DocStats:
    """Write the document's JSON form (as Document._wire() has it) to `out` piece by piece, so
    that no more than one piece of a big file is in memory at once."""
    head = json.dumps({DOC_MARK: 1, "name": src.name, "kind": kind}, ensure_ascii=False)
    out.write(head[:-1] + ', "text": "')
    # json.dumps escapes character by character, so escaped chunks concatenate correctly
    info, raw, w = _run(src, extract, kind,
                        lambda s: out.write(json.dumps(s, ensure_ascii=False)[1:-1]))
    out.write('", "parts": ')
    json.dump(raw, out, ensure_ascii=False)
    out.write(', "meta": ')
    json.dump(info.meta, out, ensure_ascii=False, default=str)
    out.write(', "notes": ')
    json.dump(info.notes, out, ensure_ascii=False)
    out.write("}")
    return DocStats(src.name, kind, w.pos, w.lines,
                    [(k, n, nm, e - s, m or {}) for k, n, nm, s, e, m in raw],
                    "".join(w.head)[:PREVIEW_CHARS + 1], info.notes, info.meta)
