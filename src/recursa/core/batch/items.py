"""What a batch runs: items of (query, context), with a stable key each (what resume matches).

Three ways in:
- pairs: `(query, context)` tuples, dicts with "query" / "context" (and an optional "key"),
  or BatchItem objects;
- one query over many contexts: `expand_contexts(...)` turns paths, a directory (one item per
  file) or a JSONL / CSV / Parquet file (one item per row, the context in `column`) into
  contexts;
- many queries over one corpus: pairs that share the context (`[(q, corpus) for q in qs]`).

A file's text is read by recursa.core.context.load_path, the one loader `recursa run` uses, so a
loader added there (PDF, DOCX, ...) serves batches too.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa.base.types import ContextError
from recursa.core.context import load_inner_paths, load_path

TABLE_SUFFIXES = (".jsonl", ".csv", ".parquet")
CONTEXT_COLUMNS = ("context", "text", "document", "content", "body")   # tried in this order


@dataclass
class BatchItem:
    query: str
    context: Any                   # a value, or a Path read where the item runs
    key: str = ""                  # stable identity (resume); made from query + source if empty
    source: str | None = None      # where the context came from (file, file:row), for rows
    index: int = 0                 # position in the batch
    fields: dict[str, Any] = field(default_factory=dict)   # carried into the item's row


def _digest(text: str, n: int = 12) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def item_key(query: str, source: str | None, context: Any) -> str:
    """query digest | source (a path, file:row) or, for an in-memory context, its digest."""
    if source is None:
        if isinstance(context, os.PathLike):
            source = str(context)
        else:
            text = context if isinstance(context, str) else json.dumps(context, default=str,
                                                                       sort_keys=True)
            source = "sha:" + _digest(text)
    return f"{_digest(query)}|{source}"


def make_items(items: Iterable[Any] | None = None, *, query: str | None = None,
               contexts: Any = None, column: str | None = None,
               query_column: str | None = None, id_column: str | None = None) -> list[BatchItem]:
    """The batch's items, in order, with unique keys; see the module docstring.
    `query` + `contexts`: one question over many contexts (expanded by expand_contexts)."""
    out: list[BatchItem] = []
    if contexts is not None:
        if items is not None:
            raise ValueError("give items (query, context pairs) or query + contexts, not both")
        for it in expand_contexts(contexts, column=column, query_column=query_column,
                                  id_column=id_column):
            q = it.query or query
            if not q:
                raise ValueError(f"{it.source}: no query (give query=, or a query column)")
            it.query = q
            out.append(it)
    elif items is not None:
        for x in items:
            out.append(_as_item(x, query))
    else:
        raise ValueError("nothing to run: give items, or query and contexts")
    seen: set[str] = set()
    for i, it in enumerate(out):
        if not isinstance(it.query, str) or not it.query.strip():
            raise ValueError(f"item {i}: the query must be a non-empty string")
        it.index = i
        it.key = it.key or item_key(it.query, it.source, it.context)
        if it.key in seen:
            raise ValueError(f"item {i}: key {it.key!r} appears twice (the same question over "
                             "the same context); give each item its own key")
        seen.add(it.key)
    return out


def _as_item(x: Any, query: str | None) -> BatchItem:
    if isinstance(x, BatchItem):
        return x
    if isinstance(x, dict) and "context" in x:
        return BatchItem(query=str(x.get("query") or query or ""), context=x["context"], key=str(x.get("key") or ""),
                         source=x.get("source"))
    if isinstance(x, tuple) and len(x) == 2:
        return BatchItem(query=x[0], context=x[1],
                         source=str(x[1]) if isinstance(x[1], os.PathLike) else None)
    if query is not None:       # a bare context with one query for all
        return BatchItem(query=query, context=x,
                         source=str(x) if isinstance(x, os.PathLike) else None)
    raise ValueError(f"a batch item is a (query, context) pair, a dict with 'context', or a "
                     f"BatchItem; got {type(x).__name__} (give query= for bare contexts)")


# ---------------------------------------------------------------- many contexts
def expand_contexts(contexts: Any, *, column: str | None = None, query_column: str | None = None,
                    id_column: str | None = None) -> Iterator[BatchItem]:
    """Items without a query yet (or with one from `query_column`): a directory gives one per
    file, a .jsonl / .csv / .parquet file of rows one per row, any other path one, a list
    each of its members (Paths expanded the same way, other values as they are)."""
    # a lone str names a path (as `recursa batch --contexts` gives it); in a list, str
    # members are texts and only Path members are read
    many = [Path(contexts)] if isinstance(contexts, str) else (
        contexts if isinstance(contexts, list | tuple) else [contexts])
    for c in many:
        if not isinstance(c, os.PathLike):
            yield BatchItem(query="", context=c)
            continue
        path = Path(c)
        if not path.exists():
            raise ContextError(f"context path does not exist: {path}")
        if path.is_dir():
            files = list(_files(path))
            if not files:
                raise ContextError(f"directory {path} holds no files")
            for f in files:
                yield BatchItem(query="", context=f, source=str(f))
        elif path.suffix.lower() in TABLE_SUFFIXES and (column or query_column or
                                                         path.suffix.lower() != ".jsonl"
                                                         or _looks_tabular(path)):
            yield from _table_items(path, column, query_column, id_column)
        else:
            yield BatchItem(query="", context=path, source=str(path))


def _files(root: Path) -> Iterator[Path]:
    """Every regular file under root that a folder context would take (sorted; hidden and tool
    directories and what .gitignore excludes are skipped)."""
    from recursa.documents.tree import walk
    for rel, p in walk(root):
        if not rel.rsplit("/", 1)[-1].startswith(".") and p.is_file() and not p.is_symlink():
            yield p


def _looks_tabular(path: Path) -> bool:
    """A .jsonl file whose first line is a JSON object: rows, not one text document."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def read_table(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL, CSV or Parquet file as dicts."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ContextError(f"{path}:{n}: not JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise ContextError(f"{path}:{n}: a row must be a JSON object")
                rows.append(row)
        return rows
    if suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    if suffix == ".parquet":
        from .table import require_pyarrow
        pq = require_pyarrow()
        return list(pq.read_table(path).to_pylist())
    raise ContextError(f"{path}: not a table (use .jsonl, .csv or .parquet)")


def _table_items(path: Path, column: str | None, query_column: str | None,
                 id_column: str | None) -> Iterator[BatchItem]:
    rows = read_table(path)
    if not rows:
        raise ContextError(f"{path} has no rows")
    names = list(rows[0])
    col = column or next((c for c in CONTEXT_COLUMNS if c in rows[0]), None)
    for want, what in ((col, "context column"), (query_column, "query column"),
                       (id_column, "id column")):
        if want is not None and want not in rows[0]:
            raise ContextError(f"{path}: no {what} {want!r}; its columns: {', '.join(names)}")
    if col is None:
        raise ContextError(f"{path}: which column holds the context? name it (column= / "
                           f"--column); its columns: {', '.join(names)}")
    for n, row in enumerate(rows):
        rid = str(row[id_column]) if id_column else str(n)
        q = row.get(query_column) if query_column else None
        yield BatchItem(query=str(q) if q is not None else "", context=row[col],
                        source=f"{path}:{rid}",
                        fields={id_column: row[id_column]} if id_column else {})


def load_item_context(context: Any) -> Any:
    """An item's context as a value: a path, also one inside a dict or list (several
    `--context` files), is read with recursa.core.context.load_path (the loader of `recursa
    run`); what is sent to a Ray worker on another machine."""
    if isinstance(context, os.PathLike):
        value, _notes = load_path(Path(context))
        return value
    if isinstance(context, dict | list | tuple):
        return load_inner_paths(context)
    return context
