"""Documents as contexts (recursa.documents): real files of every format, built offline from the
bench corpora's text (tests/helpers_documents.py), read into Documents with their structure;
bad files (scanned page, encrypted, truncated, zip bomb, oversized, missing library) get clear
errors naming the file and lose nothing else."""

from __future__ import annotations

import base64
import json
import pickle
import re
import sys
import zipfile
from pathlib import Path

import pytest

import helpers_documents as h
from recursa import RLM
from recursa.core import context as ctx
from recursa.documents import Document, DocumentError, Location, MissingExtra, limits, load, locate
from recursa.documents.model import revive, to_wire
from recursa.models.replay import ReplayClient


def flat(s: str) -> str:
    return " ".join(s.split())


@pytest.fixture(scope="module")
def t() -> h.Texts:
    return h.texts()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, t: h.Texts) -> dict[str, Path]:
    return h.all_formats(tmp_path_factory.mktemp("formats"), t)


# ------------------------------------------------------------------ every format
EXPECT = {   # format -> (part kind, number of parts)
    "pdf": ("page", 4), "docx": ("section", 3), "pptx": ("slide", 3), "xlsx": ("sheet", 2),
    "epub": ("chapter", 2), "html": ("section", 2), "markdown": ("section", 3),
    "csv": ("table", 1), "tsv": ("table", 1), "jsonl": ("table", 1), "parquet": ("table", 1),
    "sqlite": ("table", 2),
}


@pytest.mark.parametrize("fmt", sorted(EXPECT))
def test_every_format_loads_with_its_structure(fmt: str, files: dict[str, Path], t: h.Texts):
    doc = load(files[fmt])
    kind, n = EXPECT[fmt]
    assert isinstance(doc, Document) and isinstance(doc, str)
    assert doc.kind == fmt and doc.name == files[fmt].name
    assert [p.kind for p in doc.parts] == [kind] * n
    assert [p.number for p in doc.parts] == list(range(1, n + 1))
    for p in doc.parts:   # each part is the document's text between its offsets
        assert str(p) == doc[p.start:p.end] and p.doc == doc.name
    if kind in ("table", "sheet"):
        assert doc.parts[0].columns == h.COLUMNS
        rows = doc.parts[0].rows
        assert len(rows) == len(t.paras)
        assert doc.parts[0].records[5]["title"] == t.titles[5]
        if fmt != "jsonl":       # JSON Lines rows are the JSON objects themselves
            assert rows[5][1] == t.titles[5] and rows[5][2] == str(len(t.paras[5]))
    else:   # the text of paragraph 5 is in it (PDF and pptx wrap lines)
        assert flat(t.paras[5][:150]) in flat(doc)


def test_part_names_are_titles_sheets_and_headings(files: dict[str, Path], t: h.Texts):
    assert [p.name for p in load(files["pptx"]).slides] == [t.titles[i] for i in (2, 5, 3)]
    assert [p.name for p in load(files["xlsx"]).sheets] == ["articles", "summary"]
    assert [p.name for p in load(files["sqlite"]).tables] == ["articles", "tags"]
    assert [p.name for p in load(files["docx"]).sections] == ["", t.titles[1], t.titles[5]]
    assert [p.name for p in load(files["epub"]).chapters] == [t.titles[4], t.titles[5]]
    md = load(files["markdown"])
    assert [p.name for p in md.sections] == ["", t.titles[0], t.titles[5]]
    assert md == files["markdown"].read_text()          # Markdown keeps its own text
    assert "# not a heading" in md.sections[1]          # a fenced line is no heading
    assert load(files["csv"]) == files["csv"].read_bytes().decode()   # CSV too


def test_html_is_its_main_text_not_markup(files: dict[str, Path], t: h.Texts):
    doc = load(files["html"])
    assert "<" not in doc and "tracking" not in doc and "color:red" not in doc
    assert "About navigation" not in doc and "copyright footer" not in doc
    assert doc.meta["title"] == "Corpus page"
    # a <b> inside a paragraph does not break its line
    assert any(flat(t.paras[5]) == line for line in doc.sections[1].splitlines())


def test_sqlite_tables_carry_their_schema_and_views(files: dict[str, Path]):
    doc = load(files["sqlite"])
    assert doc.tables[1].schema.startswith("CREATE TABLE tags")
    assert doc.tables[1].records == [{"article_id": "1", "tag": "first"},
                                     {"article_id": "6", "tag": "needle"}]
    assert "long_ones" in doc.meta["views"]
    d = ctx.prepare(files["sqlite"], files["sqlite"].parent / "w-sqlite").description
    assert "schema: CREATE TABLE articles" in d and "views (schema only)" in d


def test_jsonl_rows_are_json_values(files: dict[str, Path], t: h.Texts):
    doc = load(files["jsonl"])
    assert doc.rows[5] == {"id": 6, "title": t.titles[5], "chars": len(t.paras[5]),
                           "opening": t.paras[5][:80]}
    assert doc.columns == h.COLUMNS


# ------------------------------------------------------------------ locations
def test_locate_gives_file_page_line_and_offsets(files: dict[str, Path], t: h.Texts):
    doc = load(files["pptx"])
    i = doc.index(t.paras[5][:40])
    loc = locate(doc, i, i + 40)
    assert isinstance(loc, Location)
    assert (loc.file, loc.unit, loc.number, loc.name) == ("deck.pptx", "slide", 2, t.titles[5])
    part = doc.slides[1]
    assert part[loc.start:loc.end] == t.paras[5][:40] == doc[loc.doc_start:loc.doc_end]
    assert loc.line == part.count("\n", 0, loc.start) + 1
    assert str(loc).startswith(f"deck.pptx, slide 2 ({t.titles[5]}), line ")
    # a folder context: the key is the file
    folder = {"a/deck.pptx": doc, "b.txt": "one\ntwo\nthree"}
    assert locate(folder, 4, 7, key="b.txt") == \
        Location("b.txt", None, None, None, 2, 4, 7, 4, 7, item=("b.txt",))
    sheet = load(files["xlsx"])
    j = sheet.index("count\tlongest")
    loc = locate(sheet, j, j + 5)
    assert (loc.unit, loc.number, loc.name, loc.line, loc.start) == ("sheet", 2, "summary", 1, 0)
    with pytest.raises(ValueError, match="outside the text"):
        locate(sheet, 0, len(sheet) + 1)


# ------------------------------------------------------------------ transfer
def test_documents_pickle_and_travel_as_json(files: dict[str, Path]):
    doc = load(files["xlsx"])
    back = pickle.loads(pickle.dumps(doc))
    assert type(back) is Document and back == doc and back.name == doc.name
    assert [p.name for p in back.parts] == ["articles", "summary"] and back.parts[0].rows
    part = pickle.loads(pickle.dumps(doc.parts[0]))
    assert part.rows == doc.parts[0].rows and part.name == "articles"
    wire = json.loads(json.dumps(to_wire({"x": doc})), object_hook=revive)
    assert wire["x"] == doc and wire["x"].parts[1].name == "summary"


def test_a_big_file_is_streamed_into_the_same_payload(files: dict[str, Path], tmp_path: Path):
    """prepare() writes a document file's payload as it reads it: the same JSON as the
    Document loaded whole."""
    for fmt in ("pdf", "csv", "xlsx", "sqlite"):
        prep = ctx.prepare(files[fmt], tmp_path / fmt)
        streamed = json.loads(Path(prep.payload.path).read_text())
        whole = to_wire(load(files[fmt]))
        assert streamed == json.loads(json.dumps(whole)), fmt
        assert prep.chars == len(whole["text"])


def test_descriptions_name_the_structure(files: dict[str, Path], tmp_path: Path, t: h.Texts):
    pdf = h.pdf(tmp_path / "scan.pdf", t, pages=4, scanned_page=3)
    d = ctx.prepare(pdf, tmp_path / "w").description
    assert "context.pages (also .parts): a list of 4 pages" in d
    assert "no text layer" in d and "pages 3" in d
    d = ctx.prepare(files["csv"], tmp_path / "w2").description
    assert f"{len(t.paras)} rows" in d and "context.rows" in d and "'title'" in d
    d = ctx.prepare(files["pdf"].parent, tmp_path / "w3").description
    assert "documents: 12" in d and "context['deck.pptx']: PowerPoint" in d


# ------------------------------------------------------------------ bad files
def test_scanned_page_is_reported_not_silently_empty(tmp_path: Path, t: h.Texts):
    doc = load(h.pdf(tmp_path / "scan.pdf", t, pages=4, scanned_page=3))
    assert doc.pages[2].strip() == "" and doc.pages[2].meta == {"no_text": True}
    assert any("no text layer" in n and "pages 3" in n for n in doc.notes)
    all_scanned = h.pdf(tmp_path / "all.pdf", t, pages=1, scanned_page=1)
    with pytest.raises(DocumentError, match=r"all.pdf: none of its 1 page\(s\) has a text layer"):
        load(all_scanned)


def test_encrypted_truncated_and_legacy_files_are_named(files: dict[str, Path], tmp_path: Path,
                                                        t: h.Texts):
    with pytest.raises(DocumentError, match=r"enc.pdf: the PDF is encrypted"):
        load(h.pdf(tmp_path / "enc.pdf", t, password="secret"))
    for fmt, what in (("pdf", "PDF"), ("docx", "Word"), ("pptx", "PowerPoint"),
                      ("xlsx", "Excel"), ("epub", "EPUB"), ("parquet", "Parquet"),
                      ("sqlite", "SQLite")):
        bad = h.truncated(tmp_path / f"cut-{files[fmt].name}", files[fmt])
        with pytest.raises(DocumentError, match=rf"cut-{re.escape(files[fmt].name)}: not a "
                                                rf"readable {what}.*(corrupt|truncated)"):
            load(bad)
    old = tmp_path / "old.doc"
    old.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 600)
    with pytest.raises(DocumentError, match="old.doc: an old binary Office file"):
        load(old)


def test_zip_bomb_is_refused_by_size_before_extraction(tmp_path: Path, monkeypatch):
    bomb = h.zip_bomb(tmp_path / "bomb.zip")
    with pytest.raises(DocumentError, match=r"bomb.zip: archive refused before extraction: "
                                            r"member 'zeros.txt' would unpack [\d,]+ times"):
        load(bomb)              # in the confined parser
    # in this process, to see that no member is opened
    monkeypatch.setenv("RECURSA_DOCUMENT_SANDBOX", "off")
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, *a, **k: opened.append(a) or real_open(self, *a, **k))
    with pytest.raises(DocumentError, match=r"bomb.zip: archive refused before extraction: "
                                            r"member 'zeros.txt' would unpack [\d,]+ times"):
        load(bomb)
    assert opened == []          # no member was decompressed
    # many members that each compress modestly, over the total: refused from the index too
    monkeypatch.setattr(limits, "MAX_ARCHIVE_BYTES", 1000)
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as z:
        for i in range(3):
            z.writestr(f"f{i}.txt", "x" * 500)
    opened.clear()
    with pytest.raises(DocumentError, match=r"many.zip: .* declare 0.0 MB uncompressed"):
        load(tmp_path / "many.zip")
    assert opened == []


def test_oversized_file_is_refused_naming_it(files: dict[str, Path], monkeypatch, tmp_path):
    monkeypatch.setattr(limits, "MAX_DOCUMENT_BYTES", 1000)
    with pytest.raises(DocumentError, match=r"report.pdf: .* over the 0.0 MB limit"):
        ctx.prepare(files["pdf"], tmp_path / "w")


def test_missing_library_names_the_docs_extra(files: dict[str, Path], monkeypatch, tmp_path):
    # a library hidden from this process: so the parse runs here, not in the confined parser
    monkeypatch.setenv("RECURSA_DOCUMENT_SANDBOX", "off")
    monkeypatch.setitem(sys.modules, "pypdfium2", None)
    with pytest.raises(MissingExtra, match=r"report.pdf: reading PDF files needs .*'pypdfium2'"
                                           r".*pip install 'recursa\[docs\]'"):
        load(files["pdf"])
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.txt").write_text("kept")
    (d / "r.pdf").write_bytes(files["pdf"].read_bytes())
    prep = ctx.prepare(d, tmp_path / "w")
    assert json.loads(Path(prep.payload.path).read_text()) == {"a.txt": "kept"}
    assert "recursa[docs]" in prep.description


# ------------------------------------------------------------------ archives and folders
def test_archives_of_documents(files: dict[str, Path], tmp_path: Path, t: h.Texts):
    enc = h.pdf(tmp_path / "locked.pdf", t, password="pw")
    members = [files["pdf"], files["docx"], files["csv"], enc]
    for arc in (h.zip_of(tmp_path / "bundle.zip", members),
                h.tar_of(tmp_path / "bundle.tar.gz", members)):
        got = load(arc)
        assert set(got) == {"inner/report.pdf", "inner/notes.docx", "inner/articles.csv"}
        assert got["inner/report.pdf"].kind == "pdf" and len(got["inner/report.pdf"].pages) == 4
        prep = ctx.prepare(arc, tmp_path / ("w-" + arc.name))
        assert any("inner/locked.pdf: skipped: the PDF is encrypted" in n for n in prep.notes)
        assert "documents: 3" in prep.description
        assert f"source: archive {arc.name}" in prep.description
        assert "dict with 3 files (relative path -> text)" in prep.description


def test_folder_honours_gitignore_skips_binaries_and_bad_files(files: dict[str, Path],
                                                                tmp_path: Path, t: h.Texts):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "docs").mkdir()
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (root / "docs" / ".gitignore").write_text("draft-*\n")
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / "build" / "out.txt").write_text("generated")
    (root / "run.log").write_text("noise")
    (root / "keep.log").write_text("kept log")
    (root / "docs" / "draft-1.md").write_text("# draft")
    (root / "docs" / "report.pdf").write_bytes(files["pdf"].read_bytes())
    (root / "docs" / "deck.pptx").write_bytes(files["pptx"].read_bytes())
    (root / "app.bin").write_bytes(b"\x7fELF\x00\x01" * 50)
    h.pdf(root / "docs" / "locked.pdf", t, password="pw")
    prep = ctx.prepare(root, tmp_path / "w")
    value = json.loads(Path(prep.payload.path).read_text(), object_hook=revive)
    assert set(value) == {"src/main.py", "keep.log", "docs/report.pdf", "docs/deck.pptx"}
    assert value["docs/report.pdf"].pages[1].number == 2
    assert "3 ignored by .gitignore" in prep.description
    assert "binary files skipped: app.bin" in prep.description
    assert "docs/locked.pdf: skipped: the PDF is encrypted" in prep.description


# ------------------------------------------------------------------ through the real sandbox
def _root(code: str):
    return lambda messages: f"```repl\n{code}\n```"


@pytest.mark.slow
def test_model_code_uses_pages_rows_and_names_in_the_sandbox(files: dict[str, Path],
                                                             t: h.Texts, tmp_path: Path):
    """The model's code in the real (bubblewrap) sandbox: a PDF path as context, a folder, and
    a Document object passed to RLM.completion."""
    code = ("p = context.pages[1]\n"
            "FINAL(f'{type(context).__name__}|{context.name}|{p.number}|{len(context.pages)}|'"
            " + str(p.start) + '|' + str(context.count(chr(10)) > 10))")
    res = RLM(model=ReplayClient(_root(code)), sandbox="local").completion(
        "q", context=files["pdf"])
    assert res.status == "final", res.error
    doc = load(files["pdf"])
    assert res.answer == f"Document|report.pdf|2|4|{doc.pages[1].start}|True"
    code = ("r = context['library.sqlite'].tables[0].records\n"
            "FINAL(r[5]['title'] + '|' + context['book.xlsx'].sheets[1].name + '|' + "
            "context['deck.pptx'].slides[1].name + '|' + str(len(context['articles.csv'].rows)))")
    res = RLM(model=ReplayClient(_root(code)), sandbox="local").completion(
        "q", context=files["pdf"].parent)
    assert res.status == "final", res.error
    assert res.answer == f"{t.titles[5]}|summary|{t.titles[5]}|{len(t.paras)}"
    code = "FINAL(context[1].kind + '|' + context[1].sections[2].name)"
    res = RLM(model=ReplayClient(_root(code)), sandbox="inprocess").completion(
        "q", context=[files["csv"], load(files["docx"])])
    assert res.status == "final", res.error
    assert res.answer == f"docx|{t.titles[5]}"


def test_cli_run_reads_a_pdf(files: dict[str, Path], tmp_path: Path):
    import subprocess
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["```repl\nFINAL(str(len(context.pages)) + ' pages')\n```"]))
    p = subprocess.run([sys.executable, "-m", "recursa.cli", "run", "How many pages?",
                        "--context", str(files["pdf"]), "--model", f"replay-file:{script}",
                        "--sandbox", "inprocess"], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "4 pages"
    p = subprocess.run([sys.executable, "-m", "recursa.cli", "run", "How many pages?",
                        "--context", "-", "--model", f"replay-file:{script}",
                        "--sandbox", "inprocess"], input=files["pdf"].read_bytes(),
                       capture_output=True, timeout=120)     # a PDF piped in
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "4 pages"


def test_server_reads_an_attached_pdf(files: dict[str, Path]):
    from recursa.core.config import RLMConfig
    from recursa.server.openai_app import RequestError, ServerConfig, parse_chat
    data = base64.b64encode(files["pdf"].read_bytes()).decode()
    r = parse_chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Summarise page 2"},
        {"type": "file", "file": {"filename": "report.pdf", "file_data": data}}]}]},
        ServerConfig(rlm=RLMConfig.build(model="replay:")))
    doc = r.context["report.pdf"]
    assert isinstance(doc, Document) and len(doc.pages) == 4
    cut = base64.b64encode(files["pdf"].read_bytes()[:500]).decode()
    with pytest.raises(RequestError, match=r"file 'x.pdf': not a readable PDF"):
        parse_chat({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "q"},
            {"type": "file", "file": {"filename": "x.pdf", "file_data": cut}}]}]},
            ServerConfig(rlm=RLMConfig.build(model="replay:")))


def test_search_indexes_a_documents_text(files: dict[str, Path], tmp_path: Path):
    from recursa.core.search_host import load_payload
    prep = ctx.prepare(files["pptx"], tmp_path / "w")
    value = load_payload(prep.payload)
    assert isinstance(value, Document) and value == load(files["pptx"])


def test_a_cut_off_tar_keeps_the_members_before_the_cut(files: dict[str, Path], tmp_path: Path):
    arc = h.tar_of(tmp_path / "b.tar.gz", [files["csv"], files["pdf"]])
    cut = h.truncated(tmp_path / "cut.tar.gz", arc)
    notes: list[str] = []
    from recursa.documents.load import load_source
    from recursa.documents.source import Source
    got = load_source(Source("cut.tar.gz", path=cut), notes)
    assert list(got) == ["inner/articles.csv"]
    assert any("cut.tar.gz: the archive ends early after 1 member(s)" in n for n in notes)


def test_a_session_over_a_pdf_answers_follow_ups(files: dict[str, Path]):
    """What `recursa chat --context report.pdf` runs: one session, several questions."""
    codes = iter(["FINAL(str(len(context.pages)))", "FINAL(context.pages[-1].name or 'x')"])
    model = ReplayClient(lambda messages: f"```repl\n{next(codes)}\n```")
    with RLM(model=model, sandbox="inprocess").session(files["pdf"]) as s:
        assert s.completion("How many pages?").answer == "4"
        assert s.completion("Last page's name?").answer == "x"
