"""The gemini: client (google-genai SDK) against a local server speaking Gemini's REST shape."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("google.genai")

from provider_fakes import ProviderFake  # noqa: E402
from recursa.base.types import ModelClient, ModelError  # noqa: E402
from recursa.models import make_client  # noqa: E402
from recursa.models.gemini_client import GeminiClient, gemini_contents  # noqa: E402

USER = [{"role": "user", "content": "hello gemini"}]


@pytest.fixture
def fake():
    with ProviderFake(cached_tokens=3) as f:
        yield f


@pytest.fixture(autouse=True)
def _no_google_env(monkeypatch):
    for var in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(var, raising=False)


async def test_roundtrip_shapes_usage_and_cost(fake):
    c = make_client("gemini:gemini-2.5-flash", base_url=fake.url, api_key="gk-test")
    assert isinstance(c, GeminiClient) and isinstance(c, ModelClient)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "one"},
            {"role": "user", "content": "two"}]
    r = await c.complete(msgs, max_tokens=50, temperature=0.2, stop="END", top_k=4)
    assert r.text == "echo: one\n\ntwo"            # the fake's "thought" part is not text
    req = fake.requests[-1]
    assert req["path"].endswith("/models/gemini-2.5-flash:generateContent")
    assert req["headers"]["x-goog-api-key"] == "gk-test"
    body = req["body"]
    assert body["systemInstruction"]["parts"][0]["text"] == "be brief"
    assert [x["role"] for x in body["contents"]] == ["user", "model", "user"]
    assert body["generationConfig"] == {"maxOutputTokens": 50, "temperature": 0.2,
                                        "stopSequences": ["END"], "topK": 4}
    # output counts thinking tokens (the fake reports 2); cached tokens priced as cached
    assert r.usage.cached_tokens == 3 and r.usage.output_tokens == len(r.text) // 4 + 2 + 1
    fresh = r.usage.input_tokens - 3
    want = (fresh * 0.30 + 3 * 0.03 + r.usage.output_tokens * 2.50) / 1e6
    assert r.cost_usd == pytest.approx(want)
    assert r.model == "gemini-2.5-flash"
    await c.aclose()


async def test_retries_429_and_503_then_answers(fake):
    fake.inject(429, retry_after="0.2")
    fake.inject(503)
    c = make_client("gemini:gemini-2.5-flash", base_url=fake.url, api_key="k",
                    retry_base_delay=0.01)
    t0 = time.perf_counter()
    r = await c.complete(USER)
    assert r.text == "echo: hello gemini"
    assert time.perf_counter() - t0 >= 0.2          # honoured Retry-After
    assert c.stats.retries == 2 and len(fake.requests) == 3
    await c.aclose()


async def test_4xx_not_retried_and_empty_reply_retried_once(fake):
    c = make_client("gemini:gemini-2.5-flash", base_url=fake.url, api_key="secret-key",
                    retry_base_delay=0.01)
    fake.inject(400)
    with pytest.raises(ModelError) as ei:
        await c.complete(USER)
    assert ei.value.status == 400 and not ei.value.retryable and len(fake.requests) == 1
    assert "gemini-2.5-flash" in str(ei.value) and "secret-key" not in str(ei.value)
    fake.inject(empty=True)
    fake.inject(empty=True)
    with pytest.raises(ModelError, match="returned no text"):
        await c.complete(USER)
    assert len(fake.requests) == 3
    await c.aclose()


async def test_connection_refused_is_retried_then_fails():
    with socket.socket() as s:       # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = make_client("gemini:gemini-2.5-flash", base_url=f"http://127.0.0.1:{port}",
                    api_key="k", max_retries=1, retry_base_delay=0.01)
    with pytest.raises(ModelError, match="connection error|timed out"):
        await c.complete(USER)
    assert c.stats.attempts == 2
    await c.aclose()


def test_missing_key_and_bad_specs(monkeypatch):
    with pytest.raises(ValueError, match="GEMINI_API_KEY"):
        make_client("gemini:gemini-2.5-flash")
    with pytest.raises(ValueError, match="no model name"):
        make_client("gemini:")
    with pytest.raises(ValueError, match="Did you mean 'gemini:gemini-2.5-flash'"):
        make_client("gemini-2.5-flash")
    with pytest.raises(ValueError, match="unknown prefix 'google'"):
        make_client("google:gemini-2.5-flash")
    monkeypatch.setenv("GEMINI_API_KEY", "from-env")
    assert make_client("gemini:gemini-2.5-pro").name == "gemini:gemini-2.5-pro"


def test_contents_conversion():
    system, contents = gemini_contents([
        {"role": "system", "content": "a"}, {"role": "system", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": "y"}])
    assert system == "a\n\nb"
    assert contents == [{"role": "user", "parts": [{"text": "x"}]},
                        {"role": "model", "parts": [{"text": "y"}]}]


async def test_rlm_run_over_gemini_rolls_up_usage_and_cost(fake):
    from recursa import RLM
    fake.responder = lambda last: ('```repl\nanswer["content"] = str(len(context))\n'
                                   'answer["ready"] = True\n```')
    rlm = RLM("gemini:gemini-2.5-flash", base_url=fake.url, api_key="gk", sandbox="inprocess")
    res = await rlm.acompletion("How long is the context?", "x" * 1234)
    assert res.status == "final" and res.answer == "1234"
    root = res.usage["root"]
    assert root.calls == 1 and root.usage.cached_tokens == 3
    assert res.cost_usd is not None and res.cost_usd > 0
    assert "gk" not in str(fake.requests[-1]["body"])      # the key is a header, not content
