"""Crash safety: a killed host leaves a loadable trace; a killed worker is restarted and the
model told what was lost; Ctrl-C ends a CLI run with the partial answer, spend and trace path."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers_procs import alive
from helpers_sandbox import MODES
from helpers_signals import default_sigint
from helpers_wait import wait_until
from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load
from recursa.sandbox import LocalSandbox
from recursa.sandbox.transport import descendants

ROOT = Path(__file__).resolve().parent.parent

HOST = """
import sys
from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.sandbox import LocalSandbox

code = "```repl\\nimport time\\nprint('working')\\ntime.sleep(300)\\n```"
first = "```repl\\nx = llm_query('warm up')\\nprint(x)\\n```"
replies = iter([first, code])
client = ReplayClient(lambda m: next(replies) if 'persistent Python REPL' in m[0]['content']
                      else 'warm', cost_usd=0.01)
RLM(model=client, sandbox=lambda: LocalSandbox(isolation=sys.argv[2]),
    trace_path=sys.argv[1], cell_timeout=600).completion("q", context="ctx")
"""


def kill_host_mid_cell(tmp_path, mode):
    """Start a host running a two-turn RLM, SIGKILL it while its second cell sleeps."""
    trace = tmp_path / "t.jsonl"
    script = tmp_path / "host.py"
    script.write_text(HOST)
    host = subprocess.Popen([sys.executable, str(script), str(trace), mode])

    def second_cell_started() -> bool:
        if not trace.exists():
            return False
        starts = [json.loads(line) for line in trace.read_text().splitlines()
                  if '"kind":"cell"' in line and '"phase":"start"' in line]
        return len(starts) >= 2

    try:
        assert wait_until(second_cell_started), "the run never reached its second cell"
        tree = descendants(host.pid)
        time.sleep(0.3)
    finally:
        host.kill()
        host.wait()
    return trace, tree


@pytest.mark.parametrize("mode", MODES)
def test_killed_host_leaves_a_loadable_trace_and_no_worker(mode, tmp_path):
    trace, tree = kill_host_mid_cell(tmp_path, mode)
    run = load(trace)
    assert not run.finished and run.status is None
    assert run.totals.turns == 2 and run.totals.subcalls == 1
    # both turns (the open one too: its usage is written before its cells run) and the sub-call
    assert run.by_role["sub"].calls == 1 and run.totals.cost_usd == pytest.approx(0.03)
    open_kinds = sorted(n.kind for n in run.open_nodes)
    assert open_kinds == ["cell", "run", "turn"]
    # the last event written is the one the loader ends with
    last = json.loads(trace.read_text().splitlines()[-1])
    assert max(n.start or 0 for n in run.nodes.values()) == pytest.approx(last["t"])
    # the worker died with its host
    assert wait_until(lambda: not any(alive(p) for p in tree),
                    10)


def test_killed_host_trace_counts_the_turn_whose_cell_was_running(tmp_path):
    trace, _ = kill_host_mid_cell(tmp_path, MODES[0])
    run = load(trace)
    assert run.totals.cost_usd == pytest.approx(0.03)
    assert run.by_role["root"].calls == 2


def test_torn_last_line_still_loads(tmp_path):
    client = ReplayClient(["```repl\nprint(1)\n```", "```repl\nFINAL('x')\n```"])
    trace = tmp_path / "t.jsonl"
    RLM(model=client, sandbox="inprocess", trace_path=trace).completion("q", context="c")
    text = trace.read_text()
    trace.write_text(text[: len(text) - 40])           # killed mid-write
    run = load(trace)
    assert run.torn and run.totals.turns == 2


@pytest.mark.parametrize("mode", MODES)
def test_worker_killed_mid_cell_is_restarted_and_the_model_told(mode, tmp_path):
    made: list[LocalSandbox] = []

    def sandbox():
        sb = LocalSandbox(isolation=mode)
        made.append(sb)
        return sb

    replies = iter([
        "```repl\nkept = 1\nother = 2\n```",
        "```repl\nimport time\ntime.sleep(60)\n```",
        "```repl\nprint(sorted(k for k in ('kept', 'other') if k in dir()), len(context))\n```",
        "```repl\nFINAL('after restart')\n```",
    ])
    client = ReplayClient(lambda m: next(replies))
    trace = tmp_path / "t.jsonl"

    def killer() -> None:
        def sleeping() -> bool:
            return trace.exists() and trace.read_text().count('"kind":"cell"') >= 3
        if wait_until(sleeping):
            time.sleep(0.3)
            for pid in made[0].processes():   # the worker's tree, however it was started
                with contextlib.suppress(ProcessLookupError):   # gone with its namespace's init
                    os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=killer)
    t.start()
    res = RLM(model=client, sandbox=sandbox, trace_path=trace, cell_timeout=120).completion(
        "q", context="0123456789")
    t.join()
    assert res.status == "final" and res.answer == "after restart"
    told = client.calls[2][-1]["content"]
    assert "died while running this cell" in told and "SIGKILL" in told
    assert "these variables were lost: kept, other" in told
    assert "[] 10" in client.calls[3][-1]["content"]   # context reloaded, variables gone
    run = load(trace)
    cells = [n for n in run.nodes.values() if n.kind == "cell"]
    assert [c.data.get("restarted") for c in cells] == [False, True, False, False]


REPLIES = [
    "```repl\nanswer['content'] = 'partial draft'\nprint('drafted')\n```",
    "```repl\nimport time\ntime.sleep(300)\n```",
]


def test_ctrl_c_ends_a_cli_run_with_partial_answer_spend_and_trace(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(REPLIES))
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("some context")
    trace = tmp_path / "t.jsonl"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "recursa.cli", "run", "what?", "--context", str(ctx),
         "--model", f"replay-file:{script}", "--trace", str(trace), "--sandbox", "local"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        preexec_fn=default_sigint)
    try:
        ok = wait_until(lambda: trace.exists() and trace.read_text().count('"kind":"cell"') >= 3)
        assert ok, "the CLI run never reached its sleeping cell"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert str(trace) in err
    assert "partial draft" in out
    assert "turns" in err or "tokens" in err or "$" in err   # the spend summary
    run = load(trace)
    assert run.totals.turns == 2
