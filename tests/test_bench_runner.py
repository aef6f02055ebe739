"""Bench runner end to end with a scripted model: rows, resume, torn lines, concurrency, a real
kill mid-run and resume, the CLI, and the report (tables, CI, PNG plots)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from recursa.bench import runner
from recursa.bench.methods import MethodConfig
from recursa.bench.report import bootstrap_ci, report, summarise
from recursa.bench.runner import (
    AsyncioExecutor,
    ResultsFile,
    load_rows,
    make_specs,
    parse_length,
    row_key,
    run_bench,
)
from recursa.cli import main

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"
RESPONDER = "helpers_scripted:sniah_model"     # plays every method's part on S-NIAH

ROW_FIELDS = {"key", "task", "length", "seed", "method", "model", "score", "answer", "gold",
              "status", "error", "cost_usd", "root_input_tokens", "root_output_tokens",
              "sub_input_tokens", "sub_output_tokens", "tokens", "turns", "subcalls", "wall_s",
              "trace_path", "metrics", "limit", "code_version"}


def configs(*methods: str, **kw: Any) -> list[MethodConfig]:
    from recursa.bench.methods import parse_method
    out = []
    for m in methods:
        name, depth, trunc = parse_method(m)
        out.append(MethodConfig(method=name, depth=depth, truncate=trunc, model="replay:",
                                sandbox="inprocess", limits={"max_iterations": 3},
                                client_options={"responder": RESPONDER, **kw}))
    return out


def test_parse_length_and_key() -> None:
    assert parse_length("8k") == 8192 and parse_length("1m") == 2**20
    assert parse_length("5000") == 5000 and parse_length("1.5k") == 1536
    with pytest.raises(ValueError):
        parse_length("big")
    assert row_key("sniah", 8192, 0, "rlm", "m") == "sniah|8192|0|rlm|m"


def test_end_to_end_rows_resume_and_report(tmp_path: Path) -> None:
    specs = make_specs(["sniah"], [1024, 2048], range(2),
                       configs("rlm", "direct", "compaction", "codeact-bm25"),
                       str(tmp_path / "traces"))
    assert len(specs) == 16
    s = run_bench(specs, tmp_path, executor=AsyncioExecutor(4), progress=False)
    assert s == {"total": 16, "skipped": 0, "ran": 16, "errors": 0}
    rows = load_rows(tmp_path)
    assert len(rows) == 16
    for r in rows:
        assert ROW_FIELDS <= set(r)
        assert r["score"] == 1.0 and r["status"] == "final" and r["answer"] == r["gold"]
        assert r["root_input_tokens"] > 0 and Path(r["trace_path"]).exists()
    assert all(r["sub_input_tokens"] > 0 for r in rows if r["method"] == "rlm")
    # resume: nothing is redone, nothing is appended
    lines = (tmp_path / "rows.jsonl").read_text().count("\n")
    s2 = run_bench(specs, tmp_path, progress=False)
    assert s2["ran"] == 0 and s2["skipped"] == 16
    assert (tmp_path / "rows.jsonl").read_text().count("\n") == lines

    out = report(tmp_path, out_dir=tmp_path / "rep")
    md = (tmp_path / "rep" / "results.md").read_text()
    assert "### sniah" in md and "| rlm | 1k | 2 | 1.00 | [1.00, 1.00]" in md
    for name in ("score_vs_length.png", "cost_vs_score.png"):
        assert (tmp_path / "rep" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["rows"] == 16


def test_torn_last_line_is_repaired(tmp_path: Path) -> None:
    f = tmp_path / "rows.jsonl"
    good = [{"key": f"k{i}", "score": 1.0, "status": "final"} for i in range(2)]
    f.write_text("".join(json.dumps(r) + "\n" for r in good) + '{"key": "k2", "sco')
    rf = ResultsFile(f)
    assert set(rf.rows) == {"k0", "k1"} and rf.skipped_lines == 1
    rf.append({"key": "k2", "score": 0.5, "status": "final"})
    rf.close()
    lines = f.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x) for x in lines)
    assert {r["key"] for r in load_rows(f)} == {"k0", "k1", "k2"}


def test_retry_errors_redoes_failed_rows_only(tmp_path: Path) -> None:
    bad = MethodConfig(method="direct", model="nope:model")    # no such provider: every row fails
    specs = make_specs(["sniah"], [1024], range(2), [bad, *configs("direct")], None)
    s = run_bench(specs, tmp_path, progress=False)
    assert s["errors"] == 2
    rows = {r["key"]: r for r in load_rows(tmp_path)}
    failed = [r for r in rows.values() if r["model"] == "nope:model"]
    assert all(r["status"] == "error" and "unknown prefix" in r["error"] for r in failed)
    assert all(r["score"] == 0.0 and r["traceback"] for r in failed)
    assert run_bench(specs, tmp_path, progress=False)["ran"] == 0
    assert run_bench(specs, tmp_path, progress=False, retry_errors=True)["ran"] == 2


def test_direct_overflow_rows_and_report(tmp_path: Path) -> None:
    cfgs = configs("direct", "rlm")
    cfgs[0] = cfgs[0].model_copy(update={"window_tokens": 2000})
    specs = make_specs(["sniah"], [1024, 4096], range(2), cfgs, None)
    run_bench(specs, tmp_path, progress=False)
    rows = load_rows(tmp_path)
    over = [r for r in rows if r["limit"] == "context_window"]
    assert {(r["method"], r["length"]) for r in over} == {("direct", 4096)}
    assert all(r["status"] == "error" and r["score"] == 0 and r["tokens"] == 0 for r in over)
    cells = {(c.method, c.length): c for c in summarise(rows)}
    assert cells[("direct", 4096)].overflow == 2 and cells[("direct", 4096)].mean == 0.0
    assert cells[("rlm", 4096)].mean == 1.0
    assert "2 (2 over window)" in (report(tmp_path, plots=False)["markdown"]).read_text()


def test_executor_runs_at_most_concurrency_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    live = peak = 0

    async def fake(spec: dict[str, Any]) -> dict[str, Any]:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.05)
        live -= 1
        return {"key": spec["key"]}

    monkeypatch.setattr(runner, "arun_instance", fake)
    got: list[str] = []
    AsyncioExecutor(3).run([{"key": str(i)} for i in range(12)], lambda r: got.append(r["key"]))
    # 3 live at once: overlapped, not one after another (counted, not timed)
    assert peak == 3 and sorted(got, key=int) == [str(i) for i in range(12)]


def test_instances_overlap_with_a_slow_model(tmp_path: Path) -> None:
    """Every instance starts before the first one ends (their rows' own clocks), not a wall
    time: under CI's load the whole run once took 1.5 s for 4 x 0.3 s of latency."""
    specs = make_specs(["sniah"], [1024], range(4), configs("direct", latency=0.3), None)
    run_bench(specs, tmp_path, executor=AsyncioExecutor(4), progress=False)
    rows = load_rows(tmp_path)
    assert len(rows) == 4 and all(r["score"] == 1.0 for r in rows)
    assert max(r["started_at"] for r in rows) < min(r["finished_at"] for r in rows)


def test_bootstrap_ci() -> None:
    assert bootstrap_ci([1.0]) == (1.0, 1.0)
    assert bootstrap_ci([0.0, 0.0, 0.0]) == (0.0, 0.0)
    vals = [1.0] * 7 + [0.0] * 3
    lo, hi = bootstrap_ci(vals)
    assert 0.3 <= lo < 0.7 < hi <= 1.0
    assert bootstrap_ci(vals) == (lo, hi)              # seeded: reproducible


def _cli_args(out: Path, n: int, *extra: str, baselines: bool = False) -> list[str]:
    return ["bench", "run", "--task", "sniah", "--lengths", "1k,2k", "--method", "rlm,direct",
            "-n", str(n), "--out", str(out), "--model", "replay:", "--sandbox", "inprocess",
            "--client-option", f"responder={RESPONDER}", "--max-iterations", "3",
            *([] if baselines else ["--no-baselines"]), *extra]


def test_cli_run_list_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """By default the no-model baselines that apply run beside the methods, under the model
    'none' (on S-NIAH's one code: grep, regex, constant and embed), and the report sets each
    method against the best of them."""
    assert main(_cli_args(tmp_path, 2, "--no-progress", baselines=True)) == 0
    rows = load_rows(tmp_path)
    assert len(rows) == 8 + 2 * 2 * 4
    assert {r["method"] for r in rows} == {"rlm", "direct", "grep", "regex", "constant", "embed"}
    base = [r for r in rows if r["method"] in ("grep", "regex", "constant", "embed")]
    assert len(base) == 16 and {r["model"] for r in base} == {"none"}
    assert all(r["tokens"] == 0 and r["cost_usd"] == 0 and r["status"] == "final"
               for r in base)
    # S-NIAH is the task a grep passes: regex finds its only 7-digit number every time
    assert all(r["score"] == 1.0 for r in base if r["method"] == "regex")
    assert main(["bench", "report", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "sniah" in out and "bootstrap" in out and "direct" in out
    # the scripted model answers right too, so it ties regex: not above it, said so
    md = (tmp_path / "results.md").read_text()
    assert "| rlm | all | 4 | 1.00 | [1.00, 1.00] | NOT above" in md and "(baseline)" in md
    # the constant never sees the instance's own gold: S-NIAH's codes are random
    assert all(r["score"] == 0.0 for r in base if r["method"] == "constant")
    assert main(["bench", "list"]) == 0
    assert "codeact-bm25" in capsys.readouterr().out
    assert main(["bench", "run", "--task", "nope", "--out", str(tmp_path),
                 "--model", "replay:"]) == 2


@pytest.mark.slow
def test_kill_mid_run_then_resume(tmp_path: Path) -> None:
    """SIGKILL the runner while instances are in flight; a second run finishes the rest without
    redoing or losing any finished row."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(SRC)])}
    cmd = [sys.executable, "-m", "recursa.cli",
           *_cli_args(tmp_path, 6, "--no-progress", "--concurrency", "2", "--client-option",
                      "latency=0.15")]
    rows_file = tmp_path / "rows.jsonl"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if rows_file.exists() and rows_file.read_text().count("\n") >= 5:
            break
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["key"]: r for r in load_rows(rows_file)}
    assert 5 <= len(before) < 24, len(before)

    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"{24 - len(before)} run, {len(before)} already done" in res.stderr
    after = {r["key"]: r for r in load_rows(rows_file)}
    assert len(after) == 24 and all(r["score"] == 1.0 for r in after.values())
    for k, r in before.items():      # finished rows were kept as they were, not redone
        assert after[k]["finished_at"] == r["finished_at"]
    lines = [ln for ln in rows_file.read_text().splitlines() if ln.strip()]
    assert len(lines) == 24 and all(json.loads(ln) for ln in lines)


def test_run_instance_is_a_plain_picklable_function() -> None:
    """The Ray seam: a top-level function of a JSON-able dict, returning a JSON-able row."""
    import pickle
    spec = make_specs(["sniah"], [1024], [5], configs("direct"), None)[0]
    spec = json.loads(json.dumps(spec))
    fn = pickle.loads(pickle.dumps(runner.run_instance))
    row = fn(spec)
    assert row["key"] == spec["key"] and row["score"] == 1.0
    json.dumps(row)


def test_progress_bar_on_a_non_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_cli_args(tmp_path, 1)) == 0
    err = capsys.readouterr().err
    assert "4 run, 0 already done, 0 errors" in err


def test_cli_run_exits_nonzero_when_rows_failed_and_says_why(tmp_path: Path) -> None:
    """A real `recursa bench run` process: direct rows that cannot fit a 100-token window fail;
    the command says how many and why, and exits 1; a rerun that skips them all exits 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(SRC)])}
    cmd = [sys.executable, "-m", "recursa.cli", *_cli_args(tmp_path, 2, "--no-progress",
                                                           "--window", "100")]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "4 of 8 rows failed" in res.stderr
    reasons = [ln for ln in res.stderr.splitlines() if ln.startswith("  ")]
    assert len(reasons) == 2         # one per input length, each with its count
    assert all(ln.startswith("  2 x input of ~") and ln.endswith("exceeds the model's window "
                                                                 "of 100 tokens") for ln in reasons)
    rows = load_rows(tmp_path)
    assert sum(r["status"] == "error" for r in rows) == 4
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "0 run, 8 already done" in again.stderr


def test_failure_reasons_groups_and_counts() -> None:
    from recursa.frontend.failures import failure_reasons
    rows = [{"error": "boom"}] * 3 + [{"error": "bang  \n twice"}] * 2 + [{}]
    assert failure_reasons(rows) == [("boom", 3), ("bang twice", 2), ("unknown error", 1)]
    many = [{"error": f"e{i}"} for i in range(8)]
    assert failure_reasons(many, top=5)[-1] == ("(other reasons: 3)", 3)


def _run_args(*extra: str) -> Any:
    from recursa.cli import build_parser
    from recursa.frontend.options import RLMOptions
    a = build_parser().parse_args(["bench", "run", "--task", "para_niah", "--out", "x", *extra])
    return a, RLMOptions.from_args(a)


def test_window_is_one_for_every_method() -> None:
    """--window loads a local model with that n_ctx and is direct's window too; --n-ctx alone
    is also direct's window."""
    from recursa.bench.cli import method_configs
    a, opts = _run_args("--model", "local:qwen2.5-coder-1.5b", "--method", "rlm,direct,grep",
                        "--window", "4096")
    configs, baselines = method_configs(a, opts)
    assert a.split == "test"            # published tables are the test split unless told
    assert [c.method for c in configs] == ["rlm", "direct"]
    assert baselines == ["grep", "regex", "constant", "lexicon", "embed", "classifier"]  # grep once
    assert all(c.client_options["n_ctx"] == 4096 and c.window_tokens == 4096 for c in configs)
    a, opts = _run_args("--model", "local:qwen2.5-coder-1.5b", "--n-ctx", "8192",
                        "--method", "direct", "--no-baselines")
    configs, baselines = method_configs(a, opts)
    assert configs[0].window_tokens == 8192 and baselines == []


def test_split_keys_and_task_options() -> None:
    """Test rows keep the five-part key (old results files resume); dev rows are keyed apart;
    only the held-out families take --split dev."""
    cfg = configs("direct")
    test = make_specs(["para_niah"], [2048], [0], cfg, None, split="test", baselines=["grep"])
    dev = make_specs(["para_niah"], [2048], [0], cfg, None, split="dev", baselines=["grep"])
    assert [s["key"] for s in test] == ["para_niah|2048|0|direct|replay:",
                                        "para_niah|2048|0|grep|none"]
    assert [s["key"] for s in dev] == ["para_niah|2048|0|direct|replay:|dev",
                                       "para_niah|2048|0|grep|none|dev"]
    assert dev[0]["task_options"] == {"split": "dev"}
    old = make_specs(["sniah"], [2048], [0], cfg, None, split="test")
    assert old[0]["task_options"] == {} and old[0]["key"] == "sniah|2048|0|direct|replay:"
    with pytest.raises(ValueError, match="no dev/test split"):
        make_specs(["sniah"], [2048], [0], cfg, None, split="dev")
    row = runner.run_instance(json.loads(json.dumps(dev[1])))
    assert row["split"] == "dev" and row["method"] == "grep" and row["model"] == "none"
    assert row["tokens"] == 0 and row["trace_path"] is None
