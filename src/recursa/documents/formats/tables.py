"""Rows: CSV / TSV and JSON Lines kept as their own text (offsets are the file's), Parquet
written as TSV; the row count and columns are found in the same single pass."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from recursa.documents import limits
from recursa.documents.build import Extraction, Piece, TextOverLimit
from recursa.documents.errors import DocumentError, need
from recursa.documents.source import Source

BATCH_ROWS = 2000
CHUNK_CHARS = 1 << 20


def cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes | bytearray | memoryview):
        return f"<{len(v)} bytes>"
    if isinstance(v, dict | list | tuple):
        return json.dumps(v, ensure_ascii=False, default=str)
    return str(v)


def delimited(rows: Iterable[Iterable[Any]], meta: dict[str, Any],
              delimiter: str = "\t", *, max_chars: int = 0) -> Iterator[str]:
    """Rows as delimited text in chunks of BATCH_ROWS rows (or CHUNK_CHARS characters); the
    first row is the header. Sets meta's columns and rows (the count of rows after the header)
    as they pass. `max_chars` (when set): TextOverLimit before a row would take the text past
    it, so that one row repeating a huge value is refused before it is written out."""
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    n = made = 0
    meta.update(format="delimited", delimiter=delimiter, header=True, rows=0)
    for row in rows:
        cells = [cell(v) for v in row]
        if max_chars:
            made += sum(map(len, cells)) + len(cells)
            if made > max_chars:
                raise TextOverLimit
        if n == 0:
            meta["columns"] = cells
        w.writerow(cells)
        n += 1
        meta["rows"] = n - 1
        if n % BATCH_ROWS == 0 or buf.tell() > CHUNK_CHARS:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue().rstrip("\n")


def _text_lines(src: Source, info: Extraction) -> Iterator[str]:
    """The file's lines, decoded as UTF-8 (a BOM dropped, bad bytes replaced and counted)."""
    bad = 0
    with src.open() as f:
        text = io.TextIOWrapper(f, encoding="utf-8-sig", errors="replace", newline="")
        for line in text:
            if "\ufffd" in line:
                bad += line.count("\ufffd")
            yield line
    if bad:
        info.notes.append(f"{src.name}: {bad} invalid UTF-8 bytes replaced by U+FFFD")


def _delimiter(src: Source, kind: str) -> str:
    if kind == "tsv":
        return "\t"
    sample = src.head(65536).decode("utf-8", errors="replace")
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def extract_csv(src: Source, info: Extraction) -> Iterator[Piece]:
    meta: dict[str, Any] = {"format": "delimited", "delimiter": _delimiter(src, info.kind),
                            "header": True}
    out: list[str] = []

    def passing() -> Iterator[str]:
        for line in _text_lines(src, info):
            out.append(line)
            yield line

    def chunks() -> Iterator[str]:
        n = 0
        try:
            for row in csv.reader(passing(), delimiter=meta["delimiter"]):
                if n == 0:
                    meta["columns"] = row
                n += 1
                if len(out) >= BATCH_ROWS:
                    yield "".join(out)
                    out.clear()
        except csv.Error as e:
            raise DocumentError(f"{src.name}: not readable as CSV near row {n + 1}: {e}") from None
        meta["rows"] = max(n - 1, 0)
        yield "".join(out)
    yield Piece("table", src.name, chunks(), meta)


def extract_jsonl(src: Source, info: Extraction) -> Iterator[Piece]:
    meta: dict[str, Any] = {"format": "jsonl"}

    def chunks() -> Iterator[str]:
        keys: dict[str, None] = {}
        rows = bad = 0
        first_bad = 0
        buf: list[str] = []
        for no, line in enumerate(_text_lines(src, info), 1):
            buf.append(line)
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError:
                    bad += 1
                    first_bad = first_bad or no
                else:
                    rows += 1
                    if isinstance(obj, dict) and len(keys) < 200 and rows <= 1000:
                        keys.update(dict.fromkeys(obj))
            if len(buf) >= BATCH_ROWS:
                yield "".join(buf)
                buf.clear()
        meta.update(rows=rows, columns=list(keys))
        if bad:
            info.notes.append(f"{src.name}: {bad} line(s) are not JSON (first: line "
                              f"{first_bad}); .rows fails on them, the text has them")
        yield "".join(buf)
    yield Piece("table", src.name, chunks(), meta)


def extract_parquet(src: Source, info: Extraction) -> Iterator[Piece]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise need("pyarrow", "Parquet", src.name) from None
    try:
        pf = pq.ParquetFile(src.path if src.path is not None else io.BytesIO(src.data or b""))
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a bad footer
        raise DocumentError(f"{src.name}: not a readable Parquet file (corrupt or truncated: "
                            f"{e})") from None
    names = pf.schema_arrow.names
    md = pf.metadata
    declared = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    why = limits.expansion(declared, src.size, archive=False)
    if why:
        raise DocumentError(f"{src.name}: refused before reading: its row groups declare "
                            f"{why} (recursa.documents.limits)")
    info.meta.update(rows=md.num_rows, schema=str(pf.schema_arrow))

    def rows() -> Iterator[list[Any]]:
        yield names
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS):
                cols = [c.to_pylist() for c in batch.columns]
                yield from zip(*cols, strict=True)
        except Exception as e:
            raise DocumentError(f"{src.name}: a Parquet row group cannot be read: {e}") from None
    meta: dict[str, Any] = {}
    yield Piece("table", src.name, delimited(rows(), meta, max_chars=info.max_chars), meta)
