"""Anthropic prompt caching: where the client puts cache_control breakpoints, and what a server
that bills cache reads and writes like the real API (tests/provider_fakes.PromptCache) charges
for a growing conversation with and without them."""

from __future__ import annotations

import pytest

from provider_fakes import PromptCache, ProviderFake
from recursa.base.types import Usage
from recursa.models import make_client
from recursa.models.anthropic_client import add_cache_breakpoints
from recursa.models.pricing import cost_usd

SYSTEM = "You are the root model of a recursive language model run. " * 100  # ~1.5k tokens


def _marks(system, turns):
    n = sum(1 for b in (system or []) if b.get("cache_control"))
    for t in turns:
        if isinstance(t["content"], list):
            n += sum(1 for b in t["content"] if b.get("cache_control"))
    return n


def test_breakpoints_one_shot_and_conversation():
    system, turns = add_cache_breakpoints("sys", [{"role": "user", "content": "q"}])
    assert system == [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
    assert turns == [{"role": "user", "content": "q"}]      # one-shot: no write nobody reads
    conv = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "u3"}]
    system, turns = add_cache_breakpoints(None, conv)
    assert system is None and _marks(system, turns) == 2
    assert [isinstance(t["content"], list) for t in turns] == [False, False, True, False, True]
    assert conv[2]["content"] == "u2"                       # the caller's list is not changed
    system, turns = add_cache_breakpoints("s", conv)
    assert _marks(system, turns) == 3                       # the API allows at most 4
    _, turns = add_cache_breakpoints(None, [*conv[:-1], {"role": "user", "content": ""}])
    assert turns[-1]["content"] == ""                        # never a marked empty block


async def _conversation(url: str, turns: int, **kw) -> tuple[list, object]:
    c = make_client("anthropic:claude-sonnet-4-5", base_url=url, api_key="ak", **kw)
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Context: 1M chars. " + "x" * 2000}]
    out = []
    for i in range(turns):
        r = await c.complete(msgs)
        out.append(r)
        msgs += [{"role": "assistant", "content": f"```repl\nprint({i})\n```" + "y" * 1500},
                 {"role": "user", "content": f"Output: {i}\n" + "z" * 1500}]
    await c.aclose()
    return out, c


async def test_growing_history_is_read_from_cache_and_costs_less():
    with ProviderFake(cache=PromptCache(min_tokens=1024)) as fake:
        cached, client = await _conversation(fake.url, 4)
        body = fake.requests[-1]["body"]
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    with ProviderFake(cache=PromptCache(min_tokens=1024)) as fake:
        plain, _ = await _conversation(fake.url, 4, prompt_cache=False)
        assert isinstance(fake.requests[-1]["body"]["system"], str)   # no breakpoints sent
    reads = [r.usage.cached_tokens for r in cached]
    # call 1 writes the system prompt; call 2 reads it; then each call reads the previous
    # call's whole prefix, so reads grow by about one turn each time
    assert reads[0] == 0 and 0 < reads[1] < reads[2] < reads[3]
    assert reads[3] > 0.8 * cached[3].usage.input_tokens
    assert all(r.usage.cached_tokens == 0 for r in plain)
    # same tokens billed either way, at different prices
    assert [r.usage.input_tokens for r in cached] == [r.usage.input_tokens for r in plain]
    assert client.cache_write_tokens > 0
    assert cached[0].cost_usd > plain[0].cost_usd            # the first write costs 1.25x
    assert sum(r.cost_usd for r in cached) < 0.75 * sum(r.cost_usd for r in plain)


async def test_cost_counts_writes_and_reservation_covers_them():
    with ProviderFake(cache=PromptCache(min_tokens=10)) as fake:
        c = make_client("anthropic:claude-sonnet-4-5", base_url=fake.url, api_key="ak")
        r = await c.complete([{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": "hi"}])
        write = c.cache_write_tokens
        assert write > 0 and r.usage.cached_tokens == 0
        assert r.cost_usd == pytest.approx(cost_usd("claude-sonnet-4-5", r.usage,
                                                    cache_write_tokens=write))
        fresh = r.usage.input_tokens - write
        assert r.cost_usd == pytest.approx((fresh * 3 + write * 3.75
                                            + r.usage.output_tokens * 15) / 1e6)
        # the budget's worst-case estimate must not undercount a call that writes the cache
        assert c.estimate_cost(r.usage.input_tokens, r.usage.output_tokens) >= r.cost_usd
        await c.complete([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
                         prompt_cache=False)          # per call: no breakpoints
        assert fake.requests[-1]["body"]["system"] == "s"
        await c.aclose()


def test_cached_price_used_for_every_provider_table():
    u = Usage(input_tokens=1000, output_tokens=0, cached_tokens=1000)
    assert cost_usd("gemini-2.5-flash", u) == pytest.approx(1000 * 0.03 / 1e6)
    assert cost_usd("gpt-4o-mini", u) == pytest.approx(1000 * 0.075 / 1e6)
    assert cost_usd("claude-haiku-4-5", u) == pytest.approx(1000 * 0.10 / 1e6)


def test_the_root_system_prompt_is_the_same_for_every_context():
    """What varies by run (the context's type, size, preview; the query) is in the first user
    message, so a local server's prompt cache reads the system prompt once for many runs."""
    import asyncio

    from recursa import RLM
    from recursa.core.prompts import system_prompt
    from recursa.models.replay import ReplayClient

    assert system_prompt(context_type="str, 12 characters", max_output_chars=2000) == \
        system_prompt(context_type="list of 9,000 items", max_output_chars=2000)
    seen: list[list[dict]] = []

    class Recording(ReplayClient):
        async def complete(self, messages, **options):
            seen.append(messages)
            return await super().complete(messages, **options)

    for context in ("short text", "x" * 50_000):
        rlm = RLM(model=Recording(["```repl\nFINAL('ok')\n```"]), sandbox="inprocess",
                  strategy="code")
        assert asyncio.run(rlm.acompletion("what?", context=context)).answer == "ok"
    first, second = (m[0] for m in seen)
    assert first["role"] == "system" and first["content"] == second["content"]
    assert "50,000" in seen[1][1]["content"]           # the size is still shown, to the user turn
