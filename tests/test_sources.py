"""Answers with verified sources (recursa.core.sources): finding quotes in str / list / dict / folder
contexts (exact, normalized, fuzzy, not at all), the locator seam, and the loop carrying the
REPL's sources into Result, the trace, the CLI and the server (scripted models, real sandboxes)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import helpers_documents as hd
from helpers_scripted import is_root, root_script
from recursa import RLM
from recursa.base.types import Location
from recursa.core import prompts, sources
from recursa.documents import Location as DocLocation
from recursa.documents import load
from recursa.documents import locate as documents_locate
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

NOTES = "\n".join(f"Note {i}: ticket {1000 + i} was reviewed and closed without changes."
                  for i in range(60))
FACT = "Note 23: the Ada meeting was held in Lyon, in the old library, on 3 May."
CTX = NOTES.replace("Note 23: ticket 1023 was reviewed and closed without changes.", FACT)


def one(quote: object, context: object, answer: str = "") -> sources.Source:
    [src] = sources.check([quote], context, answer)
    return src


# ---------------------------------------------------------------- finding a quote
def test_exact_quote_is_found_with_its_line_and_span():
    s = one("the Ada meeting was held in Lyon", CTX)
    assert s.found and s.match == "exact" and s.score == 100
    assert s.location is not None and s.location.line == 24 and s.location.end_line is None
    assert CTX[s.location.start:s.location.end] == "the Ada meeting was held in Lyon"
    assert s.location.label == "line 24"
    assert s.before.endswith("Note 23: ") and s.after.startswith(", in the old library")


def test_other_spacing_case_quote_marks_and_an_ellipsis_are_normalized():
    ctx = "He said \u201cthe budget is final\u201d\nand left. The plan was approved by the board."
    s = one('he said "the   budget is\nFINAL"', ctx)
    assert s.found and s.match == "normalized"
    assert s.text == "He said \u201cthe budget is final\u201d"
    s = one("The plan ... by the board", ctx)
    assert s.found and s.match == "normalized" and s.text == "The plan was approved by the board"
    assert s.location is not None and s.location.line == 2


def test_a_close_quote_is_found_fuzzily_with_its_score():
    s = one("the Ada meting was held in Lyon, in the old libary", CTX)
    assert s.found and s.match == "fuzzy" and 85 <= s.score < 100
    assert s.text is not None and "old library" in s.text
    assert s.location is not None and s.location.line == 24


def test_an_invented_quote_is_not_found_and_the_answer_is_flagged():
    got = sources.check(["the Ada meeting was held in Paris at the town hall in June",
                         "a sentence that is nowhere in the notes at all"], CTX)
    assert [s.found for s in got] == [False, False]
    assert all(s.location is None and s.note == "not found in the context" for s in got)
    assert sources.verdict(got) is False
    assert "none of the answer's 2" in (sources.warning(got) or "")
    mixed = got[:1] + [one("Ada meeting", CTX)]
    assert sources.verdict(mixed) is False and sources.warning(mixed).startswith("1 of")
    assert sources.verdict(mixed[1:]) is True and sources.warning(mixed[1:]) is None
    assert sources.verdict([]) is None


def test_a_short_quote_must_match_exactly():
    s = one("Lyonn", CTX)      # fuzzy would find a 5-letter word almost anywhere
    assert not s.found and "must match exactly" in (s.note or "")
    assert not one("   ", CTX).found


def test_fuzzy_never_finds_a_short_text_inside_a_long_quote():
    # rapidfuzz aligns the shorter string inside the longer: a list item of 12 characters
    # would score 100 against any quote containing it
    s = one("an invented sentence that merely mentions short item in passing", ["short item"])
    assert not s.found


# ---------------------------------------------------------------- contexts with many texts
def test_a_folder_context_locates_the_file_and_line(tmp_path: Path):
    (tmp_path / "a.txt").write_text("alpha\nbeta\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("# Notes\n\nThe deploy key rotates every 90 days.\n")
    s = one("The deploy key rotates every 90 days", tmp_path)     # a Path: loaded again
    assert s.found and s.location is not None
    assert s.location.file == "docs/notes.md" and s.location.line == 3
    assert s.location.item == ("docs/notes.md",)
    assert s.location.label == "docs/notes.md, section 1 (Notes), line 3"   # Markdown: a Document


def test_list_dict_and_nested_contexts():
    docs = ["first doc", "second doc\nwith the needle sentence here"]
    s = one("the needle sentence", docs)
    assert s.location is not None and s.location.item == (1,) and s.location.line == 2
    assert s.location.file is None and s.location.label == "context[1], line 2"
    records = [{"id": 1, "body": "nothing"}, {"id": 2, "body": "refund issued on 4 March"}]
    s = one("refund issued on 4 March", records)
    assert s.location is not None and s.location.item == (1, "body")
    assert s.location.label == "context[1]['body'], line 1"
    nested = {"src": {"main.py": "def main():\n    run()\n"}, "README": "hi"}
    s = one("    run()", nested)
    assert s.location is not None and s.location.file == "src/main.py"
    assert s.location.line == 2


def test_a_search_hit_is_found_at_its_span_and_a_stale_span_falls_back():
    files = {"a.txt": "one two three", "b.txt": "the quick brown fox jumps"}
    hit = {"text": "brown fox", "start": 10, "end": 19, "item": "b.txt", "score": 0.9}
    s = one(hit, files)
    assert s.found and s.match == "exact" and s.location is not None
    assert (s.location.file, s.location.start, s.location.end) == ("b.txt", 10, 19)
    stale = dict(hit, start=0, end=9)           # the text is elsewhere: searched for instead
    s = one(stale, files)
    assert s.found and s.location is not None and s.location.start == 10
    span_only = {"start": 4, "end": 9, "item": "b.txt"}
    s = one(span_only, files)
    assert s.found and s.text == "quick"


def test_a_long_passage_is_narrowed_to_the_answer_line():
    piece = CTX[CTX.index("Note 20"):CTX.index("Note 40")]
    s = one(piece, CTX, answer="Lyon")
    assert s.found and s.match == "exact" and s.text == FACT
    assert s.location is not None and s.location.line == 24
    assert "narrowed" in (s.note or "")
    s = one(piece, CTX, answer="42")            # the answer is not in it: kept whole
    assert s.text == piece.strip() or s.text == piece
    assert s.note is None


def test_a_context_that_cannot_be_read_leaves_sources_unfound(tmp_path: Path):
    gone = tmp_path / "gone.txt"
    [s] = sources.check(["anything at all here"], gone)
    assert not s.found and "could not be read" in (s.note or "")


class Transcript:
    """A context type of a user's own (not a str): turns of text, one name."""

    def __init__(self, name: str, turns: list[str]):
        self.name, self.turns = name, turns


@sources.texts.register(Transcript)
def _transcript_texts(t: Transcript) -> Iterator[tuple[tuple[int], str]]:
    for i, turn in enumerate(t.turns):
        yield (i,), turn


@sources.locate.register(Transcript)
def _transcript_locate(t: Transcript, item: tuple, start: int, end: int) -> Location:
    loc = sources.locate(t.turns[item[0]], (), start, end)
    return replace(loc, item=tuple(item), file=t.name, unit="turn", number=item[0] + 1)


def test_a_context_type_plugs_into_the_seam():
    """How another context type says where a passage is: it registers `texts` and `locate`;
    the containers around it (a dict of files) compose with it."""
    folder = {"calls/monday.txt": Transcript("monday.txt", ["Hello", "Intro\nRevenue rose 12%."]),
              "notes.txt": "misc"}
    s = one("Revenue rose 12%", folder)
    assert s.found and s.location is not None
    assert (s.location.file, s.location.unit, s.location.number, s.location.line) == \
        ("calls/monday.txt", "turn", 2, 2)
    assert s.location.item == ("calls/monday.txt", 1)
    assert s.location.label == "calls/monday.txt, turn 2, line 2"


# ---------------------------------------------------------------- documents (recursa.documents)
AUDIT = "The audit found 14 unsigned invoices in March."


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real PDF (fpdf2, as tests/helpers_documents.py builds them) whose page 2 reads: a
    title, a paragraph, then AUDIT on its third line."""
    t = hd.Texts(paras=[f"Paragraph {i} says nothing of note." for i in range(5)] + [AUDIT],
                 titles=["Cover", "Findings"])
    folder = tmp_path_factory.mktemp("docs") / "finance"
    folder.mkdir()
    return hd.pdf(folder / "report.pdf", t, pages=3)


def test_a_pdf_source_is_located_by_file_page_and_line(report: Path):
    """The one Location type: a quote from a PDF context is at `report.pdf, page 2, line 3`,
    whether the context is the file, its loaded Document, one of its pages or its folder."""
    s = one(AUDIT, report)                       # a Path: loaded as `recursa run` loads it
    assert s.found and s.match == "exact" and s.location is not None
    loc = s.location
    assert loc.label == "report.pdf, page 2, line 3"
    assert (loc.file, loc.unit, loc.number, loc.line, loc.end_line) == \
        ("report.pdf", "page", 2, 3, None)
    doc = load(report)
    assert doc.pages[1][loc.start:loc.end] == AUDIT == doc[loc.doc_start:loc.doc_end]
    assert loc == documents_locate(doc, loc.doc_start, loc.doc_end)   # the same answer
    assert isinstance(loc, DocLocation)                               # the same type
    assert one(AUDIT, doc).location == loc
    page = one(AUDIT, doc.pages[1]).location                          # a Part as context
    assert page is not None and page.label == "report.pdf, page 2, line 3"
    assert (page.doc_start, page.doc_end) == (loc.doc_start, loc.doc_end)
    # a folder: the file's path in it; a quote over two lines of the page
    s = one("Paragraph 1 says nothing of note. The audit found", report.parent.parent)
    assert s.found and s.match == "normalized" and s.location is not None
    assert s.location.label == "finance/report.pdf, page 2, lines 2-3"
    assert s.location.item == ("finance/report.pdf",)


def test_a_run_over_a_pdf_reports_its_sources_page(report: Path, tmp_path: Path):
    """End to end through the loop and a real sandbox: the model quotes the page it read."""
    trace = tmp_path / "t.jsonl"
    code = ('page = context.pages[1]\nprint(page)\n'
            'FINAL("14", sources=[page.splitlines()[2]])')
    res = RLM(model=script(repl(code)), sandbox="local", trace_path=trace,
              sources=True).completion("How many unsigned invoices?", context=report)
    assert res.status == "final" and res.answer == "14" and res.sources_verified is True
    [s] = res.sources
    assert s.text == AUDIT and s.location is not None
    assert s.location.label == "report.pdf, page 2, line 3"
    final = [e for e in load_events(trace) if e.kind == "final"][0]
    assert final.data["sources"][0]["location"]["label"] == "report.pdf, page 2, line 3"


def test_render_lists_found_and_unfound_sources():
    got = sources.check(["the Ada meeting was held in Lyon", "made up text that is not there"],
                        CTX)
    text = sources.render(got)
    assert "[1] line 24 (exact)" in text and "the Ada meeting was held in Lyon" in text
    assert "[2] NOT FOUND in the context" in text
    assert sources.render([]).startswith("Sources: none")


# ---------------------------------------------------------------- through the loop
def script(*replies: str) -> ReplayClient:
    return ReplayClient(root_script(*replies, sub="Lyon"))


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


FIND = repl('i = context.find("Ada")\npieces = [context[max(0, i - 500):i + 2000]]\n'
            'print(llm_query(pieces[0] + " Where?"))')


@pytest.mark.parametrize("sandbox", ["inprocess", "local"])
def test_final_with_sources_reaches_result_and_trace(sandbox, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=script(FIND, repl('FINAL("Lyon", sources=[pieces[0]])')), sandbox=sandbox,
              trace_path=trace, sources=True)
    res = rlm.completion("In which city was the Ada meeting held?", context=CTX)
    assert res.status == "final" and res.answer == "Lyon"
    assert res.sources_verified is True
    [s] = res.sources
    assert s.found and s.text == FACT and s.location is not None and s.location.line == 24
    final = [e for e in load_events(trace) if e.kind == "final"][0]
    assert final.data["sources_verified"] is True
    assert final.data["sources"][0]["location"]["label"] == "line 24"
    # the Result round-trips through JSON (the CLI's --json, the server)
    assert json.loads(res.model_dump_json())["sources"][0]["location"]["line"] == 24


def test_sources_set_in_answer_survive_a_later_final_and_a_held_commit():
    """answer["sources"] set in one turn is kept by FINAL(...) without sources; a commit the
    loop holds (a number never shown) keeps them in the draft it goes back to."""
    rlm = RLM(model=script(
        repl('answer["sources"] = ["Note 23: the Ada meeting", {"text": "old library"}]'),
        repl('FINAL("Lyon, 1023 people")'),               # 1023 was never printed: held once
        repl('FINAL("Lyon, 1023 people")')), sandbox="inprocess")
    res = rlm.completion("Where was the Ada meeting?", context=CTX)
    assert res.answer == "Lyon, 1023 people" and res.status == "final"
    assert [s.text for s in res.sources] == ["Note 23: the Ada meeting", "old library"]
    assert res.sources_verified is True


def test_unfound_sources_are_flagged_not_passed():
    rlm = RLM(model=script(repl('FINAL("Paris", sources=["the Ada meeting was held in Paris '
                                'at the town hall"])')), sandbox="inprocess")
    res = rlm.completion("Where?", context=CTX)
    assert res.status == "final" and res.sources_verified is False
    assert not res.sources[0].found


def test_no_sources_leaves_result_and_prompt_as_before():
    client = script(repl('FINAL("Lyon")'))
    res = RLM(model=client, sandbox="inprocess").completion("Where?", context=CTX)
    assert res.sources == [] and res.sources_verified is None
    system = client.calls[0][0]["content"]
    assert "source" not in system.lower()      # the prompt says nothing about sources
    asked = script(repl('FINAL("Lyon")'))
    RLM(model=asked, sandbox="inprocess", sources=True).completion("Where?", context=CTX)
    system = asked.calls[0][0]["content"]
    assert prompts.SOURCES in system and prompts.EXAMPLE_FINAL_SOURCES in system


def test_asked_for_sources_a_commit_without_them_is_held_once():
    """RLM(sources=True): the first commit without sources goes back as a draft with the line
    that commits it with them (naming the model's own `pieces`); copying it gives a source."""
    nudge_line = 'FINAL(answer["content"], sources=[pieces[0]])'
    client = script(FIND, repl('FINAL("Lyon")'), repl(nudge_line))
    res = RLM(model=client, sandbox="inprocess", sources=True).completion("Where?", context=CTX)
    assert res.status == "final" and res.answer == "Lyon" and res.turns == 3
    roots = [c for c in client.calls if is_root(c)]
    assert nudge_line in roots[2][-1]["content"]
    assert res.sources_verified is True and res.sources[0].text == FACT
    # a second commit without sources is accepted as it is
    stubborn = script(repl('FINAL("Lyon")'))
    res = RLM(model=stubborn, sandbox="inprocess", sources=True).completion("Where?",
                                                                            context=CTX)
    assert res.status == "final" and res.turns == 2 and res.sources == []
    assert "context[start:end]" in stubborn.calls[1][-1]["content"]   # no passage variable
    # not asked: never held
    res = RLM(model=script(repl('FINAL("Lyon")')), sandbox="inprocess").completion(
        "Where?", context=CTX)
    assert res.turns == 1


def test_worker_keeps_sources_plain_and_bounded():
    big = "x" * 50_000
    code = ('FINAL("a", sources=[' + repr(big) + ', {"text": "t", "start": 1, "end": True, '
            '"item": ("k",), "junk": object()}, 7] + ["q"] * 30)')
    client = script(repl(code))
    res = RLM(model=client, sandbox="inprocess").completion("q", context="t" + big)
    assert len(res.sources) == sources.MAX_SOURCES
    first, second, third = res.sources[:3]
    assert first.found and len(first.quote) < 3000        # checked whole, stored cut
    assert second.quote == "t" and third.quote == "7"


def test_cli_prints_sources_and_warns_when_unfound(tmp_path: Path):
    """`recursa run --sources` as a user runs it: a real subprocess, a scripted model."""
    ctx = tmp_path / "notes.txt"
    ctx.write_text(CTX)
    model = tmp_path / "m.json"
    model.write_text(json.dumps([repl('FINAL("Lyon", sources=["the Ada meeting was held in '
                                      'Lyon", "an invented line that is not in the notes"])')]))
    proc = subprocess.run([sys.executable, "-m", "recursa.cli", "run", "Where?", "--context",
                           str(ctx), "--model", f"replay-file:{model}", "--sandbox", "inprocess",
                           "--sources"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Lyon\n\nSources:\n[1] line 24 (exact)")
    assert "[2] NOT FOUND in the context" in proc.stdout
    assert "1 of the answer's 2 sources were not found" in proc.stderr
