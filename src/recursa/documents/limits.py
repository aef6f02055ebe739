"""Bounds on what one document, folder or archive may cost to load (patchable module values; the
parse caps may also be set from the environment). The values in force when a load starts are
the ones the confined parser (recursa.documents.confine) is given."""

from __future__ import annotations

import os


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


MAX_DOCUMENT_BYTES = 2 * 1024**3      # one document file given on its own (a 500 MB CSV loads)
MAX_MEMBER_BYTES = 200 * 1024**2      # one document inside a folder or an archive
MAX_TEXT_FILE_BYTES = 50 * 1024**2    # one plain text file inside a folder
MAX_TEXT_CHARS = 1_000_000_000        # extracted text of one document streamed to a sandbox
# Text a load keeps in this process (a library load(), a folder, an archive, an upload, bytes):
# one document's, and, at 4 bytes a character, what the parser may write back for the whole
# load. A file given to `recursa run` is streamed to the sandbox instead (MAX_TEXT_CHARS).
MAX_LOADED_CHARS = 256_000_000
# Expansion: the text of one document may be at most MAX_TEXT_RATIO characters per byte of its
# file, once over TEXT_RATIO_FLOOR characters (an 8 KB SQLite file whose generated column makes
# 500M characters, a 4 KB workbook repeating one huge shared string)
MAX_TEXT_RATIO = 100
TEXT_RATIO_FLOOR = 10_000_000
MAX_ARCHIVE_MEMBERS = 10_000
MAX_ARCHIVE_BYTES = 1024**3           # declared uncompressed size of all members of an archive
MAX_RATIO = 100                       # uncompressed / compressed: each member and the whole
RATIO_FLOOR = 1024**2                 # archive (zip, tar.gz/bz2/xz, and the zip inside an
                                      # Office file or EPUB), once over this many bytes
MAX_VALUE_BYTES = 64 * 1024**2        # one value of a SQLite table (SQLITE_LIMIT_LENGTH)
MAX_IGNORE_FILE_BYTES = 1024**2       # a .gitignore or .git/info/exclude

# The confined parser (recursa.documents.confine): one process per load, whatever it reads
PARSE_MEMORY_MB = _env_int("RECURSA_PARSE_MEMORY_MB", 2048)     # its whole process tree
PARSE_CPU_SECONDS = _env_int("RECURSA_PARSE_CPU_SECONDS", 300)
PARSE_SECONDS = _env_int("RECURSA_PARSE_SECONDS", 600)          # wall clock
PARSE_OUTPUT_MB = _env_int("RECURSA_PARSE_OUTPUT_MB", 4096)     # what it may write (the text)


def mb(n: int) -> str:
    return f"{n / 1024**2:,.1f} MB"


def text_cap(size: int, *, held: bool = False) -> int:
    """The most characters a document of `size` bytes may turn into (`held`: kept in this
    process, not streamed to a sandbox)."""
    cap = min(MAX_TEXT_CHARS, max(TEXT_RATIO_FLOOR, MAX_TEXT_RATIO * size))
    return min(cap, MAX_LOADED_CHARS) if held else cap


def loaded_output_mb() -> int:
    """The most a parser may write back for a load kept in this process: MAX_LOADED_CHARS at
    up to 4 bytes a character (its JSON, in UTF-8), never more than PARSE_OUTPUT_MB."""
    return max(1, min(PARSE_OUTPUT_MB, -(-MAX_LOADED_CHARS * 4 // 1024**2)))


def values() -> dict[str, int]:
    """The bounds in force now (what a confined parser is given)."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, int)}


def expansion(declared: int, packed: int, *, archive: bool = True) -> str | None:
    """Why `declared` bytes unpacked from `packed` bytes are refused: over MAX_RATIO times once
    over RATIO_FLOOR, or (an archive) over MAX_ARCHIVE_BYTES; else None."""
    if archive and declared > MAX_ARCHIVE_BYTES:
        return f"{mb(declared)} uncompressed (limit {mb(MAX_ARCHIVE_BYTES)}, MAX_ARCHIVE_BYTES)"
    if declared > RATIO_FLOOR and declared > MAX_RATIO * max(packed, 1):
        return (f"{mb(declared)} uncompressed, {declared / max(packed, 1):,.0f} times its "
                f"{packed:,} bytes (limit {MAX_RATIO}x, MAX_RATIO)")
    return None
