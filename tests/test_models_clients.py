"""OpenAI and Anthropic clients against a real HTTP server (tests/openai_testserver.py)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import threading
import time
import urllib.request

import pytest

from openai_testserver import Fault, OpenAITestServer
from recursa.base.types import ModelClient, ModelError
from recursa.models import make_client
from recursa.models.anthropic_client import AnthropicClient, split_system
from recursa.models.openai_client import OpenAIClient
from recursa.models.retry import parse_retry_after

USER = [{"role": "user", "content": "hello there, model"}]


@pytest.fixture
def srv():
    with OpenAITestServer() as s:
        yield s


_open: list = []


@pytest.fixture(autouse=True)
async def _close_clients():
    # Close every client a test made while its event loop is still running.
    yield
    while _open:
        await _open.pop().aclose()


def oclient(srv: OpenAITestServer, model: str = "gpt-4o-mini", **kw) -> OpenAIClient:
    kw.setdefault("retry_base_delay", 0.01)
    c = make_client(f"openai:{model}", base_url=srv.base_url, **kw)
    _open.append(c)
    return c  # type: ignore[return-value]


async def test_text_usage_cost_and_protocol(srv):
    srv.cached_tokens = 2
    c = oclient(srv)
    assert isinstance(c, ModelClient)
    r = await c.complete(USER, max_tokens=50, temperature=0.3, stop=["\n\n"])
    assert r.text == "echo: hello there, model"
    assert r.usage.input_tokens == len("hello there, model") // 4
    assert r.usage.output_tokens == len(r.text) // 4
    assert r.usage.cached_tokens == 2
    # gpt-4o-mini: 0.15 in / 0.075 cached / 0.60 out per 1M
    fresh = r.usage.input_tokens - 2
    assert r.cost_usd == pytest.approx((fresh * 0.15 + 2 * 0.075 + r.usage.output_tokens * 0.6) / 1e6)
    assert r.model == "gpt-4o-mini" and r.latency_s > 0 and r.raw is not None
    body = srv.requests[-1]
    # a compatible server gets max_tokens, not max_completion_tokens
    assert body["max_tokens"] == 50 and body["temperature"] == 0.3 and body["stop"] == ["\n\n"]
    assert c.stats.retries == 0
    await c.aclose()


async def test_extra_body_and_unknown_model_cost_is_none(srv):
    c = oclient(srv, model="my-finetune")
    r = await c.complete(USER, extra_body={"top_k": 5}, seed=7)
    assert r.cost_usd is None
    assert srv.requests[-1]["top_k"] == 5 and srv.requests[-1]["seed"] == 7
    c2 = oclient(srv, model="my-finetune", prices={"my-finetune": (1.0, 2.0)})
    r2 = await c2.complete(USER)
    assert r2.cost_usd == pytest.approx((r2.usage.input_tokens + 2 * r2.usage.output_tokens) / 1e6)


async def test_429_honours_retry_after_seconds(srv):
    srv.inject(Fault.status(429, retry_after="0.25"))
    c = oclient(srv, retry_base_delay=0.001)
    t0 = time.perf_counter()
    r = await c.complete(USER)
    dt = time.perf_counter() - t0
    assert r.text.startswith("echo:")
    assert 0.25 <= dt < 1.5, dt
    assert srv.request_count == 2 and c.stats.retries == 1


async def test_429_retry_after_http_date(srv):
    # An HTTP date (1 s resolution) already past means "now"; future dates: test_parse_retry_after.
    when = email.utils.formatdate(time.time() - 5, usegmt=True)
    srv.inject(Fault.status(429, retry_after=when))
    c = oclient(srv, retry_base_delay=5)  # backoff would (usually) sleep seconds
    t0 = time.perf_counter()
    await c.complete(USER)
    assert time.perf_counter() - t0 < 0.5
    assert srv.request_count == 2 and c.stats.slept_s == 0


async def test_429_without_retry_after_uses_backoff(srv):
    srv.inject(Fault.status(429), Fault.status(503))
    c = oclient(srv, retry_base_delay=0.01)
    r = await c.complete(USER)
    assert r.text and srv.request_count == 3 and c.stats.retries == 2


async def test_500_then_success(srv):
    srv.inject(Fault.status(500))
    c = oclient(srv)
    assert (await c.complete(USER)).text == "echo: hello there, model"
    assert srv.request_count == 2


async def test_gives_up_after_max_retries(srv):
    srv.inject(*[Fault.status(500)] * 10)
    c = oclient(srv, max_retries=2)
    with pytest.raises(ModelError) as ei:
        await c.complete(USER)
    e = ei.value
    assert e.status == 500 and not e.retryable
    msg = str(e)
    assert "HTTP 500" in msg and "gave up after 3 attempts" in msg
    assert "gpt-4o-mini" in msg and srv.base_url in msg
    assert srv.request_count == 3 and c.stats.failures == 1


async def test_retry_after_too_long_gives_up_at_once(srv):
    srv.inject(Fault.status(429, retry_after="3600"))
    c = oclient(srv)
    with pytest.raises(ModelError) as ei:
        await c.complete(USER)
    assert ei.value.retry_after == pytest.approx(3600)
    assert srv.request_count == 1


async def test_4xx_is_not_retried_and_key_not_leaked(srv):
    srv.inject(Fault.status(400, body="bad parameter foo"))
    c = oclient(srv, api_key="sk-secret-123")
    with pytest.raises(ModelError) as ei:
        await c.complete(USER)
    assert ei.value.status == 400 and not ei.value.retryable
    assert "bad parameter foo" in str(ei.value) and "sk-secret" not in str(ei.value)
    assert "sk-secret" not in repr(c)
    assert srv.request_count == 1
    assert srv.headers[-1]["authorization"] == "Bearer sk-secret-123"


@pytest.mark.parametrize("fault", [Fault.empty(), Fault.null(), Fault.no_choices()])
async def test_empty_content_retried_once_then_error(srv, fault):
    srv.inject(fault, fault, fault)
    c = oclient(srv)
    with pytest.raises(ModelError, match="returned no text"):
        await c.complete(USER)
    assert srv.request_count == 2  # one retry for an empty reply, no more


async def test_empty_once_then_text(srv):
    srv.inject(Fault.empty())
    c = oclient(srv)
    assert (await c.complete(USER)).text.startswith("echo")


async def test_malformed_json_retried_then_error(srv):
    srv.inject(Fault.malformed())
    c = oclient(srv)
    assert (await c.complete(USER)).text.startswith("echo")
    srv.inject(*[Fault.malformed()] * 5)
    c2 = oclient(srv, max_retries=1)
    with pytest.raises(ModelError, match="malformed"):
        await c2.complete(USER)


async def test_dropped_connection_is_retried(srv):
    srv.inject(Fault.drop(), Fault.drop())
    c = oclient(srv)
    assert (await c.complete(USER)).text.startswith("echo")
    assert c.stats.retries == 2


async def test_timeout_then_success_and_timeout_give_up(srv):
    srv.inject(Fault.hang(5))
    c = oclient(srv)
    t0 = time.perf_counter()
    r = await c.complete(USER, timeout=0.15)
    assert r.text.startswith("echo") and time.perf_counter() - t0 < 2
    srv.inject(Fault.hang(5), Fault.hang(5))
    c2 = oclient(srv, max_retries=1)
    with pytest.raises(ModelError, match="timed out"):
        await c2.complete(USER, timeout=0.1)


async def test_concurrent_calls(srv):
    # overlapped, not one after another: each request is held until all 8 are in the server
    # at once (a wall-time bound here failed on a machine half as fast)
    everyone = threading.Barrier(8, timeout=30)

    def together(body):
        everyone.wait()
        return f"echo: {body['messages'][-1]['content']}"
    srv.responder = together
    c = oclient(srv)
    rs = await asyncio.gather(*[c.complete([{"role": "user", "content": f"q{i}"}])
                                for i in range(8)])
    assert [r.text for r in rs] == [f"echo: q{i}" for i in range(8)]
    assert not everyone.broken


async def test_hosted_openai_params(srv, monkeypatch):
    # Pointing at the test server but pretending it is api.openai.com's dialect.
    c = OpenAIClient("gpt-5-mini", base_url=srv.base_url, api_key="k",
                     max_tokens_param="max_completion_tokens", retry_base_delay=0.01)
    _open.append(c)
    await c.complete(USER, max_tokens=10)
    assert srv.requests[-1]["max_completion_tokens"] == 10
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIClient("gpt-5-mini")


async def test_streaming_endpoint_with_sdk(srv):
    # The server side of `stream=true` (used by `recursa serve` tests), via the SDK directly.
    import openai
    srv.stream_chunk_chars = 3
    cli = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    stream = await cli.chat.completions.create(model="m", messages=USER, stream=True,
                                               stream_options={"include_usage": True})
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(parts) == "echo: hello there, model" and len(parts) > 3
    assert usage is not None and usage.completion_tokens > 0
    await cli.close()


def test_server_models_endpoint_and_responder_faults():
    calls = []

    def responder(req):
        calls.append(req)
        return Fault.status(503) if len(calls) == 1 else "ok " + req["model"]

    async def go(s):
        c = make_client("openai:x", base_url=s.base_url, retry_base_delay=0.01)
        try:
            return await c.complete(USER)
        finally:
            await c.aclose()

    with OpenAITestServer(responder=responder, model="served") as s:
        with urllib.request.urlopen(s.base_url + "/models") as resp:
            assert json.load(resp)["data"][0]["id"] == "served"
        r = asyncio.run(go(s))
        assert r.text == "ok x" and r.model == "served" and s.request_count == 2


# ------------------------------------------------------------------ anthropic
def aclient(srv, **kw) -> AnthropicClient:
    kw.setdefault("retry_base_delay", 0.01)
    c = make_client("anthropic:claude-haiku-4-5", base_url=srv.anthropic_base_url,
                    api_key="ak-test", **kw)
    _open.append(c)
    return c  # type: ignore[return-value]


async def test_anthropic_roundtrip(srv):
    srv.cached_tokens = 3
    c = aclient(srv)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello anthropic"}]
    r = await c.complete(msgs, max_tokens=64, temperature=0.1, stop="END")
    assert r.text == "echo: hello anthropic"
    body = srv.requests[-1]
    # the system prompt goes as a block with a cache breakpoint (prompt caching is on)
    assert body["system"] == [{"type": "text", "text": "be brief",
                               "cache_control": {"type": "ephemeral"}}]
    assert body["max_tokens"] == 64
    assert body["stop_sequences"] == ["END"] and body["temperature"] == 0.1
    assert [m["role"] for m in body["messages"]] == ["user"]
    h = srv.headers[-1]  # SDK versions differ: x-api-key or a bearer token
    assert "ak-test" in (h.get("x-api-key", "") + h.get("authorization", ""))
    assert r.usage.cached_tokens == 3
    fresh = r.usage.input_tokens - 3
    assert r.cost_usd == pytest.approx((fresh * 1 + 3 * 0.1 + r.usage.output_tokens * 5) / 1e6)
    await c.aclose()


async def test_anthropic_retry_and_errors(srv):
    srv.inject(Fault.status(529), Fault.status(429, retry_after="0.2"))
    c = aclient(srv)
    t0 = time.perf_counter()
    assert (await c.complete(USER)).text.startswith("echo")
    assert time.perf_counter() - t0 >= 0.2 and c.stats.retries == 2
    srv.inject(Fault.empty(), Fault.empty())
    with pytest.raises(ModelError, match="returned no text"):
        await c.complete(USER)
    srv.inject(Fault.status(401))
    with pytest.raises(ModelError) as ei:
        await c.complete(USER)
    assert ei.value.status == 401 and "claude-haiku-4-5" in str(ei.value)


def test_split_system_merges_turns():
    system, turns = split_system([
        {"role": "system", "content": "a"}, {"role": "system", "content": "b"},
        {"role": "assistant", "content": "x"}, {"role": "user", "content": "u1"},
        {"role": "user", "content": "u2"}])
    assert system == "a\n\nb"
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[-1]["content"] == "u1\n\nu2"


def test_parse_retry_after():
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "150", "retry-after": "9"}) == 0.15
    d = parse_retry_after({"retry-after": email.utils.formatdate(time.time() + 30, usegmt=True)})
    assert d is not None and 25 < d <= 31
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


async def test_whitespace_only_reply_is_no_text():
    with OpenAITestServer(responder=lambda req: "  \n ") as s:
        c = oclient(s)
        with pytest.raises(ModelError, match="returned no text"):
            await c.complete(USER)
        assert s.request_count == 2
