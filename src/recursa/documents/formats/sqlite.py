"""SQLite: each table a part (TSV with a header row), its CREATE statement in `.schema`; views
are listed with their schema. Opened read-only and immutable: the file is never written."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recursa.documents import limits
from recursa.documents.build import Extraction, Piece
from recursa.documents.errors import DocumentError
from recursa.documents.formats.tables import delimited
from recursa.documents.source import Source


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextlib.contextmanager
def _on_disk(src: Source) -> Iterator[Path]:
    """SQLite reads files: bytes from an archive or an upload go to a private temporary file."""
    if src.path is not None:
        yield src.path
        return
    fd, tmp = tempfile.mkstemp(prefix="recursa-sqlite-", suffix=".db")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(src.data or b"")
        yield Path(tmp)
    finally:
        os.unlink(tmp)


def extract(src: Source, info: Extraction) -> Iterator[Piece]:
    with _on_disk(src) as path:
        try:
            con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        except sqlite3.Error as e:
            raise DocumentError(f"{src.name}: cannot open the SQLite database: {e}") from None
        # one value (a stored one, or one a generated column computes as it is read) may not
        # pass MAX_VALUE_BYTES: `printf('%.*c', 500000000, 'x')` fails instead of being made
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.MAX_VALUE_BYTES)
        try:
            try:
                objects = con.execute(
                    "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view') "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY type, name").fetchall()
            except sqlite3.DatabaseError as e:
                raise DocumentError(f"{src.name}: not a readable SQLite database (corrupt, "
                                    f"truncated or encrypted: {e})") from None
            views = [(n, sql) for t, n, sql in objects if t == "view"]
            if views:
                info.meta["views"] = {n: sql for n, sql in views}
            for kind, name, sql in objects:
                if kind != "table":
                    continue
                meta: dict[str, Any] = {"schema": sql}

                def rows(name: str = name) -> Iterator[Any]:
                    try:
                        cur = con.execute(f"SELECT * FROM {_quote(name)}")
                        yield [d[0] for d in cur.description]
                        while batch := cur.fetchmany(2000):
                            yield from batch
                    except sqlite3.DataError as e:   # SQLITE_TOOBIG: over the value limit
                        raise DocumentError(
                            f"{src.name}: table {name!r} holds a value over the "
                            f"{limits.mb(limits.MAX_VALUE_BYTES)} limit for one value "
                            f"(recursa.documents.limits.MAX_VALUE_BYTES; {e})") from None
                    except sqlite3.DatabaseError as e:
                        raise DocumentError(f"{src.name}: table {name!r} cannot be read: "
                                            f"{e}") from None
                yield Piece("table", name, delimited(rows(), meta, max_chars=info.max_chars), meta,
                            header=f"[table {name}]")
        finally:
            con.close()
