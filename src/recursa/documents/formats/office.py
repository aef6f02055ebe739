"""Word (python-docx: sections at headings, tables as TSV), PowerPoint (python-pptx: one part
a slide, with its title, tables and speaker notes) and Excel (openpyxl, read-only and
streaming: one part a sheet, as TSV)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

from recursa.documents.build import Extraction, Piece, TextOverLimit
from recursa.documents.errors import DocumentError, need
from recursa.documents.formats.archive import check_container
from recursa.documents.formats.tables import cell, delimited
from recursa.documents.source import Source


def _file(src: Source) -> Any:
    return str(src.path) if src.path is not None else io.BytesIO(src.data or b"")


def _bad(src: Source, what: str, e: Exception) -> DocumentError:
    return DocumentError(f"{src.name}: not a readable {what} file (corrupt or truncated: "
                         f"{type(e).__name__}: {e})")


def _tsv(rows: list[list[str]]) -> str:
    return "\n".join("\t".join(c.replace("\t", " ").replace("\n", " ") for c in r) for r in rows)


def _budget(max_chars: int) -> Callable[[int], None]:
    """take(n): TextOverLimit once more than `max_chars` characters were taken (0: no cap)."""
    left = max_chars or float("inf")

    def take(n: int) -> None:
        nonlocal left
        left -= n
        if left < 0:
            raise TextOverLimit
    return take


def _docx_table(table: Any, take: Callable[[int], None]) -> str:
    """A Word table as TSV. A merged cell is repeated in each column it spans (python-docx gives
    the same cell object for each): its text is made once, and each copy is charged to the
    document's budget, so a row spanning a million columns is refused, not written out."""
    made: dict[Any, str] = {}
    rows = []
    for row in table.rows:
        cells = []
        for c in row.cells:
            text = made.get(c)
            if text is None:
                text = made[c] = c.text.replace("\t", " ").replace("\n", " ")
            take(len(text) + 1)
            cells.append(text)
        rows.append("\t".join(cells))
    return "\n".join(rows)


def extract_docx(src: Source, info: Extraction) -> Iterator[Piece]:
    try:
        import docx
        from docx.enum.style import WD_STYLE_TYPE
        from docx.oxml.text.paragraph import CT_P
        from docx.table import Table
    except ImportError:
        raise need("python-docx", "Word (.docx)", src.name) from None
    check_container(src)
    try:
        d = docx.Document(_file(src))
    except Exception as e:   # each library has its own errors for a non-zip / broken part
        raise _bad(src, "Word (.docx)", e) from None
    props = d.core_properties
    info.meta.update({k: v for k, v in (("title", props.title), ("author", props.author)) if v})
    # Style names looked up once: python-docx's `paragraph.style` searches every style for
    # each paragraph (a 20,000-paragraph file took 30 s)
    default = d.styles.default(WD_STYLE_TYPE.PARAGRAPH)
    default_name = (default.name or "") if default is not None else ""
    names = {s.style_id: s.name or "" for s in d.styles}
    take = _budget(info.max_chars)
    name, lines = "", []
    for el in d.element.body.inner_content_elements:   # paragraphs and tables, in order
        if not isinstance(el, CT_P):
            lines.append(_docx_table(Table(el, d), take))
            continue
        text = el.text
        take(len(text) + 1)
        style = names.get(el.style, default_name) if el.style else default_name
        if style.startswith(("Heading", "Title")) and text.strip():
            if lines:
                yield Piece("section", name, "\n".join(lines))
            name, lines = text.strip(), []
        if text.strip():
            lines.append(text)
    if lines or not name:
        yield Piece("section", name, "\n".join(lines))


def _shape_text(shape: Any) -> list[str]:
    out: list[str] = []
    if getattr(shape, "has_text_frame", False) and shape.text_frame.text.strip():
        out.append(shape.text_frame.text)
    if getattr(shape, "has_table", False):
        out.append(_tsv([[c.text for c in row.cells] for row in shape.table.rows]))
    for sub in getattr(shape, "shapes", ()):   # group shapes
        out += _shape_text(sub)
    return out


def extract_pptx(src: Source, info: Extraction) -> Iterator[Piece]:
    try:
        import pptx
    except ImportError:
        raise need("python-pptx", "PowerPoint (.pptx)", src.name) from None
    check_container(src)
    try:
        prs = pptx.Presentation(_file(src))
    except Exception as e:   # each library has its own errors for a non-zip / broken part
        raise _bad(src, "PowerPoint (.pptx)", e) from None
    for i, slide in enumerate(prs.slides, 1):
        title_shape = slide.shapes.title
        title = title_shape.text.strip() if title_shape is not None else ""
        texts: list[str] = []
        for shape in slide.shapes:
            texts += _shape_text(shape)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                texts.append("Notes: " + notes.text)
        yield Piece("slide", title, "\n".join(texts),
                    header=f"[slide {i}" + (f": {title}]" if title else "]"))


def extract_xlsx(src: Source, info: Extraction) -> Iterator[Piece]:
    try:
        import openpyxl
    except ImportError:
        raise need("openpyxl", "Excel (.xlsx)", src.name) from None
    check_container(src)
    try:
        wb = openpyxl.load_workbook(_file(src), read_only=True, data_only=True)
    except Exception as e:   # each library has its own errors for a non-zip / broken part
        raise _bad(src, "Excel (.xlsx)", e) from None
    try:
        for ws in wb.worksheets:
            meta: dict[str, Any] = {}

            def rows(ws: Any = ws) -> Iterator[list[str]]:
                for row in ws.iter_rows(values_only=True):
                    cells = [cell(v) for v in row]
                    while cells and not cells[-1]:
                        cells.pop()
                    if cells:
                        yield cells
            yield Piece("sheet", ws.title, delimited(rows(), meta, max_chars=info.max_chars), meta,
                        header=f"[sheet {ws.title}]")
    finally:
        wb.close()
