"""PDF: text per page with PDFium (pypdfium2); a page without a text layer is named in a note."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from recursa.documents.build import Extraction, Piece
from recursa.documents.errors import DocumentError, need
from recursa.documents.source import Source

# PDFium is not thread-safe: every call into it (open, each page, close) holds this lock.
_LOCK = threading.Lock()


def _open(src: Source) -> Any:
    try:
        import pypdfium2 as pdfium
    except ImportError:
        raise need("pypdfium2", "PDF", src.name) from None
    try:
        with _LOCK:
            return pdfium.PdfDocument(src.path if src.path is not None else src.data)
    except pdfium.PdfiumError as e:
        msg = str(e)
        if "password" in msg.lower():
            raise DocumentError(f"{src.name}: the PDF is encrypted (it needs a password); "
                                "give a decrypted copy") from None
        raise DocumentError(f"{src.name}: not a readable PDF (corrupt or truncated: "
                            f"{msg})") from None


def _page(pdf: Any, i: int) -> tuple[str, int]:
    """(text, number of image objects) of page i."""
    import pypdfium2.raw as pdfium_c
    with _LOCK:
        page = pdf[i]
        try:
            tp = page.get_textpage()
            try:
                text = tp.get_text_range()
            finally:
                tp.close()
            n_img = 0
            if not text.strip():
                n_img = sum(1 for _ in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]))
        finally:
            page.close()
    # PDFium ends lines with \r\n
    return text.replace("\r\n", "\n").replace("\r", "\n"), n_img


def extract(src: Source, info: Extraction) -> Iterator[Piece]:
    pdf = _open(src)
    try:
        with _LOCK:
            n = len(pdf)
            try:
                meta = {k: v for k, v in pdf.get_metadata_dict(skip_empty=True).items()
                        if k in ("Title", "Author", "Subject", "CreationDate")}
            except Exception:   # metadata is a nicety; a broken info dict must not fail the file
                meta = {}
        info.meta.update({k.lower(): v for k, v in meta.items()}, pages=n)
        scanned: list[int] = []
        blank: list[int] = []
        for i in range(n):
            text, n_img = _page(pdf, i)
            if not text.strip():
                (scanned if n_img else blank).append(i + 1)
            yield Piece("page", "", text, {"no_text": True} if not text.strip() else {},
                        header=f"[page {i + 1}]")
        if n and len(scanned) + len(blank) == n:
            raise DocumentError(f"{src.name}: none of its {n} page(s) has a text layer "
                                "(a scanned document? OCR it first)")
        if scanned:
            info.notes.append(f"{src.name}: {len(scanned)} page(s) have no text layer, only "
                              f"images (scanned? OCR them to read them): pages {_ranges(scanned)}")
        if blank:
            info.notes.append(f"{src.name}: {len(blank)} page(s) have no text at all: "
                              f"pages {_ranges(blank)}")
    finally:
        with _LOCK:
            pdf.close()


def _ranges(nums: list[int], limit: int = 12) -> str:
    out: list[str] = []
    i = 0
    while i < len(nums) and len(out) < limit:
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out) + (" ..." if i < len(nums) else "")
