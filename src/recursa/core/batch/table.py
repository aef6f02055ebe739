"""A batch's typed answers as a table: one row per item, one column per schema field, written
as CSV or Parquet from the JSONL rows (which stay the durable, resumable record)."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from recursa.base.extras import MissingExtra

TABLE_FORMATS = (".csv", ".parquet")
META_COLUMNS = ("key", "source")
TAIL_COLUMNS = ("status", "error", "cost_usd", "tokens")


def require_pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtra("batch", "Parquet files", module="pyarrow", detail=str(exc)) from None
    return pq


def schema_fields(schema: dict[str, Any] | None) -> list[str]:
    """The top-level fields of an object schema (the table's columns); [] for other schemas."""
    props = (schema or {}).get("properties")
    return list(props) if isinstance(props, dict) else []


def table_rows(rows: Iterable[dict[str, Any]], fields: list[str],
               extra: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Flat records in item order: key, source, `extra` columns, the fields, status..."""
    out = []
    for r in sorted(rows, key=lambda r: r.get("index", 0)):
        parsed = r.get("parsed")
        rec: dict[str, Any] = {c: r.get(c) for c in (*META_COLUMNS, *extra)}
        if fields:
            for f in fields:
                rec[f] = parsed.get(f) if isinstance(parsed, dict) else None
        else:
            rec["answer"] = parsed if parsed is not None else r.get("answer")
        rec.update({c: r.get(c) for c in TAIL_COLUMNS})
        out.append(rec)
    return out


def _flat(v: Any) -> Any:
    return json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else v


def write_table(records: list[dict[str, Any]], path: str | Path) -> None:
    """CSV or Parquet by suffix, written to a temporary file and renamed (never half a table)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_FORMATS:
        raise ValueError(f"{path}: a table is .csv or .parquet")
    tmp = path.with_name(path.name + ".tmp")
    columns = list(records[0]) if records else list(META_COLUMNS)
    if suffix == ".csv":
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            for rec in records:
                w.writerow({k: _flat(v) for k, v in rec.items()})
    else:
        pq = require_pyarrow()
        import pyarrow as pa
        try:
            table = pa.Table.from_pylist(records)
        except (pa.ArrowInvalid, pa.ArrowTypeError):   # mixed types in a column: JSON text
            table = pa.Table.from_pylist([{k: _flat(v) for k, v in r.items()}
                                          for r in records])
        pq.write_table(table, tmp)
    os.chmod(tmp, 0o600)     # answers may quote the documents: owner-only, as the rows file
    os.replace(tmp, path)
