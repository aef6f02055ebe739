"""Real test documents, built offline from the real text of the bench's corpora: one file per
format recursa reads, plus the bad ones (a scanned-looking page, an encrypted PDF, truncated
files, a zip bomb). Each builder uses the format's own writer library (fpdf2 for PDF)."""

from __future__ import annotations

import io
import json
import sqlite3
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from recursa.bench.corpora import get_corpus


@dataclass
class Texts:
    """Paragraphs of real text (latin-1 safe, for PDF core fonts) and their titles."""

    paras: list[str]
    titles: list[str]
    needle: str = ""          # a sentence that is in exactly one place of each document
    extra: dict[str, str] = field(default_factory=dict)


def texts(n: int = 12) -> Texts:
    c = get_corpus()
    paras, titles = [], []
    for i, p in enumerate(c.paragraphs):
        if 300 <= len(p) <= 1200 and p.isascii():
            paras.append(p)
            titles.append((c.titles[i] if c.titles else f"Part {len(paras)}")[:60])
            if len(paras) == n:
                break
    first = paras[5].split(". ")[0]
    return Texts(paras, titles, needle=first)


def pdf(path: Path, t: Texts, pages: int = 4, scanned_page: int | None = None,
        password: str | None = None) -> Path:
    from fpdf import FPDF
    doc = FPDF()
    doc.set_font("Helvetica", size=11)
    for i in range(pages):
        doc.add_page()
        if scanned_page is not None and i + 1 == scanned_page:
            from PIL import Image, ImageDraw
            img = Image.new("L", (400, 200), 255)
            ImageDraw.Draw(img).text((10, 90), "scanned text without a text layer", fill=0)
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            doc.image(buf, x=20, y=20, w=160)
            continue
        for text in (t.titles[i % len(t.titles)], t.paras[i % len(t.paras)],
                     t.paras[5] if i == 1 else t.paras[(i + 7) % len(t.paras)]):
            doc.multi_cell(0, 6, text, new_x="LMARGIN", new_y="NEXT")
    if password:
        doc.set_encryption(owner_password="owner-" + password, user_password=password)
    doc.output(str(path))
    return path


def docx(path: Path, t: Texts) -> Path:
    import docx as d
    doc = d.Document()
    doc.core_properties.title = "Corpus notes"
    doc.add_paragraph(t.paras[0])
    for i in (1, 5):
        doc.add_heading(t.titles[i], level=1)
        doc.add_paragraph(t.paras[i])
    table = doc.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "title", "length"
    table.cell(1, 0).text, table.cell(1, 1).text = t.titles[5], str(len(t.paras[5]))
    doc.save(str(path))
    return path


def pptx(path: Path, t: Texts) -> Path:
    from pptx import Presentation
    prs = Presentation()
    for i in (2, 5, 3):
        slide = prs.slides.add_slide(prs.slide_layouts[1])
        slide.shapes.title.text = t.titles[i]
        slide.placeholders[1].text = t.paras[i]
        slide.notes_slide.notes_text_frame.text = f"speaker notes for {t.titles[i]}"
    prs.save(str(path))
    return path


def rows(t: Texts) -> list[list[str | int]]:
    return [[i + 1, t.titles[i], len(t.paras[i]), t.paras[i][:80]] for i in range(len(t.paras))]


COLUMNS = ["id", "title", "chars", "opening"]


def xlsx(path: Path, t: Texts) -> Path:
    import openpyxl
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "articles"
    ws.append(COLUMNS)
    for r in rows(t):
        ws.append(r)
    ws2 = wb.create_sheet("summary")
    ws2.append(["count", "longest"])
    ws2.append([len(t.paras), max(len(p) for p in t.paras)])
    wb.save(str(path))
    return path


def epub(path: Path, t: Texts) -> Path:
    from ebooklib import epub as e
    book = e.EpubBook()
    book.set_identifier("recursa-test")
    book.set_title("A corpus reader")
    book.set_language("en")
    book.add_author("recursa tests")
    chapters = []
    for n, i in enumerate((4, 5), 1):
        ch = e.EpubHtml(title=t.titles[i], file_name=f"ch{n}.xhtml", lang="en")
        ch.content = f"<h1>{t.titles[i]}</h1><p>{t.paras[i]}</p><p>{t.paras[i + 1]}</p>"
        book.add_item(ch)
        chapters.append(ch)
    book.toc = chapters
    book.add_item(e.EpubNcx())
    book.add_item(e.EpubNav())
    book.spine = ["nav", *chapters]
    e.write_epub(str(path), book)
    return path


def html(path: Path, t: Texts) -> Path:
    path.write_text(
        "<!doctype html><html><head><title>Corpus page</title>"
        "<script>var tracking = 'do not show';</script><style>p{color:red}</style></head>"
        "<body><nav><a href='/'>Home</a> | <a href='/about'>About navigation</a></nav>"
        f"<main><h1>{t.titles[0]}</h1><p>{t.paras[0]}</p>"
        f"<h2>{t.titles[5]}</h2><p>{t.paras[5][:200]}<b>{t.paras[5][200:]}</b></p></main>"
        "<footer>copyright footer</footer></body></html>", encoding="utf-8")
    return path


def markdown(path: Path, t: Texts) -> Path:
    path.write_text(f"Intro line.\n\n# {t.titles[0]}\n\n{t.paras[0]}\n\n```\n# not a heading\n"
                    f"```\n\n## {t.titles[5]}\n\n{t.paras[5]}\n", encoding="utf-8")
    return path


def csv_file(path: Path, t: Texts, delimiter: str = ",") -> Path:
    import csv
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(COLUMNS)
        w.writerows(rows(t))
    return path


def jsonl(path: Path, t: Texts) -> Path:
    path.write_text("".join(json.dumps(dict(zip(COLUMNS, r, strict=True))) + "\n"
                            for r in rows(t)), encoding="utf-8")
    return path


def parquet(path: Path, t: Texts) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    cols = list(zip(*rows(t), strict=True))
    pq.write_table(pa.table({c: list(v) for c, v in zip(COLUMNS, cols, strict=True)}), path)
    return path


def sqlite(path: Path, t: Texts) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE articles (id INTEGER PRIMARY KEY, title TEXT, chars INTEGER, "
                "opening TEXT)")
    con.executemany("INSERT INTO articles VALUES (?, ?, ?, ?)", rows(t))
    con.execute("CREATE TABLE tags (article_id INTEGER REFERENCES articles(id), tag TEXT)")
    con.executemany("INSERT INTO tags VALUES (?, ?)", [(1, "first"), (6, "needle")])
    con.execute("CREATE VIEW long_ones AS SELECT title FROM articles WHERE chars > 600")
    con.commit()
    con.close()
    return path


def zip_of(path: Path, files: list[Path]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(f, f"inner/{f.name}")
    return path


def tar_of(path: Path, files: list[Path]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for f in files:
            tf.add(f, arcname=f"inner/{f.name}")
    return path


def zip_bomb(path: Path, mb: int = 16) -> Path:
    """A real high-ratio zip: `mb` MB of zeros in one member (about 1000x compressed)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("zeros.txt", "w") as f:
        block = b"\0" * (1 << 20)
        for _ in range(mb):
            f.write(block)
    return path


def truncated(path: Path, source: Path) -> Path:
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def all_formats(d: Path, t: Texts) -> dict[str, Path]:
    """One file of every supported format under `d`, by format name."""
    d.mkdir(parents=True, exist_ok=True)
    return {
        "pdf": pdf(d / "report.pdf", t), "docx": docx(d / "notes.docx", t),
        "pptx": pptx(d / "deck.pptx", t), "xlsx": xlsx(d / "book.xlsx", t),
        "epub": epub(d / "reader.epub", t), "html": html(d / "page.html", t),
        "markdown": markdown(d / "readme.md", t), "csv": csv_file(d / "articles.csv", t),
        "tsv": csv_file(d / "articles.tsv", t, "\t"), "jsonl": jsonl(d / "articles.jsonl", t),
        "parquet": parquet(d / "articles.parquet", t), "sqlite": sqlite(d / "library.sqlite", t),
    }
