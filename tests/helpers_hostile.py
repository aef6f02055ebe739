"""Hostile documents, built at test time and small on disk: each one expands to gigabytes or
hangs a reader that trusts it (the reproductions of issue 35 and their relatives).

`measure_host` loads one in a fresh Python process, which then is the host: it reports how long
the load took, what came of it and how much that process's peak resident memory grew (the
confined parser is a child of it, not counted)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def sqlite_generated(path: Path, rows: int = 500, chars: int = 1_000_000) -> Path:
    """A few KB of SQLite whose generated column makes `chars` characters in every row as it
    is read (500 x 1M: a 500M-character table)."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, big TEXT GENERATED ALWAYS AS "
                f"(printf('%.*c', {chars}, 'x')) VIRTUAL)")
    con.executemany("INSERT INTO t(id) VALUES (?)", [(i,) for i in range(rows)])
    con.commit()
    con.close()
    return path


def sqlite_huge_value(path: Path) -> Path:
    """One generated value of 500M characters (a single printf)."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, big BLOB GENERATED ALWAYS AS "
                "(zeroblob(500000000)) VIRTUAL)")
    con.execute("INSERT INTO t(id) VALUES (1)")
    con.commit()
    con.close()
    return path


_XLSX_PARTS = {
    "[Content_Types].xml": (
        '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
        'package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.'
        'openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="'
        'application/xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.'
        'openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/'
        'worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.'
        'spreadsheetml.worksheet+xml"/><Override PartName="/xl/sharedStrings.xml" ContentType='
        '"application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
        '</Types>'),
    "_rels/.rels": (
        '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.'
        'openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://'
        'schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target='
        '"xl/workbook.xml"/></Relationships>'),
    "xl/workbook.xml": (
        '<?xml version="1.0" encoding="UTF-8"?><workbook xmlns="http://schemas.openxmlformats.'
        'org/spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/'
        '2006/relationships"><sheets><sheet name="s" sheetId="1" r:id="rId1"/></sheets>'
        '</workbook>'),
    "xl/_rels/workbook.xml.rels": (
        '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.'
        'openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://'
        'schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target='
        '"worksheets/sheet1.xml"/><Relationship Id="rId2" Type="http://schemas.openxmlformats.'
        'org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
        '</Relationships>'),
}


def xlsx_shared_string(path: Path, chars: int = 1_000_000, cells: int = 300) -> Path:
    """A workbook of a few KB: one shared string of `chars` characters, used by `cells` cells
    (300 x 1M: a 300M-character sheet)."""
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rows = "".join(f'<row r="{i}"><c r="A{i}" t="s"><v>0</v></c></row>'
                   for i in range(1, cells + 1))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, xml in _XLSX_PARTS.items():
            z.writestr(name, xml)
        z.writestr("xl/worksheets/sheet1.xml",
                   f'<?xml version="1.0" encoding="UTF-8"?><worksheet {ns}><sheetData>{rows}'
                   '</sheetData></worksheet>')
        z.writestr("xl/sharedStrings.xml",
                   f'<?xml version="1.0" encoding="UTF-8"?><sst {ns} count="{cells}" '
                   f'uniqueCount="1"><si><t>{"a" * chars}</t></si></sst>')
    return path


def _plain_docx() -> bytes:
    import docx
    buf = io.BytesIO()
    d = docx.Document()
    d.add_paragraph("cover")
    d.save(buf)
    return buf.getvalue()


def docx_bomb(path: Path, xml_mb: int = 100) -> Path:
    """A real Word file whose word/document.xml is `xml_mb` MB of one-word paragraphs
    (about 1000x compressed: ~100 KB on disk)."""
    head = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://'
            'schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>')
    para = "<w:p><w:r><w:t>x</w:t></w:r></w:p>" * 1000
    with zipfile.ZipFile(io.BytesIO(_plain_docx())) as src, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for info in src.infolist():
            if info.filename != "word/document.xml":
                z.writestr(info, src.read(info))
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write(head.encode())
            block = para.encode()
            for _ in range(xml_mb * 1024 * 1024 // len(block)):
                f.write(block)
            f.write(b"</w:body></w:document>")
    return path


def docx_paragraphs(path: Path, n: int) -> Path:
    """A plain Word file of `n` short paragraphs (no bomb: about 10x compressed)."""
    head = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://'
            'schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>')
    body = "".join(f"<w:p><w:r><w:t>paragraph {i} of a long report</w:t></w:r></w:p>"
                   for i in range(n))
    with zipfile.ZipFile(io.BytesIO(_plain_docx())) as src, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info, head + body + "</w:body></w:document>"
                       if info.filename == "word/document.xml" else src.read(info))
    return path


def docx_wide_table(path: Path, cells_text: int = 1000, span: int = 20_000, rows: int = 200
                    ) -> Path:
    """A Word file of a few KB whose table repeats one merged cell of `cells_text` characters
    over `span` columns in each of `rows` rows: python-docx gives that cell once per column
    it spans (1000 x 20,000 x 200: 4G characters)."""
    body = ('<w:tbl><w:tblGrid><w:gridCol/></w:tblGrid>' +
            (f'<w:tr><w:tc><w:tcPr><w:gridSpan w:val="{span}"/></w:tcPr><w:p><w:r><w:t>'
             f'{"y" * cells_text}</w:t></w:r></w:p></w:tc></w:tr>') * rows + '</w:tbl>')
    xml = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://'
           'schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
           f'{body}</w:body></w:document>')
    with zipfile.ZipFile(io.BytesIO(_plain_docx())) as src, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for info in src.infolist():
            z.writestr(info, xml if info.filename == "word/document.xml" else src.read(info))
    return path


def tar_gz_bomb(path: Path, members: int = 3, mb: int = 200) -> Path:
    """A .tar.gz of ~200 KB a member, each member `mb` MB of text (one letter repeated): under
    the limits of one member and of the archive's total, 1000 times its compressed size."""
    with tarfile.open(path, "w:gz", compresslevel=6) as tf:
        for i in range(members):
            info = tarfile.TarInfo(f"part{i}.txt")
            info.size = mb * 1024 * 1024
            tf.addfile(info, _Letters(info.size))
    return path


class _Letters(io.RawIOBase):
    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.left)
        b[:n] = b"a" * n
        self.left -= n
        return n


def folder_gitignore_dev_zero(root: Path) -> Path:
    """A folder whose .gitignore is a symlink to /dev/zero (an endless read)."""
    root.mkdir(parents=True)
    (root / "a.txt").write_text("kept text")
    os.symlink("/dev/zero", root / ".gitignore")
    return root


def folder_with_fifos(root: Path) -> Path:
    """A folder holding FIFOs (a read of one waits forever), one of them its .gitignore, and a
    symlink to a file outside it."""
    root.mkdir(parents=True)
    (root / "a.txt").write_text("kept text")
    os.mkfifo(root / "pipe.txt")
    (root / "sub").mkdir()
    os.mkfifo(root / "sub" / ".gitignore")
    outside = root.parent / f"{root.name}-secret.txt"
    outside.write_text("outside the folder")
    os.symlink(outside, root / "link.txt")
    return root


# ------------------------------------------------------------------ the host, measured
HOST = r"""
import json, os, resource, sys, time
from pathlib import Path
how, target = sys.argv[1], sys.argv[2]
from recursa.core import context as ctx
from recursa.documents import load
out = {}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.monotonic()
try:
    if how == "load":
        v = load(Path(target))
    elif how == "prepare":
        v = ctx.prepare(Path(target), Path(sys.argv[3]))
    else:
        v = ctx.prepare([Path(target)], Path(sys.argv[3]))
    out["ok"] = True
    out["chars"] = v.chars if how != "load" else len(v)
    out["notes"] = list(getattr(v, "notes", []) or [])
    out["description"] = getattr(v, "description", "")
except Exception as e:
    out["ok"] = False
    out["error"] = f"{type(e).__name__}: {e}"
out["seconds"] = time.monotonic() - t
out["rss_growth_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(out))
"""


def measure_host(how: str, target: Path, workdir: Path | None = None, *, timeout: float = 90,
                 memory_gb: int = 4, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Load `target` (how: "load", "prepare", or "inner" for a path inside a list context) in
    a fresh host process capped at `memory_gb` of address space and `timeout` seconds (so that
    a reader without bounds fails the test instead of taking the machine)."""
    import resource

    def cap() -> None:
        lim = memory_gb * 1024**3
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    args = [sys.executable, "-c", HOST, how, str(target)] + ([str(workdir)] if workdir else [])
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                           preexec_fn=cap, env={**os.environ, **(env or {})}, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout} s", "seconds": timeout,
                "rss_growth_mb": float("nan")}
    if p.returncode != 0 or not p.stdout.strip():
        return {"ok": False, "error": f"host died ({p.returncode}): {p.stderr[-800:]}",
                "seconds": float("nan"), "rss_growth_mb": float("nan")}
    got: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return got
