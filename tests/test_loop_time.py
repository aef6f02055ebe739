"""`max_seconds` cuts what is in flight: root calls, sub-calls, child RLMs and running cells.

The models are a real OpenAI-protocol HTTP server (tests/openai_testserver.py) that holds the
requests it is told to (it sleeps), reached through the real OpenAIClient; the sandbox is the
real local one. Each test checks the run's wall time against the promise: at most 1 s past
`max_seconds`, the one last-answer turn included (its time is reserved inside the limit,
recursa.core.deadline). Before this promise a call cut by its client's timeout was retried, and the
last-answer turn came on top of the limit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from helpers_scripted import repl
from openai_testserver import Fault, OpenAITestServer
from recursa import RLM
from recursa.models.openai_client import OpenAIClient
from recursa.obs.trace import load

MAX_S = 1.5
SLACK = 1.0          # the promise: at most 1 s past max_seconds (+ the last turn)
HANG = Fault.hang(60)


def _user(req: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in req["messages"] if m["role"] == "user")


def responder(*turns: str, last: Any = "The answer is 7.", child: Any = HANG):
    """Root turns get `turns` in order, then hang; the last-answer turn gets `last`; a child
    RLM's turns get `child`; sub-calls (no system prompt) hang."""
    def respond(req: dict[str, Any]) -> Any:
        msgs = req["messages"]
        if msgs[0]["role"] != "system":
            return HANG                                 # a sub-call
        if "reached its limit" in msgs[-1]["content"]:
            return last
        if "child task" in _user(req):
            return child
        i = len(msgs) // 2 - 1
        return turns[i] if i < len(turns) else HANG
    return respond


def run(srv: OpenAITestServer, tmp_path: Path, *, sandbox: str = "local",
        **kw: Any) -> tuple[Any, float, Any]:
    client = OpenAIClient("slow-model", base_url=srv.base_url, api_key="sk-test-time",
                          max_retries=3, retry_base_delay=0.01, timeout=60.0)
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=client, sandbox=sandbox, trace_path=trace,
              **{"max_seconds": MAX_S, "last_turn_seconds": 1.0, **kw})
    t0 = time.monotonic()
    res = rlm.completion("What is the number?", context="the number is 7\n" * 50)
    return res, time.monotonic() - t0, load(trace)


def assert_clean_trace(tr: Any) -> None:
    """Every span ended, the run's end last: nothing was left running behind the result."""
    assert tr.finished and not tr.open_nodes, [n.kind for n in tr.open_nodes]
    assert tr.status in ("limit", "extracted")


def test_a_hung_root_call_is_cut_at_the_limit(tmp_path: Path) -> None:
    with OpenAITestServer(responder=lambda req: HANG if "reached its limit" not in
                          req["messages"][-1]["content"] else "The answer is 7.") as srv:
        res, wall, tr = run(srv, tmp_path)
    assert wall < MAX_S + SLACK + 1.0, wall          # + the (fast) last-answer turn
    assert (res.status, res.limit) == ("limit", "max_seconds")
    assert (res.answer, res.answer_source) == ("The answer is 7.", "extraction_turn")
    # the cut call was not retried: one root request, then the last-answer turn
    assert len(srv.requests) == 2
    assert_clean_trace(tr)
    turns = [n for n in tr.walk() if n.kind == "turn"]
    assert "max_seconds" in turns[0].data["error"]


def test_a_hung_subcall_and_its_cell_are_cut(tmp_path: Path) -> None:
    code = 'answer["content"] = "draft 7"\nprint(llm_query("read this"))'
    with OpenAITestServer(responder=responder(repl(code))) as srv:
        res, wall, tr = run(srv, tmp_path)
    assert wall < MAX_S + SLACK + 1.0, wall
    assert (res.status, res.limit, res.answer) == ("limit", "max_seconds", "The answer is 7.")
    assert_clean_trace(tr)
    cell = next(n for n in tr.walk() if n.kind == "cell")
    sub = next(n for n in tr.walk() if n.kind == "subcall")
    assert "max_seconds" in cell.data["error"] and cell.data["timed_out"]
    assert "max_seconds" in sub.data["error"]


def test_a_hung_child_rlm_is_cut(tmp_path: Path) -> None:
    code = 'print(rlm_query("child task: find the number"))'
    with OpenAITestServer(responder=responder(repl(code))) as srv:
        res, wall, tr = run(srv, tmp_path, max_depth=1)
    assert wall < MAX_S + SLACK + 1.0, wall
    assert (res.status, res.limit) == ("limit", "max_seconds")
    assert_clean_trace(tr)
    child = next(n for n in tr.walk() if n.kind == "child")
    assert child.data["status"] == "limit"
    # the child's span ended before the run's
    assert child.end is not None and tr.end is not None and child.end <= tr.end


@pytest.mark.parametrize("sandbox", ["local", "inprocess"])
def test_a_running_cell_is_cut(tmp_path: Path, sandbox: str) -> None:
    code = "import time\nwhile True:\n    time.sleep(0.05)"
    with OpenAITestServer(responder=responder(repl(code))) as srv:
        res, wall, tr = run(srv, tmp_path, sandbox=sandbox, cell_timeout=60)
    assert wall < MAX_S + SLACK + 1.0, wall
    assert (res.status, res.limit) == ("limit", "max_seconds")
    assert_clean_trace(tr)


def test_the_last_turn_is_cut_inside_the_limit_and_the_draft_stays(tmp_path: Path) -> None:
    # a cell cut at the limit loses what it did (its worker is stopped): the draft is set by
    # the turn before
    turns = [repl('answer["content"] = "draft 7"\nprint("ok")'), repl('llm_query("read")')]
    with OpenAITestServer(responder=responder(*turns, last=HANG)) as srv:
        res, wall, tr = run(srv, tmp_path, last_turn_seconds=1.0)
    assert wall < MAX_S + SLACK, wall   # the hung last turn is cut at max_seconds
    assert (res.status, res.limit) == ("limit", "max_seconds")
    assert (res.answer, res.answer_source) == ("draft 7", "answer_variable")
    assert_clean_trace(tr)
    last = [n for n in tr.walk() if n.kind == "turn"][-1]
    assert last.data.get("last") and "max_seconds" in last.data["error"]


@pytest.mark.model
def test_local_model_run_stops_near_its_time_limit(tmp_path: Path) -> None:
    """The real local model (≈10 tokens/s on 2 cores): a 20 s limit ends the run within 1 s
    of it, the last-answer turn included."""
    trace = tmp_path / "t.jsonl"
    ctx = "".join(f"record {i}: the value of key-{i} is {i * 7 % 1000}\n" for i in range(3000))
    rlm = RLM(model="local:qwen2.5-coder-1.5b", sandbox="local", trace_path=trace,
              max_seconds=20)
    t0 = time.monotonic()
    res = rlm.completion("Add up every value whose key number is a multiple of 7 and explain "
                         "each step in detail.", context=ctx)
    wall = time.monotonic() - t0
    assert res.elapsed_s < 20 + SLACK, res.elapsed_s      # the run itself keeps the promise
    # the call returns once the event loop has shut down: a llama-server still starting (a
    # cold, loaded machine) no longer holds it up (tests/test_local_start.py)
    assert wall < 20 + SLACK + 1.0, wall
    tr = load(trace)
    assert tr.finished and not tr.open_nodes
    if res.status != "final":
        assert res.limit == "max_seconds"
        assert "```" not in res.answer     # clean text, never a raw reply
