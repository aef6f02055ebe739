"""Read one file (a path, or bytes with a name) as the context value it stands for: a Document,
a dict of an archive's files, an Image, or plain text."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from recursa.base import images
from recursa.documents import limits
from recursa.documents.errors import DocumentError
from recursa.documents.model import Document
from recursa.documents.source import ARCHIVES, Source, detect

if TYPE_CHECKING:
    from recursa.documents.build import DocStats, Extractor

# format -> (module in recursa.documents.formats, its extractor). A format's module loads when a
# file of that format is read (`extractor`): a plain-text context, as most runs have, imports
# none of them, nor what they import (sqlite3, tarfile: ~3 ms of every run's start-up), nor
# recursa.documents.build
EXTRACTORS: dict[str, tuple[str, str]] = {
    "pdf": ("pdf", "extract"), "docx": ("office", "extract_docx"),
    "pptx": ("office", "extract_pptx"), "xlsx": ("office", "extract_xlsx"),
    "epub": ("markup", "extract_epub"), "html": ("markup", "extract_html"),
    "markdown": ("markup", "extract_markdown"), "csv": ("tables", "extract_csv"),
    "tsv": ("tables", "extract_csv"), "jsonl": ("tables", "extract_jsonl"),
    "parquet": ("tables", "extract_parquet"), "sqlite": ("sqlite", "extract"),
}
LABELS = {"pdf": "PDF", "docx": "Word", "pptx": "PowerPoint", "xlsx": "Excel", "epub": "EPUB",
          "html": "HTML", "markdown": "Markdown", "csv": "CSV", "tsv": "TSV",
          "jsonl": "JSON Lines", "parquet": "Parquet", "sqlite": "SQLite"}


def extractor(kind: str) -> Extractor:
    """The extractor of a format in EXTRACTORS, its module imported now."""
    module, name = EXTRACTORS[kind]
    extract: Extractor = getattr(importlib.import_module(f"recursa.documents.formats.{module}"),
                                 name)
    return extract


def _guarded(src: Source, kind: str, run: Callable[[], Any]) -> Any:
    """Any failure inside a format's library becomes a DocumentError naming the file."""
    try:
        return run()
    except DocumentError:
        raise
    except MemoryError:
        raise DocumentError(f"{src.name}: out of memory while reading it as {LABELS[kind]} "
                            "(the document parser's cap: recursa.documents.limits."
                            "PARSE_MEMORY_MB, env RECURSA_PARSE_MEMORY_MB)") from None
    except Exception as e:
        raise DocumentError(f"{src.name}: cannot be read as {LABELS[kind]} "
                            f"({type(e).__name__}: {e})") from None


def check_size(src: Source, cap: int) -> None:
    size = src.size
    if size > cap:
        raise DocumentError(f"{src.name}: {limits.mb(size)} is over the {limits.mb(cap)} limit "
                            "for one document (recursa.documents.limits)")


def decode_text(data: bytes, name: str) -> tuple[str, int]:
    """UTF-8 text, replacing invalid bytes (returned: how many); binary data is refused."""
    if b"\x00" in data[:8192]:
        raise DocumentError(f"{name} looks binary (it contains NUL bytes) and is no document "
                            "format recursa reads (PDF, Office, EPUB, HTML, Markdown, CSV, "
                            "JSON Lines, Parquet, SQLite, zip/tar); give a text file")
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, text.count("\ufffd")


def load_source(src: Source, notes: list[str], *, cap: int = limits.MAX_DOCUMENT_BYTES,
                nested: bool = False) -> Any:
    """The context value of one file: Document, {member: value} for an archive, Image or str.
    Problems that do not stop the file go to `notes`."""
    check_size(src, cap)
    kind = detect(src)
    if kind in EXTRACTORS:
        # loaded with the format's module (EXTRACTORS)
        from recursa.documents.build import materialize
        extract = extractor(kind)
        doc: Document = _guarded(src, kind, lambda: materialize(src, extract, kind))
        notes.extend(doc.notes)
        return doc
    if kind in ARCHIVES:
        if nested:
            raise DocumentError(f"{src.name}: an archive inside an archive is not opened")
        return _archive(src, kind, notes)
    if kind == "image":
        data = src.data if src.data is not None else src.open().read()
        return images.Image.from_bytes(data, name=src.name)
    if kind == "legacy-office":
        raise DocumentError(f"{src.name}: an old binary Office file (.doc/.xls/.ppt) is not "
                            "read; save it as .docx/.xlsx/.pptx")
    with src.open() as f:
        data = f.read()
    text, bad = decode_text(data, src.name)
    if bad:
        notes.append(f"{src.name}: {bad} invalid UTF-8 bytes replaced by U+FFFD")
    return text


def _archive(src: Source, kind: str, notes: list[str]) -> dict[str, Any]:
    return dict(iter_archive(src, kind, notes))


def iter_archive(src: Source, kind: str, notes: list[str], *,
                 skip: Mapping[str, str] | None = None,
                 reading: Callable[[str], object] | None = None) -> Iterator[tuple[str, Any]]:
    """(member path, value) of each readable member as it is read. `skip`: members not to
    read, with why (a note each); `reading(name)` is called before a member is read."""
    # tarfile: only for an archive (EXTRACTORS)
    from recursa.documents.formats import archive
    members = archive.zip_members if kind == "zip" else archive.tar_members
    found = skipped = 0
    for name, data in members(src, notes):
        if skip and name in skip:
            skipped += 1
            notes.append(f"{name}: skipped: {skip[name]}")
            continue
        if reading is not None:
            reading(name)
        try:
            value = load_source(Source(name, data=data), notes, cap=limits.MAX_MEMBER_BYTES,
                                nested=True)
        except DocumentError as e:
            skipped += 1
            notes.append(f"{name}: skipped: {_short(e, name)}")
            continue
        found += 1
        yield name, value
    if not found:
        raise DocumentError(f"{src.name}: the archive holds no readable file"
                            + (f" ({skipped} skipped: {notes[-1]})" if skipped else ""))


def _short(e: Exception, name: str) -> str:
    msg = str(e)
    return msg[len(name) + 2:] if msg.startswith(name + ": ") else msg


def load(path: str | os.PathLike[str] | bytes, *, name: str | None = None) -> Any:
    """Load a file as recursa would as a context: a PDF, Word, PowerPoint, Excel, EPUB, HTML,
    Markdown, CSV/TSV, JSON Lines, Parquet or SQLite file -> Document; a zip/tar archive -> dict
    by member path; an image -> Image; any other text -> str. `path` may be the file's bytes,
    with `name`. Bad, encrypted or oversized files raise DocumentError naming the file.
    Documents are parsed in a confined process (recursa.documents.confine), never here."""
    from recursa.documents import confine
    if isinstance(path, bytes | bytearray):
        return confine.load_bytes(bytes(path), name or "document")[0]
    p = Path(path)
    if not p.is_file():
        raise DocumentError(f"{p}: no such file" if not p.exists() else
                            f"{p}: not a regular file (a directory, device, FIFO or socket)")
    return confine.load_file(p, name or p.name).value


def stream_file(path: Path, out: TextIO, name: str | None = None) -> DocStats | None:
    """Write a document file's payload JSON straight to `out` (None: not a streamed format,
    nothing written)."""
    src = Source(name or path.name, path=path)
    kind = detect(src)
    if kind not in EXTRACTORS:
        return None
    check_size(src, limits.MAX_DOCUMENT_BYTES)
    # loaded with the format's module (EXTRACTORS)
    from recursa.documents.build import stream
    extract = extractor(kind)
    stats: DocStats = _guarded(src, kind, lambda: stream(src, extract, kind, out))
    return stats
