"""Streaming: clients stream over real local servers (OpenAI SSE, Anthropic SSE, llama.cpp), with
the usage and cost of the non-streaming path; a run with a live sink sees the root's reply while
the turn is open, and the trace file holds no delta; the response cache replays a hit as one
delta; a stream cut mid-way is retried or reported clearly."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from openai_testserver import Fault, OpenAITestServer
from recursa import RLM
from recursa.base.types import Event, ModelError
from recursa.models.anthropic_client import AnthropicClient
from recursa.models.cache import CachedClient, ResponseCache
from recursa.models.openai_client import OpenAIClient
from recursa.models.replay import ReplayClient
from recursa.models.streaming import StreamCut, complete_streaming
from recursa.obs.console import ConsoleView
from recursa.obs.jsonl_view import JsonLinesView
from recursa.obs.streaming import DeltaEmitter, StreamedText
from recursa.obs.trace import JsonlSink, Tracer, read_trace

MSGS = [{"role": "system", "content": "be brief"},
        {"role": "user", "content": "say something long enough to stream in pieces"}]
PRICES = {"m": {"input": 1.0, "output": 4.0, "cached_input": 0.25}}
REPLY = "Let me look.\n```repl\nx = 6 * 7\nprint(x)\n```\n"


@pytest.fixture
def srv():
    with OpenAITestServer(stream_chunk_chars=4, cached_tokens=3) as s:
        yield s


def _collect() -> tuple[list[tuple[str, int]], Any]:
    got: list[tuple[str, int]] = []
    return got, lambda piece, offset: got.append((piece, offset))


async def _stream_and_complete(c: Any, **opts: Any) -> tuple[list[tuple[str, int]], Any, Any]:
    """A streamed and then a plain completion of MSGS from client `c`, closed after:
    (the deltas, the streamed completion, the plain one)."""
    try:
        got, on_delta = _collect()
        streamed = await c.astream(MSGS, on_delta, **opts)
        plain = await c.complete(MSGS, **opts)
    finally:
        await c.aclose()
    return got, streamed, plain


def _assert_same_completion(got: list[tuple[str, int]], streamed: Any, plain: Any,
                            cached_tokens: int) -> None:
    """The deltas make up the streamed text, which is the plain call's; usage (with its cached
    tokens) and a known cost are the same both ways."""
    assert len(got) > 3 and "".join(p for p, _ in got) == streamed.text == plain.text
    assert streamed.usage == plain.usage and streamed.usage.cached_tokens == cached_tokens
    assert streamed.cost_usd == plain.cost_usd and streamed.cost_usd > 0


# ---------------------------------------------------------------- clients
async def test_openai_stream_same_completion_as_complete(srv):
    c = OpenAIClient("m", base_url=srv.base_url, prices=PRICES, retry_base_delay=0.01)
    got, streamed, plain = await _stream_and_complete(c, max_tokens=50)
    body = srv.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "stream" not in srv.requests[1]
    _assert_same_completion(got, streamed, plain, cached_tokens=3)
    assert [o for _, o in got] == [sum(len(p) for p, _ in got[:i]) for i in range(len(got))]
    assert streamed.model == plain.model


async def test_openrouter_reported_cost_is_the_same_streamed():
    with OpenAITestServer(reported_cost=0.0123) as s:
        c = OpenAIClient("m", base_url=s.base_url, provider="openrouter")
        try:
            streamed = await c.astream(MSGS, lambda *_: None)
            plain = await c.complete(MSGS)
        finally:
            await c.aclose()
    assert streamed.cost_usd == plain.cost_usd == 0.0123 and streamed.usage == plain.usage


async def test_anthropic_stream_same_completion_as_complete(srv):
    c = AnthropicClient("claude-sonnet-4-5", base_url=srv.anthropic_base_url, api_key="x",
                        retry_base_delay=0.01)
    got, streamed, plain = await _stream_and_complete(c, max_tokens=50)
    assert srv.requests[0]["stream"] is True
    _assert_same_completion(got, streamed, plain, cached_tokens=3)


async def test_azure_stream_same_completion_as_complete():
    from provider_fakes import ProviderFake
    from recursa.models import make_client
    with ProviderFake(cached_tokens=2) as fake:
        c = make_client("azure:my-4o-mini", azure_endpoint=fake.url, api_key="az-key")
        got, streamed, plain = await _stream_and_complete(c)
        assert fake.requests[0]["body"]["stream"] is True
    _assert_same_completion(got, streamed, plain, cached_tokens=2)
    assert streamed.model == plain.model == "gpt-4o-mini-2024-07-18"


async def test_litellm_stream_same_completion_as_complete_and_a_cut_is_retried(srv):
    from recursa.models import make_client
    c = make_client("litellm:openai/gpt-4o-mini", base_url=srv.base_url, api_key="x",
                    retry_base_delay=0.01)
    got, on_delta = _collect()
    streamed = await c.astream(MSGS, on_delta)
    plain = await c.complete(MSGS)
    assert srv.requests[0]["stream"] is True
    _assert_same_completion(got, streamed, plain, cached_tokens=3)
    srv.inject(Fault.cut(7))
    got.clear()
    again = await c.astream(MSGS, on_delta)
    assert again.text == plain.text and c.stats.retries == 1
    assert [o for _, o in got].count(0) == 2
    assert c.stats.last_errors[-1].count("127.0.0.1") == 1   # the model is named once


async def test_gemini_stream_same_completion_as_complete():
    pytest.importorskip("google.genai")
    from provider_fakes import ProviderFake
    from recursa.models import make_client
    with ProviderFake(cached_tokens=2) as fake:
        c = make_client("gemini:gemini-2.5-flash", base_url=fake.url, api_key="gk-test")
        got, streamed, plain = await _stream_and_complete(c)
        assert "streamGenerateContent" in fake.requests[0]["path"]
    _assert_same_completion(got, streamed, plain, cached_tokens=2)
    assert "thinking" not in streamed.text                     # thoughts are not the reply
    assert streamed.model == plain.model


async def test_cut_stream_is_retried_from_the_start(srv):
    c = OpenAIClient("m", base_url=srv.base_url, retry_base_delay=0.01)
    srv.inject(Fault.cut(9))
    try:
        got, on_delta = _collect()
        comp = await c.astream(MSGS, on_delta)
    finally:
        await c.aclose()
    assert srv.request_count == 2 and c.stats.retries == 1
    restart = [i for i, (_, off) in enumerate(got) if off == 0]
    assert len(restart) == 2                          # the second attempt starts at 0 again
    assert "".join(p for p, _ in got[restart[1]:]) == comp.text
    assert "cut after 9 characters" in c.stats.last_errors[0]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_cut_stream_without_retries_is_a_clear_error(srv, api):
    if api == "openai":
        c: Any = OpenAIClient("m", base_url=srv.base_url, max_retries=0)
    else:
        c = AnthropicClient("claude-sonnet-4-5", base_url=srv.anthropic_base_url, api_key="x",
                            max_retries=0)
    srv.inject(Fault.cut(6))
    try:
        with pytest.raises(StreamCut, match=r"stream was cut after 6 characters") as ei:
            await c.astream(MSGS, lambda *_: None)
    finally:
        await c.aclose()
    assert ei.value.retryable and "127.0.0.1" in str(ei.value)


async def test_error_before_any_text_is_retried_like_complete(srv):
    c = OpenAIClient("m", base_url=srv.base_url, retry_base_delay=0.01)
    srv.inject(Fault.status(503), Fault.drop())
    try:
        got, on_delta = _collect()
        comp = await c.astream(MSGS, on_delta)
    finally:
        await c.aclose()
    assert c.stats.retries == 2 and comp.text.startswith("echo:")
    assert [o for _, o in got].count(0) == 1


async def test_a_client_without_astream_falls_back_to_complete():
    got, on_delta = _collect()
    comp = await complete_streaming(ReplayClient(["hello"]), MSGS, on_delta)
    assert comp.text == "hello" and got == []


async def test_stream_false_turns_streaming_off(srv):
    c = OpenAIClient("m", base_url=srv.base_url, stream=False)
    try:
        got, on_delta = _collect()
        comp = await c.astream(MSGS, on_delta)
    finally:
        await c.aclose()
    assert comp.text.startswith("echo:") and got == [] and "stream" not in srv.requests[0]


async def test_cache_hit_replays_as_one_delta(srv, tmp_path):
    store = ResponseCache(tmp_path / "c.sqlite")
    c = CachedClient(OpenAIClient("m", base_url=srv.base_url, prices=PRICES), store)
    try:
        got, on_delta = _collect()
        first = await c.astream(MSGS, on_delta, temperature=0)
        assert len(got) > 3 and srv.requests[-1]["stream"] is True
        got.clear()
        again = await c.astream(MSGS, on_delta, temperature=0)
    finally:
        await c.aclose()
        store.close()
    assert srv.request_count == 1 and again.cached and again.cost_usd == 0.0
    assert got == [(first.text, 0)] and again.usage == first.usage


# ---------------------------------------------------------------- the emitter
def test_delta_emitter_throttles_and_restarts():
    now = [0.0]
    sent: list[tuple[str, int]] = []
    em = DeltaEmitter(lambda t, o: sent.append((t, o)), interval=0.1, clock=lambda: now[0])
    em("ab", 0)                   # the first piece goes at once
    em("cd", 2)
    em("ef", 4)                   # held: less than 0.1 s since the last event
    now[0] = 0.15
    em("gh", 6)
    em("ij", 8)
    em("AB", 0)                   # a retry from the start: sent at once
    em("CD", 2)
    em.flush()
    assert sent == [("ab", 0), ("cdefgh", 2), ("AB", 0), ("CD", 2)]
    text = StreamedText()
    restarts = [text.add(t, o) for t, o in sent]
    assert text.text == "ABCD" and restarts == [False, False, True, False]


# ---------------------------------------------------------------- a run
class _Live:
    """A live sink recording deltas, and whether the turn was still open at each."""

    wants_deltas = True

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.open_turns: set[str] = set()
        self.deltas_while_open = 0

    def emit(self, ev: Event) -> None:
        self.events.append(ev)
        if ev.kind == "turn" and ev.phase == "start":
            self.open_turns.add(ev.id)
        elif ev.kind == "turn" and ev.phase in ("update", "end"):
            self.open_turns.discard(ev.id)
        elif ev.phase == "delta" and ev.id in self.open_turns:
            self.deltas_while_open += 1

    def close(self) -> None:
        pass


def _script(req: dict[str, Any]) -> str:
    turns = sum(m["role"] == "assistant" for m in req["messages"])
    return REPLY if turns == 0 else 'Done.\n```repl\nFINAL("42")\n```\n'


async def test_run_streams_root_turns_to_live_sinks_and_not_to_the_trace(tmp_path):
    live = _Live()
    trace = tmp_path / "t.jsonl"
    with OpenAITestServer(responder=_script, stream_chunk_chars=3,
                          stream_chunk_delay=0.01) as s:
        res = await RLM(model="openai:m", base_url=s.base_url, sandbox="inprocess",
                        sinks=[live], trace_path=str(trace)).acompletion("q", "ctx")
        assert all(r.get("stream") is True for r in s.requests)
    assert res.answer == "42"
    deltas = [e for e in live.events if e.phase == "delta"]
    assert live.deltas_while_open == len(deltas) > 2
    first = [e for e in deltas if e.id == deltas[0].id]
    text = StreamedText()
    for e in first:
        text.add(e.data["text"], e.data["offset"])
    assert text.text == REPLY
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert lines and not any(x.get("phase") == "delta" for x in lines)
    assert len(read_trace(trace).events) == len(live.events) - len(deltas)


async def test_usage_of_a_streamed_run_equals_a_plain_run(tmp_path):
    results = []
    for stream in (True, False):
        sinks = [_Live()] if stream else []
        with OpenAITestServer(responder=_script, cached_tokens=5) as s:
            res = await RLM(model="openai:m", base_url=s.base_url, sandbox="inprocess",
                            sinks=sinks, client_options={"prices": PRICES}
                            ).acompletion("q", "ctx")
            assert all(bool(r.get("stream")) is stream for r in s.requests)
        results.append(res)
    a, b = results
    assert a.answer == b.answer == "42"
    assert a.usage["root"].usage == b.usage["root"].usage
    assert a.usage["root"].usage.cached_tokens > 0
    assert a.cost_usd == b.cost_usd and a.cost_usd > 0


async def test_a_cut_root_stream_that_keeps_failing_fails_the_run_clearly():
    with OpenAITestServer(responder=_script) as s:
        s.inject(*[Fault.cut(5)] * 3)
        res = await RLM(model="openai:m", base_url=s.base_url, sandbox="inprocess",
                        sinks=[_Live()],
                        client_options={"max_retries": 2, "retry_base_delay": 0.01},
                        ).acompletion("q", "ctx")
    assert res.status == "error"
    assert "stream was cut after 5 characters" in res.error and "3 attempts" in res.error


def test_trace_sinks_without_wants_deltas_get_none(tmp_path):
    seen: list[Event] = []

    class Plain:
        def emit(self, ev: Event) -> None:
            seen.append(ev)

        def close(self) -> None:
            pass
    jsonl = JsonlSink(tmp_path / "t.jsonl")
    t = Tracer([Plain(), jsonl])
    assert not t.wants_deltas
    t.emit_delta("turn", id="x", text="abc", offset=0)
    jsonl.emit(Event(kind="turn", id="x", phase="delta", data={"text": "abc"}))
    jsonl.close()
    assert seen == [] and (tmp_path / "t.jsonl").read_text() == ""


def test_jsonlines_view_prints_deltas():
    buf = io.StringIO()
    view = JsonLinesView(buf)
    t = Tracer([view])
    assert t.wants_deltas
    t.emit_delta("turn", id="x", text="print(1)", offset=0)
    ev = json.loads(buf.getvalue())
    assert ev["phase"] == "delta" and ev["data"] == {"text": "print(1)", "offset": 0}


def test_console_view_shows_the_code_being_written():
    from rich.console import Console
    con = Console(file=io.StringIO(), force_terminal=True, width=100)
    view = ConsoleView(con)
    try:
        assert view.wants_deltas
        view.emit(Event(kind="turn", id="t1", phase="start", data={"turn": 1}))
        view.emit(Event(kind="turn", id="t1", phase="delta",
                        data={"text": "```repl\nx = len(context)\n", "offset": 0}))
        shown = view.render_plain()
        assert "x = len(context)" in shown and "turn 1" in shown
        view.emit(Event(kind="turn", id="t1", phase="end", data={"blocks": 1}))
        assert "x = len(context)" not in view.render_plain()
    finally:
        view.close()


def test_console_view_shows_a_models_escape_sequences_as_text():
    """A reply being written and a turn's error line that hold an OSC 52 clipboard write, a
    cursor move and a one-byte CSI (U+009B): the live region and the printed lines show them as
    visible text, on a terminal and off one (rich keeps ESC; only BEL and a few are dropped)."""
    from rich.console import Console
    evil = "x\x1b]52;c;ZXZpbA==\x07\x1b[2A\x9b2Ky"
    shown = "x\\x1b]52;c;ZXZpbA==\\x07\\x1b[2A\\x9b2Ky"
    for terminal in (True, False):
        out = io.StringIO()
        view = ConsoleView(Console(file=out, force_terminal=terminal, width=200),
                           heartbeat_s=None)
        try:
            view.emit(Event(kind="turn", id="t1", phase="start", data={"turn": 1}))
            view.emit(Event(kind="turn", id="t1", phase="delta",
                            data={"text": f"I found {evil}\n", "offset": 0}))
            if terminal:     # the reply as it is written: only a live display shows it
                region = view.render_plain()
                assert shown in region and "\x1b]52" not in region and "\x9b" not in region
            view.emit(Event(kind="turn", id="t1", phase="end",
                            data={"blocks": 1, "error": f"NameError: {evil}"}))
        finally:
            view.close()
        printed = out.getvalue()
        assert f"error: NameError: {shown}" in printed, (terminal, printed)
        assert "\x1b]52" not in printed and "\x07" not in printed and "\x9b" not in printed
        if not terminal:
            assert "\x1b" not in printed       # off a terminal nothing writes an escape


def test_stream_cut_is_a_model_error():
    e = StreamCut("model 'm' at http://x", 12, "no finish_reason")
    assert isinstance(e, ModelError) and e.chars == 12 and "12 characters" in str(e)


# ---------------------------------------------------------------- recursa serve
def test_server_progress_shows_the_root_code_as_it_is_written():
    """openai client -> recursa server -> OpenAIClient (streaming) -> an upstream that streams
    slowly: the root's code reaches the client piece by piece, before the turn's summary line."""
    from helpers_server import KEY, Server
    from recursa.core.config import RLMConfig
    from recursa.server.openai_app import ServerConfig, create_app

    with OpenAITestServer(responder=_script, stream_chunk_chars=4,
                          stream_chunk_delay=0.03) as up:
        cfg = ServerConfig(rlm=RLMConfig.build(model="openai:m", base_url=up.base_url,
                                               sandbox="inprocess", max_iterations=3),
                           api_key=KEY)
        with Server(create_app(cfg)) as srv:
            chunks = list(srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}],
                extra_body={"context": "ctx"}, stream=True))
        assert all(r.get("stream") is True for r in up.requests)
    items = [c.model_extra["recursa_progress"] for c in chunks
             if c.model_extra.get("recursa_progress")]
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                        for c in chunks if c.choices)
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert answer == "42"
    turn1 = [p for p in items[:next(i for i, p in enumerate(items)
                                    if p["line"].startswith("model wrote"))]]
    deltas = [p for p in turn1 if p["phase"] == "delta"]
    assert len(deltas) >= 3                       # throttled, but more than one piece
    assert "".join(p["text"] for p in deltas) == REPLY
    assert [p["offset"] for p in deltas] == [sum(len(q["text"]) for q in deltas[:i])
                                             for i in range(len(deltas))]
    # the reasoning text reads as a transcript: progress lines on lines of their own
    assert "turn 1\n" + REPLY + "code ran in " in reasoning


# ---------------------------------------------------------------- the local model
@pytest.mark.model
async def test_local_model_streams_with_the_usage_of_complete():
    from recursa.models import llama_server
    from recursa.models.fetch import fetch_model
    from recursa.models.local import LocalClient

    c = LocalClient(str(fetch_model("smollm2-135m")), n_ctx=2048)
    question = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    try:
        got, on_delta = _collect()
        streamed = await c.astream(question, on_delta, temperature=0, max_tokens=24, seed=1)
        plain = await c.complete(question, temperature=0, max_tokens=24, seed=1)
        assert len(got) > 5 and "".join(p for p, _ in got) == streamed.text
        # the same tokens; the second call of the same prompt finds it in the server's cache
        assert streamed.text == plain.text
        assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == \
            (plain.usage.input_tokens, plain.usage.output_tokens)
        assert streamed.usage.output_tokens > 5 and streamed.cost_usd == 0.0
        with pytest.raises(ModelError, match="too long for n_ctx") as ei:
            await c.astream([{"role": "user", "content": "word " * 3000}], on_delta)
        assert not ei.value.retryable
    finally:
        await c.aclose()
        llama_server.stop_all()


@pytest.mark.model
async def test_a_run_on_the_local_model_streams_its_turns(tmp_path):
    from recursa.models import llama_server
    from recursa.models.fetch import fetch_model
    from recursa.models.local import LocalClient

    live = _Live()
    root = LocalClient(str(fetch_model("smollm2-135m")), n_ctx=4096)
    try:
        # code mode: its turns are streamed (auto would plan for a local root, and the
        # planning call is a constrained one-shot, not a streamed turn)
        res = await RLM(model=root, sandbox="inprocess", sinks=[live], max_iterations=1,
                        strategy="code", model_options={"max_tokens": 48, "temperature": 0},
                        trace_path=str(tmp_path / "t.jsonl")).acompletion(
            "What is the first word of the context?", "hello world")
    finally:
        llama_server.stop_all()
    assert res.turns >= 1
    assert live.deltas_while_open >= 2
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert lines and all(x.get("phase") != "delta" for x in lines)


def test_cli_events_jsonl_streams_the_root_reply(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    ctx = tmp_path / "ctx.txt"
    ctx.write_text("some context")
    trace = tmp_path / "t.jsonl"
    src = str(Path(__file__).parents[1] / "src")
    with OpenAITestServer(responder=_script, stream_chunk_chars=3,
                          stream_chunk_delay=0.01) as s:
        out = subprocess.run(
            [sys.executable, "-m", "recursa.cli", "run", "q", "--context", str(ctx),
             "--model", "openai:m", "--base-url", s.base_url, "--sandbox", "inprocess",
             "--trace", str(trace), "--events", "jsonl"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": src})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42"
    events = [json.loads(x) for x in out.stderr.splitlines()]
    kinds = [(e.get("kind"), e.get("phase")) for e in events]
    first_delta = kinds.index(("turn", "delta"))
    assert first_delta < kinds.index(("turn", "update"))
    text = StreamedText()
    turn1 = events[first_delta]["id"]
    for e in events:
        if e.get("phase") == "delta" and e["id"] == turn1:
            text.add(e["data"]["text"], e["data"]["offset"])
    assert text.text == REPLY
    assert all(json.loads(x).get("phase") != "delta" for x in trace.read_text().splitlines())


def test_server_progress_of_deltas_and_a_restarted_reply():
    from recursa.server.common import Progress
    p = Progress()

    def ev(phase: str, depth: int = 0, **data: Any) -> Event:
        return Event(kind="turn", id="t", phase=phase, depth=depth, data=data)
    out = []
    for e in (ev("start", turn=1), ev("delta", text="print(", offset=0),
              ev("delta", text="pr", offset=0), ev("delta", text="int(1)", offset=2),
              ev("delta", depth=1, text="child", offset=0), ev("end", blocks=1)):
        item = p.feed(e, deltas=True)
        if item is not None:
            out.append(p.reasoning(item))
    assert "".join(out) == ("turn 1\nprint(\n[the model's reply restarted: its stream was cut]\n"
                            "print(1)\nmodel wrote 1 code block(s)\n")
    assert Progress().feed(ev("delta", text="x", offset=0)) is None    # MCP: no deltas
