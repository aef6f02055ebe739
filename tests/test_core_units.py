"""Unit tests of the core's pure parts: code extraction, output capping, budget ledger, context."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from recursa.base.types import BudgetExceeded, Cell, ContextError, Usage
from recursa.core.budget import Budget, Ledger
from recursa.core.context import prepare
from recursa.core.parse import cap, code_blocks, format_cell


# ---------------------------------------------------------------- parse
def test_repl_blocks_preferred_over_python():
    text = "x\n```python\na=1\n```\n```repl\nb=2\n```\n```repl\nc=3\n```"
    assert code_blocks(text) == ["b=2", "c=3"]


def test_python_blocks_used_when_no_repl():
    assert code_blocks("```python\nprint(1)\n```") == ["print(1)"]
    assert code_blocks("```py\nprint(2)\n```") == ["print(2)"]


def test_unterminated_fence_counts_and_other_languages_do_not():
    assert code_blocks("```repl\nprint(1)") == ["print(1)"]
    assert code_blocks("```bash\nls\n```\n```json\n{}\n```") == []
    assert code_blocks("FINAL(42) is what I'd write") == []


def test_cap_marks_how_much_was_cut():
    out = cap("a" * 100, 10)
    assert out.startswith("a" * 10) and "90 of 100" in out
    assert cap("short", 10) == "short"
    # the worker may already have cut the text: the total it counted is what we report
    assert "9,990 of 10,000" in cap("b" * 10, 10, total=10_000) or "of 10,000" in cap(
        "b" * 20, 10, total=10_000)


def test_format_cell_keeps_error_visible_when_stdout_is_huge():
    cell = Cell(stdout="x" * 5000, stdout_chars=10**9, error="Traceback: ZeroDivisionError")
    out = format_cell(cell, 1000)
    assert "ZeroDivisionError" in out
    assert len(out) < 1400
    assert "1,000,000,000" in out


def test_format_cell_empty():
    assert format_cell(Cell(), 100) == "[no output]"


# ---------------------------------------------------------------- budget
def test_ledger_refuses_reservation_past_token_limit_and_names_it():
    led = Ledger(Budget(max_tokens=1000))
    r = led.reserve(tokens=600, cost=None, subcall=True)
    with pytest.raises(BudgetExceeded) as e:
        led.reserve(tokens=600, cost=None, subcall=True)
    assert e.value.limit == "max_tokens"
    led.settle(r, usage=Usage(input_tokens=100, output_tokens=50), cost=None, role="sub", model="m")
    assert led.tokens == 150
    led.reserve(tokens=600, cost=None, subcall=True)  # fits now that the truth is known


def test_ledger_subcall_limit_and_force():
    led = Ledger(Budget(max_subcalls=2))
    rs = [led.reserve(tokens=1, cost=0, subcall=True) for _ in range(2)]
    with pytest.raises(BudgetExceeded):
        led.reserve(tokens=1, cost=0, subcall=True)
    led.reserve(tokens=1, cost=0, subcall=False)      # root turns are not sub-calls
    led.reserve(tokens=1, cost=0, subcall=True, force=True)
    for r in rs:
        led.settle(r, usage=Usage(input_tokens=1), cost=0.0, role="sub", model="m")
    assert led.subcalls == 2 and led.limit_reached() == "max_subcalls"


def test_ledger_unknown_cost_is_none_not_zero():
    led = Ledger(Budget())
    r = led.reserve(tokens=10, cost=None, subcall=True)
    led.settle(r, usage=Usage(input_tokens=5), cost=None, role="sub", model="m")
    assert led.cost_usd is None
    assert led.by_model["m"].cost_usd is None


def test_ledger_concurrent_reservations_never_overshoot():
    led = Ledger(Budget(max_cost_usd=1.0))
    admitted = []

    def worker():
        for _ in range(100):
            try:
                r = led.reserve(tokens=1, cost=0.01, subcall=True)
            except BudgetExceeded:
                return
            admitted.append(r)
            led.settle(r, usage=Usage(input_tokens=1), cost=0.01, role="sub", model="m")

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert led.cost_spent <= 1.0 + 1e-9
    assert len(admitted) == 100


def test_failed_call_settles_free():
    led = Ledger(Budget(max_subcalls=1))
    r = led.reserve(tokens=10, cost=0.1, subcall=True)
    led.settle(r, usage=None, cost=None, role="sub", model="m")
    assert led.subcalls == 0 and led.cost_usd == 0.0
    led.reserve(tokens=10, cost=0.1, subcall=True)


# ---------------------------------------------------------------- context
def test_str_context_description_has_size_and_preview_not_whole(tmp_path: Path):
    text = "hello world\n" * 50_000
    p = prepare(text, tmp_path)
    assert p.payload.kind == "text"
    assert Path(p.payload.path).read_text() == text
    assert "600,000 characters" in p.description and "150,000 tokens" in p.description
    assert len(p.description) < 1000


def test_list_and_dict_contexts(tmp_path: Path):
    p = prepare(["a" * 10, "b" * 30, "c" * 20], tmp_path / "l")
    assert p.payload.kind == "json"
    assert json.loads(Path(p.payload.path).read_text())[1] == "b" * 30
    assert "list of 3 items" in p.description and "median 20" in p.description
    d = prepare({"x": "1", "y": [1, 2]}, tmp_path / "d")
    assert "dict with 2 keys" in d.description


def test_directory_context_skips_binary_and_reports(tmp_path: Path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("def f():\n    return 1\n")
    (root / "README.md").write_text("# readme")
    (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    (root / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    p = prepare(root, tmp_path / "w")
    files = json.loads(Path(p.payload.path).read_text())
    assert set(files) == {"pkg/a.py", "README.md", "latin.txt"}
    assert "1 binary" in p.description
    assert "invalid UTF-8" in p.description
    assert "files (relative path -> text)" in p.description


def test_bad_contexts_have_clear_errors(tmp_path: Path):
    with pytest.raises(ContextError, match="empty"):
        prepare("", tmp_path)
    with pytest.raises(ContextError, match="empty"):
        prepare([], tmp_path)
    with pytest.raises(ContextError, match="does not exist"):
        prepare(tmp_path / "nope.txt", tmp_path)
    binf = tmp_path / "x.bin"
    binf.write_bytes(b"\x7fELF\x00\x00")
    with pytest.raises(ContextError, match="binary"):
        prepare(binf, tmp_path)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ContextError, match="no readable text"):
        prepare(empty_dir, tmp_path / "w")
    with pytest.raises(ContextError, match="must be str"):
        prepare(42, tmp_path)
    with pytest.raises(ContextError, match="no context"):
        prepare(None, tmp_path)


def test_unreadable_file_in_directory_is_skipped(tmp_path: Path):
    import os
    root = tmp_path / "d"
    root.mkdir()
    (root / "ok.txt").write_text("fine")
    bad = root / "secret.txt"
    bad.write_text("hidden")
    bad.chmod(0)
    if os.geteuid() == 0:
        pytest.skip("root reads any file; permission bits cannot make one unreadable")
    p = prepare(root, tmp_path / "w")
    assert "unreadable" in p.description


def test_reservation_estimate_counts_non_ascii_scripts_conservatively():
    from recursa.core.dispatch import text_tokens
    assert text_tokens("a" * 400) == 100
    cjk = "\u4e2d" * 400                       # one CJK character is about one token or more
    assert text_tokens(cjk) >= 400
    cyr = "\u0436" * 400                       # two UTF-8 bytes each
    assert 200 <= text_tokens(cyr) <= 400


# ---------------------------------------------------------------- typed answers
def test_output_spec_reads_fenced_json_and_python_literals():
    from pydantic import BaseModel

    from recursa.core.output import OutputSpec

    class Item(BaseModel):
        name: str
        n: int

    spec = OutputSpec.of(list[Item])
    assert spec.schema["type"] == "array"
    assert spec.parse('```json\n[{"name": "a", "n": 1}]\n```') == [Item(name="a", n=1)]
    assert spec.parse("[{'name': 'b', 'n': 2}]") == [Item(name="b", n=2)]   # FINAL(list) repr


def test_output_spec_errors_are_short_and_name_the_place():
    from recursa.core.output import OutputInvalid, OutputSpec

    spec = OutputSpec.of({"type": "object", "required": ["a"],
                          "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    with pytest.raises(OutputInvalid) as e:
        spec.parse('{"a": [1, "two", 3]}')
    assert str(e.value) == "$.a[1]: 'two' is not of type 'integer'"
    with pytest.raises(OutputInvalid, match="not JSON"):
        spec.parse("the answer is 3")
    assert OutputSpec.of(spec) is spec


# ---------------------------------------------------------------- the run recorder
def test_run_recorder_writes_the_contract_the_reader_reads():
    from recursa.base.types import Completion
    from recursa.core.recorder import RunRecorder, result_from
    from recursa.obs.trace import CallbackSink, Tracer, build_run

    events: list = []
    tracer = Tracer([CallbackSink(events.append)])
    ledger = Ledger(Budget())
    rec = RunRecorder(tracer)
    rec.start(query="q?", model="m", budget={})
    rec.note(system="sys", first_user="q?")
    turn = rec.turn(turn=1)
    comp = Completion(text="```repl\nFINAL('x')\n```", usage=Usage(input_tokens=5,
                                                                   output_tokens=2),
                      cost_usd=0.0, model="m")
    turn.replied(comp)
    cell = turn.cell(0, "FINAL('x')")
    turn.cell_end(cell, Cell(final="x", error="Traceback...\nValueError: bad"), "out")
    turn.end(comp, blocks=1, ended=True)
    rec.finish(result_from(ledger, tracer, answer="x", status="final", turns=1),
               totals={"tokens": 7})
    run = build_run(events)
    assert (run.answer, run.status, run.answer_source, run.finished) == ("x", "final", "final",
                                                                         True)
    assert not run.open_nodes and run.totals.turns == 1 and run.totals.cells == 1
    assert run.totals.input_tokens == 5
    c = next(n for n in run.walk() if n.kind == "cell")
    assert (c.data["error"], c.data["ready"]) == ("ValueError: bad", True)
