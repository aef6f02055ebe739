"""make_client specs, pricing, ReplayClient, retry helper: no network, no model."""

from __future__ import annotations

import asyncio
import random

import pytest

from recursa.base.types import ModelClient, ModelError, Usage
from recursa.models import (
    ReplayClient,
    ReplayExhausted,
    default_model_spec,
    make_client,
    price_for,
    register_price,
)
from recursa.models.anthropic_client import AnthropicClient
from recursa.models.openai_client import OPENROUTER_BASE_URL, OpenAIClient
from recursa.models.pricing import cost_usd, normalize_model_name
from recursa.models.retry import (
    EmptyResponseError,
    RetryPolicy,
    RetryStats,
    backoff_delay,
    with_retries,
)


# ------------------------------------------------------------------ specs
def test_bare_name_is_rejected_with_prefixes_listed():
    with pytest.raises(ValueError) as ei:
        make_client("gpt-5-mini")
    msg = str(ei.value)
    assert "openai:" in msg and "anthropic:" in msg and "local:" in msg
    assert "Did you mean 'openai:gpt-5-mini'" in msg
    with pytest.raises(ValueError, match="anthropic:claude"):
        make_client("claude-sonnet-4-5")
    with pytest.raises(ValueError, match="unknown prefix"):
        make_client("cohere:command-r")
    with pytest.raises(ValueError, match="no model name"):
        make_client("openai:")


async def test_specs_build_the_right_clients(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-a")
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    o = make_client("openai:gpt-5-mini")
    assert isinstance(o, OpenAIClient) and o.name == "openai:gpt-5-mini"
    assert o.max_tokens_param == "max_completion_tokens"
    local = make_client("openai:qwen", base_url="http://127.0.0.1:9/v1")
    assert local.max_tokens_param == "max_tokens" and local.base_url == "http://127.0.0.1:9/v1"
    r = make_client("openrouter:anthropic/claude-sonnet-4.5")
    assert isinstance(r, OpenAIClient) and r.base_url == OPENROUTER_BASE_URL
    a = make_client("anthropic:claude-haiku-4-5")
    assert isinstance(a, AnthropicClient)
    with pytest.raises(ValueError, match="VLLM_BASE_URL"):
        make_client("vllm:Qwen/Qwen2.5-7B")
    monkeypatch.setenv("VLLM_BASE_URL", "http://gpu:8000/v1")
    v = make_client("vllm:Qwen/Qwen2.5-7B")
    assert v.base_url == "http://gpu:8000/v1" and v.model == "Qwen/Qwen2.5-7B"
    for c in (o, local, r, a, v):
        assert isinstance(c, ModelClient)
        await c.aclose()


def test_local_specs_do_not_load_anything():
    pytest.importorskip("recursa.models.local")
    from recursa.models.local import LocalClient
    c = make_client("local:qwen2.5-coder-0.5b")
    assert isinstance(c, LocalClient) and c.n_ctx == 8192 and c.path is None
    assert c.context_window == 8192
    assert make_client("local:qwen2.5-coder-1.5b").n_ctx == 16384
    p = make_client("local:/tmp/some/model.gguf", n_ctx=2048)
    assert str(p.path) == "/tmp/some/model.gguf" and p.n_ctx == 2048
    with pytest.raises(Exception, match="unknown local model"):
        make_client("local:nope-1b")


def test_default_model_spec():
    assert default_model_spec({"OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "y"})[0] == \
        "openai:gpt-5-mini"
    spec, why = default_model_spec({"ANTHROPIC_API_KEY": "y"})
    assert spec.startswith("anthropic:claude-sonnet") and "ANTHROPIC_API_KEY" in why
    spec, why = default_model_spec({})
    assert spec == "local:qwen2.5-coder-1.5b" and "local" in why


# ------------------------------------------------------------------ pricing
def test_price_lookup_normalizes_names():
    assert normalize_model_name("openrouter:anthropic/claude-sonnet-4.5") == "claude-sonnet-4-5"
    assert normalize_model_name("gpt-4o-mini-2024-07-18") == "gpt-4o-mini"
    assert normalize_model_name("llama3:8b") == "llama3:8b"
    assert price_for("gpt-5-mini").input == 0.25
    assert price_for("openai:gpt-5-mini-2025-08-07") == price_for("gpt-5-mini")
    assert price_for("claude-sonnet-4-5-20250929").output == 15.0
    assert price_for("anthropic/claude-haiku-4.5").input == 1.0
    assert price_for("gpt-4.1").input == 2.0 and price_for("gpt-4.1-mini").input == 0.4
    assert price_for("totally-unknown-model") is None


def test_cost_unknown_is_none_never_zero():
    u = Usage(input_tokens=1000, output_tokens=100)
    assert cost_usd("mystery-7b", u) is None
    assert cost_usd("gpt-5-mini", u) == pytest.approx((1000 * 0.25 + 100 * 2.0) / 1e6)
    cached = Usage(input_tokens=1000, output_tokens=0, cached_tokens=800)
    assert cost_usd("gpt-5", cached) == pytest.approx((200 * 1.25 + 800 * 0.125) / 1e6)
    # Anthropic cache writes cost 1.25x input
    w = Usage(input_tokens=1000, output_tokens=0)
    assert cost_usd("claude-sonnet-4-5", w, cache_write_tokens=1000) == \
        pytest.approx(1000 * 3.75 / 1e6)


def test_register_price_and_overrides():
    register_price("acme-large", input=1.0, output=3.0, cached_input=0.5)
    assert price_for("openai:acme-large-2025-01-01").output == 3.0
    u = Usage(input_tokens=10, output_tokens=10)
    assert cost_usd("acme-large", u, overrides={"acme-large": {"input": 0, "output": 0}}) == 0.0
    assert cost_usd("gpt-5", u, overrides={"gpt-5": (2.0, 4.0)}) == pytest.approx(60 / 1e6)


def test_a_registered_price_replaces_a_built_in_one_already_looked_up():
    built_in = price_for("gpt-4o-mini")
    assert built_in is not None
    try:
        register_price("gpt-4o-mini-2024-07-18", input=9.0, output=99.0)
        assert price_for("openai:gpt-4o-mini").output == 99.0
    finally:
        register_price("gpt-4o-mini", input=built_in.input, output=built_in.output,
                       cached_input=built_in.cached_input, cache_write=built_in.cache_write)
    assert price_for("gpt-4o-mini") == built_in


# ------------------------------------------------------------------ replay
async def test_replay_script_records_calls():
    c = make_client("replay:", responses=["one", "two", RuntimeError("scripted boom")])
    assert isinstance(c, ReplayClient) and isinstance(c, ModelClient)
    r = await c.complete([{"role": "user", "content": "x" * 40}], max_tokens=5)
    assert r.text == "one" and r.usage.input_tokens == 10 and r.usage.output_tokens == 1
    assert r.cost_usd == 0.0
    assert (await c.complete([{"role": "user", "content": "y"}])).text == "two"
    with pytest.raises(RuntimeError, match="scripted boom"):
        await c.complete([{"role": "user", "content": "z"}])
    with pytest.raises(ReplayExhausted, match="call #4") as ei:
        await c.complete([{"role": "user", "content": "last words"}])
    assert isinstance(ei.value, ModelError) and "last words" in str(ei.value)
    assert len(c.calls) == 4 and c.calls[0][0]["content"] == "x" * 40
    assert c.options[0] == {"max_tokens": 5}


async def test_replay_callable_sync_and_async_and_latency():
    sync = ReplayClient(lambda msgs: msgs[-1]["content"].upper())
    assert (await sync.complete([{"role": "user", "content": "abc"}])).text == "ABC"

    async def responder(msgs):
        await asyncio.sleep(0)
        return f"n={len(msgs)}"

    slow = ReplayClient(responder, latency=0.05)
    r = await slow.complete([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert r.text == "n=2" and r.latency_s >= 0.05
    empty = ReplayClient([""])
    with pytest.raises(ModelError, match="no text"):
        await empty.complete([{"role": "user", "content": "u"}])


async def test_replay_concurrent_calls_get_responses_in_call_order():
    c = ReplayClient([str(i) for i in range(20)], latency=0.01)
    rs = await asyncio.gather(*[c.complete([{"role": "user", "content": str(i)}])
                                for i in range(20)])
    assert [r.text for r in rs] == [str(i) for i in range(20)]


# ------------------------------------------------------------------ retry helper
async def test_with_retries_policy():
    slept: list[float] = []

    async def fake_sleep(d: float) -> None:
        slept.append(d)

    errors = [ModelError("busy", retryable=True, status=503),
              ModelError("slow down", retryable=True, status=429, retry_after=2.5)]

    async def flaky():
        if errors:
            raise errors.pop(0)
        return "ok"

    stats = RetryStats()
    pol = RetryPolicy(max_retries=4, base_delay=1.0)
    assert await with_retries(flaky, pol, stats, sleep=fake_sleep) == "ok"
    assert stats.retries == 2 and stats.attempts == 3
    assert 0 <= slept[0] <= 1.0 and slept[1] == 2.5

    async def fatal():
        raise ModelError("bad request", status=400)

    with pytest.raises(ModelError, match="bad request"):
        await with_retries(fatal, pol, stats, sleep=fake_sleep)
    assert stats.attempts == 4  # not retried

    async def empty():
        raise EmptyResponseError("no text")

    n0 = stats.attempts
    with pytest.raises(ModelError, match="no text"):
        await with_retries(empty, pol, stats, sleep=fake_sleep)
    assert stats.attempts - n0 == 2


def test_backoff_is_full_jitter_and_capped():
    pol = RetryPolicy(base_delay=0.5, max_delay=4.0)
    rng = random.Random(0)
    ds = [backoff_delay(k, pol, rng) for k in range(10) for _ in range(50)]
    assert min(ds) >= 0 and max(ds) <= 4.0
    assert max(backoff_delay(0, pol, rng) for _ in range(200)) <= 0.5
    # jitter: not all the same
    assert len({round(d, 6) for d in ds}) > 100


def test_provider_sdks_are_not_imported_with_recursa():
    # google-genai, boto3 and litellm load only when a gemini:/bedrock:/litellm: client is built
    import subprocess
    import sys
    code = ("import sys, recursa, recursa.models; "
            "print(sorted(m for m in ('google.genai', 'boto3', 'botocore', 'litellm') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"


# ------------------------------------------------------------------ usage of a reply
def test_usage_fields_are_read_as_token_counts_or_fail_naming_the_field():
    from types import SimpleNamespace

    from recursa.models.adapter import UsageFields
    from recursa.models.hosted import _usage
    fields = UsageFields(input=("in", "extra.read"), output=("out",), cached=("extra.read",),
                         cache_write=("writes",))
    raw = {"in": 8, "out": 7.0, "extra": {"read": 3}, "writes": None}
    assert _usage(raw, fields, "m") == (Usage(input_tokens=11, output_tokens=7,
                                              cached_tokens=3), 0)
    obj = SimpleNamespace(**{"in": 1, "out": 2, "extra": SimpleNamespace(read=None)})
    assert _usage(obj, fields, "m") == (Usage(input_tokens=1, output_tokens=2), 0)
    assert _usage(None, fields, "m") == (Usage(), 0)
    for bad in ("12", True, -1, 2.5, [3]):
        with pytest.raises(ModelError, match=r"model 'x': the reply's usage is malformed: "
                                             r"out is .*, not a token count") as ei:
            _usage({"in": 1, "out": bad}, fields, "model 'x'")
        assert not ei.value.retryable
