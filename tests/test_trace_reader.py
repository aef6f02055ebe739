"""The trace format and its reader: tree shape, totals, torn lines, unfinished runs, redaction,
and how the file grows (not with the context, linearly with turns)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recursa.demos.synthetic import demo_context, demo_run, write_synthetic_trace
from recursa.obs.trace import (
    TRACE_FORMAT,
    JsonlSink,
    Redactor,
    Tracer,
    load,
    load_events,
    load_runs,
    parse_lines,
)

USAGE = {"input_tokens": 100, "output_tokens": 10, "cached_tokens": 0}


def hand_made(path: Path, *, finish: bool = True, sub_cost: float | None = 0.001) -> Tracer:
    """run > turn 1 > cell > 2 sub-calls + child RLM (> turn > cell); last turn; final."""
    tr = Tracer([JsonlSink(path)], run_id="r1")
    run = tr.emit("run", phase="start", query="what?", model="m-root")
    tr.emit("run", parent=run, context_sha256="0" * 64, context_bytes=5, context_chars=5,
            description="type: str")
    turn = tr.emit("turn", phase="start", parent=run, turn=1)
    cell = tr.emit("cell", phase="start", parent=turn, index=0, code="print(llm_batch(...))")
    subs = [tr.emit("subcall", phase="start", parent=cell, model="m-sub", prompt=f"p{i}")
            for i in range(2)]
    tr.emit("subcall", id=subs[0], phase="end", parent=cell, model="m-sub", response="a0",
            usage=USAGE, cost_usd=sub_cost)
    tr.emit("subcall", id=subs[1], phase="end", parent=cell, error="Error: boom")
    child = tr.emit("child", phase="start", parent=cell, depth=1, query="sub q", model="m-root")
    ct = tr.emit("turn", phase="start", parent=child, depth=1, turn=1)
    cc = tr.emit("cell", phase="start", parent=ct, depth=1, index=0, code="FINAL('c')")
    if not finish:
        tr.close()
        return tr
    tr.emit("cell", id=cc, phase="end", parent=ct, depth=1, output="", error=False)
    tr.emit("turn", id=ct, phase="end", parent=child, depth=1, text="child text", usage=USAGE,
            cost_usd=0.01, model="m-root-2024")
    tr.emit("final", parent=child, depth=1, answer="c", status="final", ready=True)
    tr.emit("child", id=child, phase="end", parent=cell, depth=1, status="final")
    tr.emit("cell", id=cell, phase="end", parent=turn, output="['a0', 'Error: boom']",
            error=False)
    tr.emit("turn", id=turn, phase="end", parent=run, text="```repl\n...\n```", usage=USAGE,
            cost_usd=0.01, model="m-root-2024", blocks=1)
    last = tr.emit("turn", phase="start", parent=run, last=True)
    tr.emit("turn", id=last, phase="end", parent=run, text="42", usage=USAGE, cost_usd=0.01,
            last=True)          # the loop's last-answer turn carries no model
    tr.emit("final", parent=run, answer="42", status="extracted", ready=False, limit=None)
    tr.emit("run", id=run, phase="end", status="extracted", turns=1)
    tr.close()
    return tr


def test_tree_shape_and_pairing(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p)
    run = load(p)
    root = run.root
    assert root is not None and root.kind == "run" and run.roots == [root.id]
    assert [run.nodes[c].kind for c in root.children] == ["turn", "turn"]
    turn = run.nodes[root.children[0]]
    cell = run.nodes[turn.children[0]]
    assert cell.data["code"].startswith("print") and cell.data["output"].startswith("['a0'")
    assert [run.nodes[c].kind for c in cell.children] == ["subcall", "subcall", "child"]
    child = run.nodes[cell.children[2]]
    assert child.depth == 1 and child.data["status"] == "final"
    assert [p.kind for p in child.points] == ["final"]
    assert {p.kind for p in root.points} == {"run", "final"}
    assert not run.open_nodes and run.finished
    assert [n.kind for n in run.walk()][:4] == ["run", "turn", "cell", "subcall"]
    assert run.context["bytes"] == 5 and run.context["sha256"] == "0" * 64
    assert run.answer == "42" and run.status == "extracted" and not run.ready
    assert run.query == "what?" and run.model == "m-root"


def test_totals_and_usage_tables(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p)
    run = load(p)
    t = run.totals
    assert (t.calls, t.turns, t.cells, t.subcalls, t.failed_subcalls, t.children) == (4, 3, 2, 2, 1, 1)
    assert t.input_tokens == 400 and t.output_tokens == 40 and t.tokens == 440
    assert t.cost_usd == pytest.approx(0.031)
    assert t.wall_s >= 0
    assert run.by_role["root"].calls == 2 and run.by_role["child"].calls == 1
    assert run.by_role["sub"].calls == 1 and run.by_role["sub"].usage.input_tokens == 100
    # the last turn names no model: it is charged to its RLM's model
    assert set(run.by_model) == {"m-root-2024", "m-root", "m-sub"}
    cell_id = run.nodes[run.root.children[0]].children[0]
    sub = run.subtree_totals(cell_id)
    assert sub.calls == 2 and sub.cost_usd == pytest.approx(0.011) and sub.children == 1
    assert [n.kind for n in run.search("CHILD TEXT")] == ["turn"]
    assert run.search("nothing like this") == []


def test_unknown_price_makes_cost_unknown(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p, sub_cost=None)
    run = load(p)
    assert run.totals.cost_usd is None
    assert run.by_role["sub"].cost_usd is None and run.by_role["root"].cost_usd == pytest.approx(0.02)


def test_header_line_names_the_format(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p)
    first = json.loads(p.read_text().splitlines()[0])
    assert first["kind"] == "header" and first["format"] == TRACE_FORMAT and first["run_id"] == "r1"
    assert load(p).format == TRACE_FORMAT
    assert load_events(p)[0].kind == "run"          # the old reader skips the header


def test_newer_format_is_refused(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"kind": "header", "format": "recursa-trace/2", "run_id": "x"}) + "\n")
    with pytest.raises(ValueError, match="newer"):
        load(p)
    with pytest.raises(ValueError, match="not a recursa trace"):
        parse_lines([json.dumps({"kind": "header", "format": "other/1"})])


def test_torn_last_line_is_skipped(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p)
    whole = load(p)
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])   # killed mid-line
    run = load(p)
    assert run.torn and run.events == whole.events - 1
    assert not run.finished and run.root.open          # the run's end was the torn line
    assert run.answer == "42"                          # the final event before it survived


def test_unfinished_run_marks_open_nodes(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p, finish=False)
    run = load(p)
    assert not run.finished and run.status is None and run.answer is None
    open_kinds = sorted(n.kind for n in run.open_nodes)
    assert open_kinds == ["cell", "cell", "child", "run", "turn", "turn"]
    assert run.totals.calls == 1 and run.totals.subcalls == 2
    assert run.end is not None and run.totals.wall_s >= 0   # up to the last event


def test_appended_runs_are_read_one_by_one(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    hand_made(p)
    tr = Tracer([JsonlSink(p)], run_id="r2")
    rid = tr.emit("run", phase="start", query="second")
    tr.emit("run", id=rid, phase="end", status="final")
    tr.close()
    runs = load_runs(p)
    assert [r.run_id for r in runs] == ["r1", "r2"]
    assert load(p).query == "second" and load(p, "r1").query == "what?"
    with pytest.raises(ValueError, match="no run"):
        load(p, "nope")


def test_empty_file_is_an_error(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    p.write_text("")
    with pytest.raises(ValueError, match="no recursa events"):
        load(p)


# ------------------------------------------------------------------ redaction
def test_env_secrets_never_reach_the_file(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ACME_API_KEY", "acme-0123456789abcdef")
    monkeypatch.setenv("DB_PASSWORD_PROD", 'pa"ss\\word-42')        # needs JSON escaping
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-agent.sock")     # not a secret
    p = tmp_path / "t.jsonl"
    tr = Tracer([JsonlSink(p)], run_id="r")
    tr.emit("cell", phase="point", output='key acme-0123456789abcdef pw pa"ss\\word-42 '
            "sock /tmp/ssh-agent.sock gh ghp_" + "a" * 36 + " hf_" + "b" * 34)
    tr.close()
    text = p.read_text()
    assert "acme-0123456789abcdef" not in text
    assert "ss\\\\word-42" not in text and "word-42" not in text
    assert "ghp_aaaa" not in text and "hf_bbbb" not in text
    assert "/tmp/ssh-agent.sock" in text
    assert text.count("[REDACTED]") == 4
    assert load_events(p)[0].data["output"].startswith("key [REDACTED] pw [REDACTED]")


def test_redactor_given_values():
    r = Redactor(["my-own-secret-value"])
    assert r("x my-own-secret-value y") == "x [REDACTED] y"
    assert r("short") == "short"


def test_real_run_redacts_env_secret(tmp_path: Path, monkeypatch):
    secret = "tok-9f8e7d6c5b4a39281706"
    monkeypatch.setenv("SERVICE_TOKEN", secret)
    p = tmp_path / "t.jsonl"
    # the first turn prints context[:300], so the secret reaches a cell's output
    demo_run(p, context=f"config token={secret}\n" + demo_context(5000))
    text = p.read_text()
    assert secret not in text
    assert "config token=[REDACTED]" in text


# ------------------------------------------------------------------ a real run
def test_real_run_tree_and_totals_match_the_result(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    res = demo_run(p, context_size=50_000)
    run = load(p)
    assert run.finished and run.status == res.status == "final" and run.answer == res.answer
    root = run.root
    kinds = [run.nodes[c].kind for c in root.children]
    assert kinds == ["turn"] * res.turns
    batch_cell = next(n for n in run.walk() if n.kind == "cell" and "llm_batch" in n.data["code"])
    subs = [run.nodes[c] for c in batch_cell.children]
    assert len(subs) == 8 and all(s.kind == "subcall" and not s.open for s in subs)
    # the batch ran in parallel: the sub-calls overlap in time
    assert max(s.start for s in subs) < min(s.end for s in subs)
    child = next(n for n in run.walk() if n.kind == "child")
    assert child.depth == 1 and [run.nodes[c].kind for c in child.children] == ["turn", "turn"]
    for role, ru in res.usage.items():
        assert run.by_role[role].calls == ru.calls
        assert run.by_role[role].usage == ru.usage
        assert run.by_role[role].cost_usd == pytest.approx(ru.cost_usd)
    assert run.totals.cost_usd == pytest.approx(res.cost_usd)
    assert run.totals.subcalls == res.subcalls
    assert set(run.by_model) == set(res.usage_by_model)


def test_trace_size_does_not_grow_with_context(tmp_path: Path):
    """A real run over 1 MB and over 10 MB of context: the traces differ by a few bytes."""
    sizes = {}
    for mb in (1, 10):
        p = tmp_path / f"t{mb}.jsonl"
        demo_run(p, context_size=mb * 1_000_000)
        sizes[mb] = p.stat().st_size
    assert abs(sizes[10] - sizes[1]) < 2_000, sizes
    assert sizes[1] < 60_000, sizes
    ctx = load(tmp_path / "t10.jsonl").context
    assert ctx["bytes"] == 10_000_000 and len(ctx["sha256"]) == 64


def test_trace_grows_linearly_with_turns(tmp_path: Path):
    sizes = []
    for turns in (5, 10, 20):
        p = tmp_path / f"t{turns}.jsonl"
        demo_run(p, context_size=20_000, extra_turns=turns)
        sizes.append(p.stat().st_size)
    first, second = sizes[1] - sizes[0], sizes[2] - sizes[1]   # 5 more turns, then 10 more
    # each turn adds about the same: no history is written again (that would be quadratic)
    assert second == pytest.approx(2 * first, rel=0.15), sizes


def test_synthetic_trace_loads(tmp_path: Path):
    p = tmp_path / "s.jsonl"
    n = write_synthetic_trace(p, events=2000)
    run = load(p)
    assert run.events == n and run.finished and run.status == "final"
    assert run.totals.subcalls > 100 and run.totals.children >= 1
    assert len(run.search("NEEDLE-42")) == 1
    unfinished = tmp_path / "u.jsonl"
    write_synthetic_trace(unfinished, events=500, finish=False)
    assert not load(unfinished).finished
