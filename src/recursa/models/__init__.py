"""Model clients behind one Protocol (`recursa.base.types.ModelClient`), named by spec strings.

    make_client("openai:gpt-5-mini")
    make_client("openai:qwen2.5-coder", base_url="http://127.0.0.1:8000/v1")  # any compatible server
    make_client("openrouter:anthropic/claude-sonnet-4.5")
    make_client("vllm:Qwen/Qwen2.5-7B-Instruct", base_url="http://gpu:8000/v1")
    make_client("anthropic:claude-sonnet-4-5")
    make_client("gemini:gemini-2.5-flash")                        # google-genai SDK
    make_client("azure:my-deployment")                             # AZURE_OPENAI_ENDPOINT
    make_client("bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    make_client("litellm:mistral/mistral-large-latest")            # anything LiteLLM knows
    make_client("local:qwen2.5-coder-0.5b")        # or local:/path/model.gguf
    make_client("replay:", responses=["...", "..."])

Each prefix is a Provider (registry.py; recursa's own in providers.py); another package adds
one through the `recursa.providers` entry point group, so `theirs:model` works everywhere a
spec does (`--model`, `RLM(model=...)`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from recursa.base.types import ModelClient

from .pricing import Price, cost_usd, price_for, register_price
from .providers import BUILTIN
from .registry import Provider, prefixes, provider, register_provider
from .replay import ReplayClient, ReplayExhausted
from .retry import EmptyResponseError, RetryPolicy, RetryStats

if TYPE_CHECKING:
    from .fetch import REGISTRY, FetchError, fetch_model, is_fetched, local_models, model_path

# the local-model catalogue and its downloader (fetch.py) load on first use of these names
# (PEP 562): a run with a remote model never needs them (~2 ms of `recursa run`'s start-up)
_FETCH_NAMES = frozenset({"REGISTRY", "FetchError", "fetch_model", "is_fetched",
                          "local_models", "model_path"})

__all__ = [
    "PREFIXES", "REGISTRY", "EmptyResponseError", "FetchError", "Price", "Provider",
    "ReplayClient", "ReplayExhausted", "RetryPolicy", "RetryStats", "cost_usd",
    "default_model_spec", "fetch_model", "is_fetched", "local_models", "make_client",
    "make_run_client", "model_path", "prefixes", "price_for", "provider", "provider_for_spec",
    "register_price", "register_provider",
]


def __getattr__(name: str) -> Any:
    if name not in _FETCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import fetch
    return getattr(fetch, name)


# recursa's own prefixes (providers.py lists them; other packages add more: registry.py)
PREFIXES = tuple(p.prefix for p in BUILTIN if p.prefix != "replay-file")

DEFAULT_OPENAI = "openai:gpt-5-mini"
DEFAULT_ANTHROPIC = "anthropic:claude-sonnet-4-5"
DEFAULT_LOCAL = "local:qwen2.5-coder-1.5b"


def default_model_spec(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The model to use when none is named, and why (for the CLI to print)."""
    env = os.environ if env is None else env
    if env.get("OPENAI_API_KEY"):
        return DEFAULT_OPENAI, "OPENAI_API_KEY is set"
    if env.get("ANTHROPIC_API_KEY"):
        return DEFAULT_ANTHROPIC, "ANTHROPIC_API_KEY is set (OPENAI_API_KEY is not)"
    return DEFAULT_LOCAL, ("no OPENAI_API_KEY or ANTHROPIC_API_KEY: using the free local model "
                           "(runs on CPU; fetched once, ~1.1 GB)")


def _bad_spec(spec: str, why: str) -> ValueError:
    hint = ""
    low = spec.lower()
    for p in BUILTIN:
        if p.hints and low.startswith(p.hints):
            hint = f" Did you mean '{p.prefix}:{spec}'?"
            break
    else:
        from .fetch import REGISTRY
        if low in REGISTRY or low.endswith(".gguf"):
            hint = f" Did you mean 'local:{spec}'?"
    shown = [p for p in prefixes() if p != "replay-file"]
    return ValueError(f"model spec {spec!r}: {why}. Use PREFIX:MODEL with PREFIX one of "
                      f"{', '.join(p + ':' for p in shown)}.{hint}")


def provider_for_spec(spec: str) -> tuple[Provider, str]:
    """The provider a spec names and the model part, or ValueError saying what is wrong."""
    prefix, sep, model = spec.partition(":")
    prefix = prefix.strip().lower()
    if not sep:
        raise _bad_spec(spec, "no provider prefix")
    p = provider(prefix)
    if p is None:
        raise _bad_spec(spec, f"unknown prefix {prefix!r}")
    model = model.strip()
    if not model and p.needs_model:
        raise _bad_spec(spec, "no model name after the prefix")
    return p, model


def make_run_client(spec: str, options: Mapping[str, Any], *, base_url: str | None,
                    api_key: str | None) -> ModelClient:
    """make_client for one of a run's models, with `options` for its constructor: the run's
    `base_url` goes only to providers that have an endpoint (local: and replay: have none)."""
    opts = dict(options)
    if base_url and provider_for_spec(spec)[0].endpoint:
        opts["base_url"] = base_url
    if api_key:
        opts["api_key"] = api_key
    return make_client(spec, **opts)


def make_client(spec: str, *, base_url: str | None = None, api_key: str | None = None,
                prices: Mapping[str, Any] | None = None, **opts: Any) -> ModelClient:
    """Build the client a spec string names, through its provider (registry.py). `opts` go to
    the client's constructor (e.g. max_retries, retry_base_delay, timeout, n_ctx,
    responses=...)."""
    p, model = provider_for_spec(spec)
    client: ModelClient = p.build(model, name=spec, base_url=base_url, api_key=api_key,
                                  prices=prices, **opts)
    return client
