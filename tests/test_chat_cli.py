"""`recursa chat` as a user runs it: a real subprocess reading stdin, a real local sandbox, a
scripted model behind a real OpenAI-protocol HTTP server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers_scripted import repl
from helpers_signals import default_sigint
from openai_testserver import OpenAITestServer

BIN = [sys.executable, "-m", "recursa.cli"]


class Script:
    """Root replies chosen by the question in the first user message; `slow` waits until
    released (the test interrupts it)."""

    def __init__(self) -> None:
        self.slow_seen = threading.Event()
        self.release = threading.Event()

    def __call__(self, req: dict) -> str:
        first = req["messages"][1]["content"]
        if "Query: set x" in first:
            return repl('x = 41\nFINAL("x is set")')
        if "Query: x plus one" in first:
            return repl("FINAL(str(x + 1) + ' after ' + session_history[-1]['query'])")
        if "Query: slow" in first:
            self.slow_seen.set()
            self.release.wait(30)
            return repl('FINAL("too late")')
        return repl('FINAL("?")')


def test_chat_keeps_the_session_and_ctrl_c_cancels_only_the_question(tmp_path: Path):
    ctx = tmp_path / "doc.txt"
    ctx.write_text("some document\n" * 50)
    trace = tmp_path / "chat.jsonl"
    script = Script()
    with OpenAITestServer(responder=script) as srv:
        p = subprocess.Popen(
            BIN + ["chat", "--context", str(ctx), "--model", "openai:scripted", "--base-url",
                   srv.base_url, "--trace", str(trace)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "OPENAI_API_KEY": "test-key"}, preexec_fn=default_sigint)
        try:
            assert p.stdin is not None
            p.stdin.write(b"set x\nslow one\n")
            p.stdin.flush()
            assert script.slow_seen.wait(60), "the slow question never reached the model"
            time.sleep(0.2)       # let the client settle into waiting for the reply
            p.send_signal(signal.SIGINT)
            p.stdin.write(b"x plus one\n/cost\n/trace\n/nonsense\n/quit\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=60)
        finally:
            script.release.set()
            if p.poll() is None:
                p.kill()
    out_s, err_s = out.decode(), err.decode()
    assert p.returncode == 0, err_s
    lines = out_s.splitlines()
    assert lines[0] == "x is set"
    # the question after the interrupted one still sees `x` and the history
    assert lines[1] == "42 after set x"
    assert "cancelled" in err_s and "the session goes on" in err_s
    assert "too late" not in out_s
    assert "2 question(s)" in out_s or "3 question(s)" in out_s     # /cost
    assert str(trace) in out_s                                       # /trace
    assert "unknown command /nonsense" in err_s
    from recursa.obs.trace import load_runs
    runs = load_runs(trace)
    assert [r.answer for r in runs if r.finished and r.status == "final"] == \
        ["x is set", "42 after set x"]


def test_chat_refuses_a_missing_context(tmp_path: Path):
    p = subprocess.run(BIN + ["chat", "--context", str(tmp_path / "nope.txt"), "--model",
                              "openai:x", "--base-url", "http://127.0.0.1:9/v1"],
                       input=b"", capture_output=True, timeout=60)
    assert p.returncode == 2
    assert "that file or directory does not exist" in " ".join(p.stderr.decode().split())


def test_chat_shows_a_models_escape_sequences_as_text(tmp_path: Path):
    """An answer holding an OSC 52 clipboard write, cursor moves and a one-byte CSI (U+009B)
    is printed, and listed by /history, as visible text."""
    import json
    ctx = tmp_path / "doc.txt"
    ctx.write_text("some document\n")
    evil = "ok\x1b]52;c;ZXZpbA==\x07\x1b[2A\x9b2Kdone"
    model = tmp_path / "script.json"
    model.write_text(json.dumps([repl(f"FINAL({evil!r})")] * 2))
    p = subprocess.run(BIN + ["chat", "--context", str(ctx), "--model", f"replay-file:{model}",
                              "--sandbox", "inprocess", "--trace", str(tmp_path / "t.jsonl")],
                       input=b"what is it?\n/history\n/quit\n", capture_output=True, timeout=60)
    out = p.stdout.decode()
    assert p.returncode == 0, p.stderr.decode()
    shown = "ok\\x1b]52;c;ZXZpbA==\\x07\\x1b[2A\\x9b2Kdone"
    assert out.splitlines()[0] == shown, out
    assert f"-> {shown}" in out                                      # /history
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
