"""HTML (selectolax: the main text, not the markup, in sections at its headings), EPUB (ebooklib:
one part a chapter of the reading order) and Markdown (its own text, sections at its headings,
found by markdown-it, which rich already brings)."""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from typing import Any

from recursa.documents.build import Extraction, Piece
from recursa.documents.errors import DocumentError, need
from recursa.documents.formats.archive import check_container
from recursa.documents.source import Source

DROP = "script, style, noscript, template, svg, iframe, object, canvas, nav, aside, form, button"
BLOCKS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "table", "tr", "section",
          "article", "main", "header", "footer", "blockquote", "pre", "figure", "figcaption",
          "h1", "h2", "h3", "h4", "h5", "h6", "hr", "address", "details", "summary", "body"}
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
_WS = re.compile(r"[ \t\r\n\f\v]+")


def _parser(name: str) -> Any:
    try:
        from selectolax.lexbor import LexborHTMLParser
    except ImportError:
        raise need("selectolax", "HTML and EPUB", name) from None
    return LexborHTMLParser


def html_sections(html: str, name: str) -> tuple[str, list[tuple[str, str]]]:
    """(title, [(heading, text)]) of an HTML page: its main element (or body) without scripts,
    navigation and forms, one line per block; a section starts at each heading."""
    tree = _parser(name)(html)
    title_node = tree.css_first("title")
    title = title_node.text(strip=True) if title_node is not None else ""
    for node in tree.css(DROP):
        node.decompose()
    mains = tree.css("main, [role=main]") or tree.css("article")
    root = mains[0] if len(mains) == 1 else (tree.body or tree.root)
    sections: list[tuple[str, str]] = []
    heading = ""
    lines: list[str] = []
    line: list[str] = []
    if root is None:
        return title, []

    def flush_line() -> None:
        text = _WS.sub(" ", "".join(line)).strip()
        if text:
            lines.append(text)
        line.clear()
    for node in root.traverse(include_text=True):
        tag = node.tag
        if tag == "-text":
            line.append(node.text_content or "")
        elif tag in HEADINGS:
            flush_line()
            if lines:
                sections.append((heading, "\n".join(lines)))
            heading, lines = _WS.sub(" ", node.text(deep=True)).strip(), []
        elif tag in ("td", "th"):
            line.append("\t")
        elif tag in BLOCKS:
            flush_line()
    flush_line()
    if lines or not sections:
        sections.append((heading, "\n".join(lines)))
    return title, sections


def _decode(src: Source, info: Extraction) -> str:
    with src.open() as f:
        data = f.read()
    text = data.decode("utf-8-sig", errors="replace")
    bad = text.count("\ufffd")
    if bad:
        info.notes.append(f"{src.name}: {bad} invalid UTF-8 bytes replaced by U+FFFD")
    return text


def extract_html(src: Source, info: Extraction) -> Iterator[Piece]:
    title, sections = html_sections(_decode(src, info), src.name)
    if title:
        info.meta["title"] = title
    for heading, text in sections:
        yield Piece("section", heading, text)


def extract_markdown(src: Source, info: Extraction) -> Iterator[Piece]:
    from markdown_it import MarkdownIt
    text = _decode(src, info)
    lines = text.splitlines(keepends=True)
    tokens = MarkdownIt("commonmark").parse(text)
    heads = [(t.map[0], tokens[i + 1].content.strip()) for i, t in enumerate(tokens)
             if t.type == "heading_open" and t.map and t.level == 0]
    starts = [0] + [ln for ln, _ in heads if ln > 0]
    names = ([""] if not heads or heads[0][0] > 0 else []) + [h for _, h in heads]
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else len(lines)
        body = "".join(lines[s:e])
        yield Piece("section", names[i], body.rstrip("\n") if i + 1 < len(starts) else body)


def _toc_titles(toc: Any, out: dict[str, str]) -> None:
    for entry in toc:
        if isinstance(entry, tuple | list):        # (Section, [children])
            sec, children = entry[0], entry[1]
            if getattr(sec, "href", None):
                out.setdefault(sec.href.split("#")[0], sec.title)
            _toc_titles(children, out)
        elif getattr(entry, "href", None):
            out.setdefault(entry.href.split("#")[0], entry.title)


def extract_epub(src: Source, info: Extraction) -> Iterator[Piece]:
    try:
        from ebooklib import epub
    except ImportError:
        raise need("ebooklib", "EPUB", src.name) from None
    _parser(src.name)
    check_container(src)
    try:
        book = epub.read_epub(str(src.path) if src.path is not None
                              else io.BytesIO(src.data or b""), options={"ignore_ncx": True})
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, epub.EpubException) as e:
        raise DocumentError(f"{src.name}: not a readable EPUB file (corrupt or truncated: "
                            f"{type(e).__name__}: {e})") from None
    for key, label in (("title", "title"), ("creator", "author")):
        got = book.get_metadata("DC", key)
        if got:
            info.meta[label] = got[0][0]
    titles: dict[str, str] = {}
    _toc_titles(book.toc, titles)
    n = 0
    read: dict[str, tuple[str, str]] = {}   # a spine may list one item many times: read once
    for idref, _linear in book.spine:
        if idref not in read:
            item = book.get_item_with_id(idref)
            if item is None:
                continue
            html = item.get_content().decode("utf-8", errors="replace")
            _, sections = html_sections(html, src.name)
            read[idref] = ("\n\n".join(t for _, t in sections if t).strip(),
                           titles.get(item.get_name(), "") or
                           (sections[0][0] if sections else ""))
        text, title = read[idref]
        if not text:
            continue
        n += 1
        yield Piece("chapter", title, text,
                    header=f"[chapter {n}" + (f": {title}]" if title else "]"))
