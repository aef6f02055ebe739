"""RLM.batch / iter_batch and `recursa batch` on the scripted model (replay:): items from
pairs, a directory and table columns; results in order; one failure never stops the rest; the
batch budget stops new items within one item's reservation; rows resume; tables."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers_batch import extract, first_word
from helpers_signals import default_sigint
from recursa import RLM
from recursa.base.types import ContextError
from recursa.batch.cli import out_paths
from recursa.cli import main
from recursa.core.batch import BatchBudget, BatchLedger, make_items

BIN = [sys.executable, "-m", "recursa.cli"]


def rlm(responder: Any = first_word, cost: float = 0.0, **kw: Any) -> RLM:
    return RLM("replay:", sandbox="inprocess", preflight=False,
               client_options={"responses": responder, "cost_usd": cost}, **kw)


def docs(tmp_path: Path, n: int, *, boom: tuple[int, ...] = ()) -> Path:
    d = tmp_path / "docs"
    d.mkdir(exist_ok=True)
    for i in range(n):
        (d / f"d{i:02d}.txt").write_text(("BOOM " if i in boom else "") + f"word{i} rest\n")
    (d / ".hidden").write_text("not an item")
    return d


def script(tmp_path: Path, reply: str) -> str:
    p = tmp_path / "script.json"
    p.write_text(json.dumps({"cycle": [reply]}))
    return f"replay-file:{p}"


FIRST = "```repl\nFINAL(str(context).split()[0])\n```"


# ---------------------------------------------------------------- items
def test_items_from_a_directory_and_from_table_columns(tmp_path: Path) -> None:
    d = docs(tmp_path, 3)
    its = make_items(query="q", contexts=d)
    assert [Path(i.source).name for i in its] == ["d00.txt", "d01.txt", "d02.txt"]
    assert len({i.key for i in its}) == 3 and all(i.key.endswith(i.source) for i in its)
    rows = [{"id": f"r{i}", "body": f"text {i}", "q": f"question {i}"} for i in range(3)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "body", "q"])
        w.writeheader()
        w.writerows(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.csv", "t.parquet"):
        its = make_items(contexts=tmp_path / name, column="body", query_column="q",
                         id_column="id")
        assert [(i.query, i.context, i.fields) for i in its] == [
            (f"question {i}", f"text {i}", {"id": f"r{i}"}) for i in range(3)], name
    with pytest.raises(ContextError, match="no context column 'text2'.*id, body, q"):
        make_items(query="q", contexts=tmp_path / "t.csv", column="text2")
    assert make_items(query="q", contexts=tmp_path / "t.csv")[0].context == "text 0"  # body
    (tmp_path / "u.csv").write_text("id,doc_text\n1,hello\n")
    with pytest.raises(ContextError, match="which column.*id, doc_text"):
        make_items(query="q", contexts=tmp_path / "u.csv")
    with pytest.raises(ValueError, match="appears twice"):
        make_items([("q", "same"), ("q", "same")])
    with pytest.raises(ValueError, match="pair"):
        make_items(["no query for this"])


# ---------------------------------------------------------------- the library
def test_batch_results_in_order_and_a_failure_does_not_stop_the_rest(tmp_path: Path) -> None:
    res = rlm().batch(query="first word?", contexts=docs(tmp_path, 6, boom=(2,)),
                      concurrency=3)
    assert [r.status for r in res] == ["final"] * 2 + ["error"] + ["final"] * 3
    assert [r.answer for r in res][3:] == ["word3", "word4", "word5"]
    assert "BOOM" in (res[2].error or "")
    assert res.summary["done"] == 6 and res.summary["failed"] == 1
    pairs = rlm().batch([("q1", "alpha beta"), ("q2", "gamma delta")])
    assert [r.answer for r in pairs] == ["alpha", "gamma"]


def test_iter_batch_yields_every_item_as_it_finishes() -> None:
    seen = [r.item.index for r in rlm().iter_batch(
        [("q", f"w{i} x") for i in range(5)], concurrency=2)]
    assert sorted(seen) == list(range(5))

    async def go() -> list[str]:
        return [r.result.answer async for r in rlm().aiter_batch(
            query="q", contexts=["a b", "c d"]) if r.result]
    assert sorted(asyncio.run(go())) == ["a", "c"]


def test_concurrency_bounds_runs_in_flight() -> None:
    live, peak = [0], [0]

    async def slow(messages: Any) -> str:
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        await asyncio.sleep(0.05)
        live[0] -= 1
        return FIRST
    res = rlm(slow).batch(query="q", contexts=[f"w{i} x" for i in range(8)], concurrency=3)
    assert all(r.status == "final" for r in res)
    assert peak[0] == 3


def test_batch_cost_budget_stops_new_items_within_one_reservation(tmp_path: Path) -> None:
    # each item makes one call at $0.01 and may spend up to its own cap of $0.01
    res = rlm(cost=0.01).batch(query="q", contexts=[f"w{i} x" for i in range(10)],
                               concurrency=3, budget=BatchBudget(max_cost_usd=0.045),
                               max_cost_usd=0.01)
    done = [r for r in res if r is not None]
    assert len(done) == 4 and res[4:] == [None] * 6       # 4 x 0.01 fit, a 5th could not
    s = res.summary
    assert s["stopped"] == "max_cost_usd" and s["not_started"] == 6
    assert s["cost_usd"] == pytest.approx(0.04)
    assert s["cost_usd"] <= 0.045 + 0.01                  # overshoot within one reservation


def test_a_batch_cap_without_item_caps_is_shared_out_and_tokens_count() -> None:
    # no per-item cap: each item is capped at the batch's / concurrency and reserves that
    res = rlm().batch(query="q", contexts=[f"w{i} x" for i in range(6)], concurrency=2,
                      budget={"max_tokens": 4000})
    led = res.summary["ledger"]
    assert led["reserve_tokens"] == 2000
    assert 0 < res.summary["tokens"] <= 4000
    assert res.summary["not_started"] > 0 and res.summary["stopped"] == "max_tokens"


def test_batch_time_budget_starts_nothing_after_it() -> None:
    async def slow(messages: Any) -> str:
        await asyncio.sleep(0.3)
        return FIRST
    t0 = time.monotonic()
    res = rlm(slow).batch(query="q", contexts=[f"w{i} x" for i in range(20)], concurrency=2,
                          budget=BatchBudget(max_seconds=0.8))
    assert time.monotonic() - t0 < 3
    assert 0 < res.summary["done"] < 20 and res.summary["stopped"] == "max_seconds"


def test_ledger_contract_lost_attempts_are_counted_once() -> None:
    led = BatchLedger(BatchBudget(max_cost_usd=1.0), item_cost=0.4)
    a1, _ = led.reserve("k1")
    a2, _ = led.reserve("k2")
    assert (a1, a2) == (1, 1)
    # a third would pass the cap while two are in flight: refused, but not final
    assert led.reserve("k3", final=False) == (None, "max_cost_usd") and led.stopped is None
    led.report("k1", 1, input_tokens=10, output_tokens=5, cost=0.1)
    assert led.lost("k1", 1) is True                       # its worker died
    assert led.settle("k1", 1, input_tokens=99, output_tokens=9, cost=0.3) is False  # stale
    assert led.lost("k1", 1) is False
    assert led.reserve("k1") == (2, None)                  # the retry is a new attempt
    assert led.settle("k1", 2, input_tokens=20, output_tokens=5, cost=0.2)
    assert led.settle("k2", 1, input_tokens=1, output_tokens=1, cost=0.1)
    snap = led.snapshot()
    assert snap["cost_usd"] == pytest.approx(0.4) and snap["tokens"] == 42
    assert snap["lost_attempts"] == 1 and snap["lost_cost_usd"] == pytest.approx(0.1)
    assert snap["in_flight"] == 0
    # 0.4 spent + 0.4 reserved + 0.4 > 1.0 with one in flight: wait; alone it fits
    assert led.reserve("k4") == (1, None)
    assert led.reserve("k5") == (None, "max_cost_usd") and led.stopped == "max_cost_usd"
    with pytest.raises(ValueError, match="per-item cost cap"):
        BatchLedger(BatchBudget(max_cost_usd=1.0))


def test_typed_extraction_rows_carry_parsed_values() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "words": {"type": "integer"}},
              "required": ["name", "words"]}
    res = rlm(extract).batch(query="extract", contexts=["ann b c", "bob d"], output=schema)
    assert [r.parsed for r in res] == [{"name": "ann", "words": 3}, {"name": "bob", "words": 2}]


# ---------------------------------------------------------------- the command
def test_cli_runs_resumes_and_retries_errors(tmp_path: Path, capsys: Any) -> None:
    d = docs(tmp_path, 4)
    out = tmp_path / "answers.jsonl"
    model = script(tmp_path, FIRST)
    args = ["batch", "first word?", "--contexts", str(d), "--out", str(out), "--model", model,
            "--sandbox", "inprocess", "-q"]
    assert main(args) == 0
    assert capsys.readouterr().err == ""                   # -q: nothing
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["answer"] for r in rows) == ["word0", "word1", "word2", "word3"]
    # a row marked failed, a torn last line and a missing item: only those run again
    rows[0]["status"], rows[0]["error"] = "error", "boom"
    keep = [rows[0], rows[1], rows[2]]
    out.write_text("".join(json.dumps(r) + "\n" for r in keep) + '{"key": "torn')
    assert main([*args[:-1], "--events", "jsonl"]) == 1    # the error row stays failed
    events = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    ran = [e for e in events if e["kind"] == "item"]
    assert [e["source"] for e in ran] == [rows[3]["source"]]
    assert events[-1]["kind"] == "summary" and events[-1]["skipped"] == 3
    assert main([*args, "--retry-errors"]) == 0
    final = {}
    for line in out.read_text().splitlines():
        r = json.loads(line)
        final[r["key"]] = r
    assert len(final) == 4 and all(r["status"] == "final" for r in final.values())


def test_cli_budget_stop_exit_status_and_schema_tables(tmp_path: Path, capsys: Any) -> None:
    d = docs(tmp_path, 5)
    model = script(tmp_path, FIRST)
    out = tmp_path / "a.jsonl"
    # replay costs nothing, so a token budget stops it: each item reserves 1/2 of 3000
    code = main(["batch", "q", "--contexts", str(d), "--out", str(out), "--model", model,
                 "--sandbox", "inprocess", "--total-tokens", "3000", "--concurrency", "2"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "stopped it" in err and "not started" in err
    assert 0 < len(out.read_text().splitlines()) < 5
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "required": ["name", "words"],
                                  "properties": {"name": {"type": "string"},
                                                 "words": {"type": "integer"}}}))
    extract_model = script(tmp_path, "```repl\nimport json\nw = str(context).split()\n"
                                     "FINAL(json.dumps({'name': w[0], 'words': len(w)}))\n```")
    for table in ("t.csv", "t.parquet"):
        assert main(["batch", "extract", "--contexts", str(d), "--out", str(tmp_path / table),
                     "--schema", str(schema), "--model", extract_model,
                     "--sandbox", "inprocess", "-q"]) == 0
        rows_file, tpath = out_paths(str(tmp_path / table))
        assert rows_file.exists() and tpath is not None
        if table.endswith(".csv"):
            with open(tpath, newline="") as f:
                recs = list(csv.DictReader(f))
        else:
            import pyarrow.parquet as pq
            recs = pq.read_table(tpath).to_pylist()
        assert [(r["name"], int(r["words"])) for r in recs] == [(f"word{i}", 2)
                                                                for i in range(5)]
        assert {"key", "source", "status", "cost_usd"} <= set(recs[0])
        assert tpath.stat().st_mode & 0o077 == 0          # owner-only, as the rows


def test_cli_bad_options_are_clear(tmp_path: Path, capsys: Any) -> None:
    model = script(tmp_path, FIRST)
    assert main(["batch", "q", "--out", str(tmp_path / "o.jsonl"), "--model", model]) == 2
    assert "give --contexts" in capsys.readouterr().err
    assert main(["batch", "q", "--contexts", str(tmp_path / "nope"), "--out",
                 str(tmp_path / "o.jsonl"), "--model", model]) == 2
    assert "does not exist" in capsys.readouterr().err
    qs = tmp_path / "qs.txt"
    qs.write_text("first?\nsecond?\n")
    (tmp_path / "corpus.txt").write_text("alpha beta")
    assert main(["batch", "--queries", str(qs), "--context", str(tmp_path / "corpus.txt"),
                 "--out", str(tmp_path / "m.jsonl"), "--model", model,
                 "--sandbox", "inprocess", "-q"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert sorted(r["query"] for r in rows) == ["first?", "second?"]
    assert {r["answer"] for r in rows} == {"alpha"}


def test_cli_an_item_cut_to_no_answer_is_not_done(tmp_path: Path, capsys: Any) -> None:
    """An item its own limit ended with an empty answer is counted as not done (exit 4, the
    summary says so), and re-running the command runs exactly those items again."""
    d = docs(tmp_path, 3)
    out = tmp_path / "a.jsonl"
    never = script(tmp_path, "```repl\nprint('still looking')\n```")    # never answers
    args = ["batch", "q", "--contexts", str(d), "--out", str(out), "--sandbox", "inprocess"]
    assert main([*args, "--model", never, "--max-iterations", "1", "--events", "jsonl"]) == 4
    events = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    summary = events[-1]
    assert summary["kind"] == "summary" and summary["cut"] == 3 and summary["remaining"] == 3
    assert all(e["cut"] for e in events if e["kind"] == "item")
    (tmp_path / "script.json").unlink()
    assert main([*args, "--model", script(tmp_path, FIRST), "--events", "jsonl"]) == 0
    events = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert len([e for e in events if e["kind"] == "item"]) == 3       # all three again
    assert events[-1]["remaining"] == 0 and events[-1]["skipped"] == 0
    final = {json.loads(x)["key"]: json.loads(x) for x in out.read_text().splitlines()}
    assert sorted(r["answer"] for r in final.values()) == ["word0", "word1", "word2"]


def test_cli_a_tampered_rows_file_is_named_by_file_and_line(tmp_path: Path,
                                                            capsys: Any) -> None:
    d = docs(tmp_path, 3)
    out = tmp_path / "a.jsonl"
    args = ["batch", "q", "--contexts", str(d), "--out", str(out), "--model",
            script(tmp_path, FIRST), "--sandbox", "inprocess", "-q"]
    assert main(args) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for bad, what in (({"key": ["x"]}, "key must be a non-empty string"),
                      ({"status": 7}, "status must be one of"),
                      ({"cost_usd": "free"}, "cost_usd must be a number")):
        out.write_text("".join(json.dumps({**r, **(bad if i == 1 else {})}) + "\n"
                               for i, r in enumerate(rows)))
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"{out}, line 2: its {what}" in " ".join(err.split()), err
        assert "Traceback" not in err and "unhashable" not in err
    out.write_text(json.dumps(rows[0]) + "\n[1, 2]\n")
    assert main(args) == 2
    assert "line 2: a row must be a JSON object" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_ctrl_c_says_the_batch_was_interrupted_and_what_remains(tmp_path: Path) -> None:
    d = docs(tmp_path, 12)
    out = tmp_path / "answers.jsonl"
    model = script(tmp_path, "```repl\nimport time\ntime.sleep(0.4)\n"
                             "FINAL(str(context).split()[0])\n```")
    cmd = [*BIN, "batch", "first word?", "--contexts", str(d), "--out", str(out), "--model",
           model, "--sandbox", "inprocess", "--concurrency", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, env={**os.environ, "COLUMNS": "200"},
                         preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)          # as Ctrl-C in a terminal
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err.decode()
    rows = {json.loads(x)["key"] for x in out.read_text().splitlines()}
    text = " ".join(err.decode().split())
    assert f"interrupted: {12 - len(rows)} of 12 items remain" in text, text
    assert "run the same command again to resume" in text


@pytest.mark.slow
def test_cli_resumes_after_a_kill(tmp_path: Path) -> None:
    """A real `recursa batch` process killed mid-batch, then the same command again: every
    item has exactly one final row, and the first run's rows were not redone."""
    d = docs(tmp_path, 12)
    out = tmp_path / "answers.jsonl"
    model = script(tmp_path, "```repl\nimport time\ntime.sleep(0.4)\n"
                             "FINAL(str(context).split()[0])\n```")
    cmd = [*BIN, "batch", "first word?", "--contexts", str(d), "--out", str(out), "--model",
           model, "--sandbox", "inprocess", "--concurrency", "2", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    first = {json.loads(x)["key"] for x in out.read_text().splitlines() if x.endswith("}")}
    assert 3 <= len(first) < 12
    q = subprocess.run([*cmd[:-1], "--events", "jsonl"], capture_output=True, timeout=120)
    assert q.returncode == 0, q.stderr.decode()
    ran = [json.loads(x) for x in q.stderr.decode().splitlines()]
    assert not first & {e["key"] for e in ran if e["kind"] == "item"}
    keys = [json.loads(x)["key"] for x in out.read_text().splitlines()]
    assert len(set(keys)) == 12 and len(keys) == 12


def test_leaving_iter_batch_early_cancels_the_rest() -> None:
    calls = [0]

    async def slow(messages: Any) -> str:
        calls[0] += 1
        await asyncio.sleep(0.2)
        return FIRST
    t0 = time.monotonic()
    for _r in rlm(slow).iter_batch(query="q", contexts=[f"w{i} x" for i in range(40)],
                                   concurrency=2):
        break
    assert time.monotonic() - t0 < 5
    assert calls[0] < 10          # the other items never ran


def test_a_local_ray_started_with_auth_off_is_warned_about(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture):
    """A Ray instance the executor starts listens on every interface; with RAY_AUTH_MODE turning
    its token authentication off, the user is told. Not when auth is on, nor when joining a
    cluster the user started (--address). A stand-in `ray` module: no Ray starts."""
    import types

    from recursa.core.batch.executors import RayExecutor
    started: list[str | None] = []
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: False                                # type: ignore[attr-defined]
    ray.init = lambda address=None, **kw: started.append(address)    # type: ignore[attr-defined]
    ray.shutdown = lambda: None                                       # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)

    def warnings(mode: str | None, address: str | None = None) -> list[str]:
        if mode is None:
            monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        else:
            monkeypatch.setenv("RAY_AUTH_MODE", mode)
        caplog.clear()
        ex = RayExecutor(address, fn=dict, on_error=lambda spec, msg: {})
        with caplog.at_level("WARNING", logger="recursa.batch"), ex.connected():
            pass
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]

    said = warnings("disabled")
    assert len(said) == 1 and "RAY_AUTH_MODE=disabled" in said[0], said
    assert "every network interface" in said[0] and "--address" in said[0]
    assert warnings(None) == [] and warnings("token") == [] and warnings(" Token ") == []
    assert warnings("disabled", address="ray://head:10001") == []    # the user's own cluster
    assert started == [None] * 4 + ["ray://head:10001"]
