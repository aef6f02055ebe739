"""`recursa run` as a user runs it: a real subprocess, a scripted model from a JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = [sys.executable, "-m", "recursa.cli"]


def script(tmp_path: Path, replies: list[str]) -> str:
    p = tmp_path / "script.json"
    p.write_text(json.dumps(replies))
    return f"replay-file:{p}"


def run(args: list[str], stdin: bytes | None = None, env: dict | None = None):
    return subprocess.run(BIN + args, input=stdin, capture_output=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_run_prints_answer_on_stdout_and_summary_on_stderr(tmp_path: Path):
    ctx = tmp_path / "doc.txt"
    ctx.write_text("the magic word is xylophone\n" * 100)
    model = script(tmp_path, ["```repl\nimport re\nw = re.search(r'is (\\w+)', context)"
                              ".group(1)\nFINAL(w)\n```"])
    trace = tmp_path / "t.jsonl"
    p = run(["run", "What is the magic word?", "--context", str(ctx), "--model", model,
             "--trace", str(trace)])
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "xylophone"
    err = p.stderr.decode()
    assert "status final" in err and "turns 1" in err
    assert trace.exists() and trace.stat().st_size > 0


def test_context_from_stdin(tmp_path: Path):
    model = script(tmp_path, ["```repl\nFINAL(str(len(context)))\n```"])
    p = run(["run", "How long?", "--context", "-", "--model", model, "-q"], stdin=b"abcdef")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "6"


def test_missing_context_file_is_a_clear_error(tmp_path: Path):
    model = script(tmp_path, ["x"])
    p = run(["run", "q", "--context", str(tmp_path / "nope.txt"), "--model", model])
    assert p.returncode == 2
    assert "does not exist" in p.stderr.decode()
    assert p.stdout.decode() == ""


def test_binary_context_and_bad_model_spec(tmp_path: Path):
    b = tmp_path / "x.bin"
    b.write_bytes(b"\x00\x01\x02binary")
    model = script(tmp_path, ["x"])
    p = run(["run", "q", "--context", str(b), "--model", model])
    assert p.returncode == 2 and "binary" in p.stderr.decode()
    p = run(["run", "q", "--context", str(b), "--model", "gpt-5"])
    assert p.returncode == 2 and "prefix" in p.stderr.decode()


def test_failed_run_exits_nonzero_and_keeps_trace(tmp_path: Path):
    # the script runs out after one turn: the model "fails" on the second call
    model = script(tmp_path, ['```repl\nanswer["content"] = "half"\n```'])
    trace = tmp_path / "t.jsonl"
    p = run(["run", "q", "--context", "-", "--model", model, "--trace", str(trace), "-q"],
            stdin=b"data")
    assert p.returncode == 1
    assert "run failed" in p.stderr.decode()
    assert p.stdout.decode().strip() == "half"      # the partial answer is not lost
    assert trace.stat().st_size > 0


def test_no_model_and_no_keys_picks_local_model_and_says_so(tmp_path: Path):
    env = {k: "" for k in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    p = run(["run", "q", "--context", str(tmp_path / "missing.txt")], env=env)
    assert "using local:qwen2.5-coder-1.5b" in p.stderr.decode()


def test_a_missing_local_model_file_fails_before_any_work(tmp_path: Path):
    ctx = tmp_path / "c.txt"
    ctx.write_text("data")
    p = run(["run", "q", "--context", str(ctx), "--model", f"local:{tmp_path}/absent.gguf"])
    assert p.returncode == 2 and "no such model file" in p.stderr.decode()
