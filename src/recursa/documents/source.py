"""A file to read (on disk, or bytes from an archive or an upload) and what format it is in:
by its magic bytes first, then by its extension."""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from recursa.base import images

# extension -> format, for formats that have no magic bytes of their own
TEXT_SUFFIXES = {
    ".md": "markdown", ".markdown": "markdown", ".mdown": "markdown",
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".csv": "csv", ".tsv": "tsv", ".tab": "tsv",
    ".jsonl": "jsonl", ".ndjson": "jsonl",
}
SUFFIXES = {**TEXT_SUFFIXES, ".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx",
            ".xlsm": "xlsx", ".epub": "epub", ".parquet": "parquet", ".sqlite": "sqlite",
            ".sqlite3": "sqlite", ".db": "sqlite", ".zip": "zip", ".tar": "tar",
            ".tgz": "tar", ".tbz2": "tar", ".txz": "tar"}
DOCUMENT_FORMATS = frozenset(SUFFIXES.values())
ARCHIVES = frozenset({"zip", "tar"})
LEGACY_OFFICE = {".doc": ".docx", ".xls": ".xlsx", ".ppt": ".pptx"}
HEAD = 4096


@dataclass
class Source:
    """A file's name (shown to the model, used in errors) and its bytes: a path or data."""

    name: str
    path: Path | None = None
    data: bytes | None = None

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else (self.path.stat().st_size
                                                             if self.path else 0)

    @property
    def suffix(self) -> str:
        n = self.name.lower()
        for double in (".tar.gz", ".tar.bz2", ".tar.xz"):
            if n.endswith(double):
                return ".tar"
        return Path(n).suffix

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.path is not None
        return self.path.open("rb")

    def head(self, n: int = HEAD) -> bytes:
        if self.data is not None:
            return self.data[:n]
        with self.open() as f:
            return f.read(n)


def _zip_kind(src: Source) -> str:
    """docx / pptx / xlsx / epub are zip files told apart by what they hold."""
    try:
        with src.open() as f, zipfile.ZipFile(f) as z:
            names = set(z.namelist())
            if "mimetype" in names and z.read("mimetype")[:20] == b"application/epub+zip":
                return "epub"
    except (zipfile.BadZipFile, OSError, KeyError, EOFError):
        return SUFFIXES.get(src.suffix, "zip") if src.suffix in (".docx", ".pptx", ".xlsx",
                                                                 ".xlsm", ".epub") else "zip"
    if "word/document.xml" in names:
        return "docx"
    if "ppt/presentation.xml" in names:
        return "pptx"
    if "xl/workbook.xml" in names:
        return "xlsx"
    return "zip"


def detect(src: Source, head: bytes | None = None, *, deep: bool = True) -> str:
    """The format of `src`: one of DOCUMENT_FORMATS, "image", "legacy-office", "binary" or
    "text" (any other text, read as it is). `deep=False` reads no more than the head: a zip
    container is "zip" whatever it holds (what the host needs to know to confine its parse)."""
    head = src.head() if head is None else head
    if head.startswith(b"%PDF-") or b"%PDF-" in head[:1024]:
        return "pdf"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return _zip_kind(src) if deep else "zip"
    if head.startswith(b"SQLite format 3\x00"):
        return "sqlite"
    if head.startswith(b"PAR1"):
        return "parquet"
    if images.sniff(head[:16]) or src.suffix in images.SUFFIXES:
        return "image"
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return "legacy-office"
    if len(head) > 262 and head[257:262] == b"ustar":
        return "tar"
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")):
        return "tar" if src.suffix == ".tar" else "binary"
    if b"\x00" in head:
        return "binary"
    kind = TEXT_SUFFIXES.get(src.suffix)
    if kind:
        return kind
    if src.suffix in SUFFIXES:          # e.g. a truncated .docx: its reader names the problem
        return SUFFIXES[src.suffix]
    start = head.lstrip()[:64].lower()
    if start.startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"
