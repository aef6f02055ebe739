"""Prices of hosted models, so a run can report and limit its cost in USD: the one owner of
pricing. A client declares how it is priced (`Capabilities.pricing`, a `recursa.base.types.Pricing`);
this module prices it: `estimate` (a call's worst case, what a budget reserves), `charge` (what
a finished call cost) and `status` (whether a cost limit can be kept, for preflight).

An unknown model has cost None ("we don't know"), never 0.0: a budget that silently counted an
unpriced model as free would never stop. Local models (llama.cpp in-process) are free: 0.0.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from recursa.base.types import ModelClient, Pricing, Usage

from .registry import is_prefix


@dataclass(frozen=True)
class Price:
    """USD per 1M tokens. `cached_input` is the price of prompt tokens served from cache;
    `cache_write` (Anthropic) the price of writing them, defaulting to 1.25x input."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None


# Published list prices (standard tier, USD per 1M tokens) as of 2025-11.
# Check the providers' pricing pages when it matters; override with register_price().
_BUILTIN: dict[str, Price] = {
    # OpenAI
    "gpt-5": Price(1.25, 10.00, 0.125),
    "gpt-5.1": Price(1.25, 10.00, 0.125),
    "gpt-5-mini": Price(0.25, 2.00, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "gpt-5-chat-latest": Price(1.25, 10.00, 0.125),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "o1": Price(15.00, 60.00, 7.50),
    "o3": Price(2.00, 8.00, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o4-mini": Price(1.10, 4.40, 0.275),
    # Anthropic (cached_input = cache read = 0.1x input; cache write = 1.25x input)
    "claude-opus-4-5": Price(5.00, 25.00, 0.50),
    "claude-opus-4-1": Price(15.00, 75.00, 1.50),
    "claude-opus-4": Price(15.00, 75.00, 1.50),
    "claude-sonnet-4-5": Price(3.00, 15.00, 0.30),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30),
    "claude-3-7-sonnet": Price(3.00, 15.00, 0.30),
    "claude-haiku-4-5": Price(1.00, 5.00, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08),
    # Google Gemini API, prompts up to 200k tokens (2.5 Pro and 3 Pro charge more above that);
    # cached_input = context-cache reads (implicit or explicit), text
    "gemini-3-pro-preview": Price(2.00, 12.00, 0.20),
    "gemini-2.5-pro": Price(1.25, 10.00, 0.125),
    "gemini-2.5-flash": Price(0.30, 2.50, 0.03),
    "gemini-2.5-flash-lite": Price(0.10, 0.40, 0.01),
    "gemini-2.0-flash": Price(0.10, 0.40, 0.025),
    "gemini-2.0-flash-lite": Price(0.075, 0.30),
}

_lock = threading.Lock()
_registered: dict[str, Price] = {}

_DATE_SUFFIX = re.compile(r"(-\d{4}-\d{2}-\d{2}|-\d{8}|-latest)$")


@functools.lru_cache(maxsize=1024)   # called on every reservation and settlement
def normalize_model_name(model: str) -> str:
    """'openrouter:anthropic/claude-sonnet-4.5' -> 'claude-sonnet-4-5';
    'gpt-4o-mini-2024-07-18' -> 'gpt-4o-mini'. Dots become dashes on both sides of the lookup,
    so 'gpt-4.1' and OpenRouter's 'claude-sonnet-4.5' both match."""
    name = model.strip().lower()
    prefix, sep, rest = name.partition(":")
    if sep and is_prefix(prefix):  # only providers' spec prefixes: 'llama3:8b' keeps its tag
        name = rest
    name = name.rsplit("/", 1)[-1]
    name = _DATE_SUFFIX.sub("", name)
    return name.replace(".", "-")


_BUILTIN_BY_KEY: dict[str, Price] = {normalize_model_name(k): v for k, v in _BUILTIN.items()}


def _lookup(key: str) -> Price | None:
    """Registered prices win over the built-in table. No merged copy per call: a batch looks
    a price up twice per sub-call (the reservation and the settlement)."""
    p = _registered.get(key)
    return p if p is not None else _BUILTIN_BY_KEY.get(key)


def register_price(model: str, *, input: float, output: float,  # noqa: A002 - mirrors Price
                   cached_input: float | None = None, cache_write: float | None = None) -> None:
    """Set (or replace) the price of `model` for this process. USD per 1M tokens."""
    with _lock:
        _registered[normalize_model_name(model)] = Price(input, output, cached_input, cache_write)


def _coerce(p: Price | Mapping[str, float] | tuple[float, ...]) -> Price:
    if isinstance(p, Price):
        return p
    if isinstance(p, Mapping):
        return Price(**p)
    return Price(*p)


def price_for(model: str, overrides: Mapping[str, object] | None = None) -> Price | None:
    """The price of `model`, or None if unknown. `overrides` ({model: Price | dict | tuple})
    wins over registered prices, which win over the built-in table."""
    key = normalize_model_name(model)
    if overrides:
        for name, p in overrides.items():
            if normalize_model_name(name) == key:
                return _coerce(p)  # type: ignore[arg-type]
    return _lookup(key)


def cost_usd(model: str, usage: Usage, *, cache_write_tokens: int = 0,
             overrides: Mapping[str, object] | None = None) -> float | None:
    """USD for one call. `usage.input_tokens` includes cached and cache-write tokens (the OpenAI
    convention; the Anthropic client adds them up before calling this)."""
    p = price_for(model, overrides)
    if p is None:
        return None
    cached = min(usage.cached_tokens, usage.input_tokens)
    writes = min(cache_write_tokens, usage.input_tokens - cached)
    fresh = usage.input_tokens - cached - writes
    cached_price = p.cached_input if p.cached_input is not None else p.input
    write_price = p.cache_write if p.cache_write is not None else p.input * 1.25
    total = (fresh * p.input + cached * cached_price + writes * write_price
             + usage.output_tokens * p.output)
    return total / 1_000_000


def estimate_usd(model: str, input_tokens: int, output_tokens: int, *,
                 overrides: Mapping[str, object] | None = None) -> float | None:
    """Worst-case USD of a call before it is made (no cache discount): what a budget reserves.
    None when the model has no known price."""
    p = price_for(model, overrides)
    if p is None:
        return None
    return (input_tokens * p.input + output_tokens * p.output) / 1_000_000


# ---------------------------------------------------------------- a client's declared pricing
def _write_rate(p: Price) -> float:
    return p.cache_write if p.cache_write is not None else p.input * 1.25


def estimate(pricing: Pricing, input_tokens: int, output_tokens: int) -> float | None:
    """Worst-case USD of a call priced as `pricing` declares, before it is made (no cache
    discount; cache writes assumed where the client may make them). None: no known price."""
    if pricing.per_call is not None:
        return pricing.per_call
    if pricing.estimate is not None:
        try:
            return pricing.estimate(input_tokens, output_tokens)
        except Exception:      # a client's own estimator failing must not fail the call
            return None
    if pricing.model is None:
        return None
    p = price_for(pricing.model, pricing.overrides)
    if p is None:
        return None
    per_input = max(p.input, _write_rate(p)) if pricing.cache_writes else p.input
    return (input_tokens * per_input + output_tokens * p.output) / 1_000_000


def charge(pricing: Pricing, usage: Usage, *, cache_write_tokens: int = 0,
           model: str | None = None) -> float | None:
    """USD a finished call cost, from its usage; `model`: the name the reply gave, tried when
    the declared one has no price (a provider may answer with a dated or underlying name)."""
    if pricing.per_call is not None:
        return pricing.per_call
    for name in (pricing.model, model):
        if name:
            cost = cost_usd(name, usage, cache_write_tokens=cache_write_tokens,
                            overrides=pricing.overrides)
            if cost is not None:
                return cost
    return None


def status(pricing: Pricing) -> str | None:
    """'free', 'known' (recursa can price every call), 'reported' (the provider reports each
    call's cost) or None: nothing can keep a cost limit."""
    if pricing.per_call is not None:
        return "free" if pricing.per_call == 0 else "known"
    if estimate(pricing, 1, 1) is not None:
        return "known"
    return "reported" if pricing.reported else None


def estimate_for(client: ModelClient, input_tokens: int, output_tokens: int) -> float | None:
    """`estimate` of a client's declared pricing."""
    return estimate(client.capabilities.pricing, input_tokens, output_tokens)
