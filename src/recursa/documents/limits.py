"""Bounds on what one document, folder or archive may cost to load (patchable module values)."""

from __future__ import annotations

MAX_DOCUMENT_BYTES = 2 * 1024**3      # one document file given on its own (a 500 MB CSV loads)
MAX_MEMBER_BYTES = 200 * 1024**2      # one document inside a folder or an archive
MAX_TEXT_CHARS = 1_000_000_000        # extracted text of one document
MAX_ARCHIVE_MEMBERS = 10_000
MAX_ARCHIVE_BYTES = 1024**3           # declared uncompressed size of all members of an archive
MAX_RATIO = 100                       # uncompressed / compressed, for members over RATIO_FLOOR
RATIO_FLOOR = 1024**2


def mb(n: int) -> str:
    return f"{n / 1024**2:,.1f} MB"
