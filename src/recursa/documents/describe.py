"""What the root model is told about documents in its context: kind, size, the parts it can
index (pages, slides, sheets, ...) with their names, tables' columns and rows, and problems."""

from __future__ import annotations

from collections import Counter
from typing import Any

from recursa.documents.build import DocStats
from recursa.documents.load import LABELS
from recursa.documents.model import Document

PLURAL = {"page": "pages", "slide": "slides", "sheet": "sheets", "section": "sections",
          "chapter": "chapters", "table": "tables"}


HEADERS = {"page": "'[page 3]'", "slide": "'[slide 2: its title]'", "sheet": "'[sheet NAME]'",
           "chapter": "'[chapter 4: its title]'", "table": "'[table NAME]'"}


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def _table_line(var: str, meta: dict[str, Any], name: str) -> str:
    cols = meta.get("columns") or []
    shown = ", ".join(repr(c) for c in cols[:12]) + (", ..." if len(cols) > 12 else "")
    rows = meta.get("rows")
    kind = "JSON values" if meta.get("format") == "jsonl" else "lists of str"
    return (f"{name}: {f'{rows:,}' if rows is not None else '?'} rows ({kind}) in {var}.rows, "
            f"dicts in {var}.records; columns [{shown}]")


def doc_lines(s: DocStats, var: str = "context") -> list[str]:
    """Lines describing one document bound to `var` (e.g. context or context['a/b.pdf'])."""
    label = LABELS.get(s.kind, s.kind)
    article = "an" if label[0] in "AEIOU" else "a"
    lines = [f"{var}: {article} {label} document {s.name!r} as a Document: a str holding its whole "
             f"text ({s.chars:,} characters, ~{_tokens(s.chars):,} tokens, {s.lines:,} lines)"
             + (f"; title {s.meta['title']!r}" if s.meta.get("title") else "")]
    kinds = s.part_kinds()
    tables = [p for p in s.parts if p[4].get("format")]
    if len(tables) == 1 and len(s.parts) == 1:
        lines.append(_table_line(var, tables[0][4], "table"))
        return lines
    if kinds:
        main, n = kinds.most_common(1)[0]
        plural = PLURAL.get(main, main + "s")
        lines.append(
            f"{var}.{plural} (also .parts): a list of {len(s.parts):,} {plural}, each a str "
            f"with .number (1-based), .name, .start/.end (offsets in {var}); sizes "
            f"{s.spread()}" + (f"; in the text each starts after a line like {HEADERS[main]}"
                               if main in HEADERS else ""))
        named = [(p[1], p[2]) for p in s.parts if p[2]]
        if named and main != "page":
            shown = "; ".join(f"{no}: {nm[:60]!r}" for no, nm in named[:12])
            lines.append(f"{plural} by name: {shown}" + (" ..." if len(named) > 12 else ""))
        for kind, no, name, _, meta in tables[:8]:
            lines.append(_table_line(f"{var}.parts[{no - 1}]", meta, f"{kind} {name!r}")
                         + (f"; schema: {meta['schema']}" if meta.get("schema") else ""))
        if len(tables) > 8:
            lines.append(f"... and {len(tables) - 8} more tables")
    if s.meta.get("views"):
        lines.append("views (schema only): " + "; ".join(s.meta["views"].values()))
    return lines


def describe_document(s: DocStats) -> list[str]:
    preview = s.preview
    more = len(preview) > 400
    return [*doc_lines(s), f"preview: {preview[:400]!r}" + (" ..." if more else "")]


def documents_in(value: Any) -> list[tuple[str, Document]]:
    """(where, Document) for each Document in a list/dict context, in order."""
    out: list[tuple[str, Document]] = []

    def walk(v: Any, where: str) -> None:
        if isinstance(v, Document):
            out.append((where, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}[{k!r}]")
        elif isinstance(v, list | tuple):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")
    walk(value, "context")
    return out


def describe_collection(value: Any, limit: int = 10) -> list[str]:
    """Lines for the Documents inside a list/dict context (a folder, an archive)."""
    docs = documents_in(value)
    if not docs:
        return []
    kinds = Counter(LABELS.get(d.kind, d.kind) for _, d in docs)
    lines = [f"documents: {len(docs)} ({', '.join(f'{n} {k}' for k, n in kinds.items())}); "
             "each is a Document: a str (its whole text) with .name, .kind and .parts (its "
             "pages / slides / sheets / sections / chapters / tables, each a str with .number "
             "and .name; tables also .rows, .records, .columns)"]
    for where, d in docs[:limit]:
        s = DocStats.of(d)
        counts = ", ".join(f"{n:,} {PLURAL.get(k, k + 's') if n > 1 else k}"
                           for k, n in s.part_kinds().items())
        tables = [p for p in s.parts if p[4].get("format")]
        rows = sum(int(p[4].get("rows") or 0) for p in tables)
        lines.append(f"  {where}: {LABELS.get(d.kind, d.kind)}, {len(d):,} chars, {counts}"
                     + (f", {rows:,} rows" if tables else ""))
    if len(docs) > limit:
        lines.append(f"  ... and {len(docs) - limit} more documents")
    return lines
