"""Model clients behind one Protocol (`recursa.types.ModelClient`), named by spec strings.

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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..types import ModelClient
from .fetch import REGISTRY, FetchError, fetch_model, is_fetched, local_models, model_path
from .pricing import Price, cost_usd, price_for, register_price
from .replay import ReplayClient, ReplayExhausted
from .retry import EmptyResponseError, RetryPolicy, RetryStats

__all__ = [
    "PREFIXES", "REGISTRY", "EmptyResponseError", "FetchError", "Price", "ReplayClient",
    "ReplayExhausted", "RetryPolicy", "RetryStats", "cost_usd", "default_model_spec",
    "fetch_model", "is_fetched", "local_models", "make_client", "make_run_client", "model_path",
    "price_for", "register_price",
]

PREFIXES = ("openai", "openrouter", "vllm", "anthropic", "gemini", "azure", "bedrock", "litellm",
            "local", "replay")

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
    if low.startswith("claude"):
        hint = f" Did you mean 'anthropic:{spec}'?"
    elif low.startswith(("gpt", "o1", "o3", "o4")):
        hint = f" Did you mean 'openai:{spec}'?"
    elif low.startswith("gemini"):
        hint = f" Did you mean 'gemini:{spec}'?"
    elif low.startswith(("anthropic.", "us.anthropic.", "eu.anthropic.", "apac.anthropic.")):
        hint = f" Did you mean 'bedrock:{spec}'?"
    elif low in REGISTRY or low.endswith(".gguf"):
        hint = f" Did you mean 'local:{spec}'?"
    return ValueError(f"model spec {spec!r}: {why}. Use PREFIX:MODEL with PREFIX one of "
                      f"{', '.join(p + ':' for p in PREFIXES)}.{hint}")


def make_run_client(spec: str, options: Mapping[str, Any], *, base_url: str | None,
                    api_key: str | None) -> ModelClient:
    """make_client for one of a run's models, with `options` for its constructor: the run's
    `base_url` goes only to providers that have an endpoint (local: and replay: have none)."""
    opts = dict(options)
    if base_url and spec.split(":", 1)[0] not in ("local", "replay"):
        opts["base_url"] = base_url
    if api_key:
        opts["api_key"] = api_key
    return make_client(spec, **opts)


def make_client(spec: str, *, base_url: str | None = None, api_key: str | None = None,
                prices: Mapping[str, Any] | None = None, **opts: Any) -> ModelClient:
    """Build the client a spec string names. `opts` go to the client's constructor
    (e.g. max_retries, retry_base_delay, timeout, n_ctx, responses=...)."""
    if spec.startswith("replay-file:"):          # test-only scripted model from a JSON file
        from .replay import load_replay_file
        return load_replay_file(spec)
    prefix, sep, model = spec.partition(":")
    prefix = prefix.strip().lower()
    if not sep:
        raise _bad_spec(spec, "no provider prefix")
    if prefix not in PREFIXES:
        raise _bad_spec(spec, f"unknown prefix {prefix!r}")
    model = model.strip()
    if not model and prefix != "replay":
        raise _bad_spec(spec, "no model name after the prefix")

    if prefix == "replay":
        responses = opts.pop("responses", ())
        return ReplayClient(responses, name=spec, **opts)

    if prefix == "local":
        from .local import LocalClient
        if base_url or api_key:
            raise ValueError("local: models run in a llama.cpp server recursa starts itself; "
                             "for a server you run, use 'openai:MODEL' with base_url=")
        return LocalClient(model, name=spec, **opts)

    if prefix == "anthropic":
        from .anthropic_client import AnthropicClient
        return AnthropicClient(model, base_url=base_url, api_key=api_key, name=spec,
                               prices=prices, **opts)

    if prefix == "gemini":
        from .gemini_client import GeminiClient
        return GeminiClient(model, base_url=base_url, api_key=api_key, name=spec, prices=prices,
                            **opts)
    if prefix == "azure":
        from .azure_client import AzureOpenAIClient
        return AzureOpenAIClient(model, base_url=base_url, api_key=api_key, name=spec,
                                 prices=prices, **opts)
    if prefix == "bedrock":
        from .bedrock_client import BedrockClient
        return BedrockClient(model, base_url=base_url, api_key=api_key, name=spec, prices=prices,
                             **opts)
    if prefix == "litellm":
        from .litellm_client import LiteLLMClient
        return LiteLLMClient(model, base_url=base_url, api_key=api_key, name=spec, prices=prices,
                             **opts)

    from .openai_client import OPENROUTER_BASE_URL, OpenAIClient
    if prefix == "openrouter":
        key = api_key or os.environ.get("OPENROUTER_API_KEY")
        if not key:
            raise ValueError(f"{spec}: set OPENROUTER_API_KEY or pass api_key=")
        # ask for the charged cost in `usage.cost`: what keeps a cost limit without a price table
        opts["default_options"] = {"extra_body": {"usage": {"include": True}},
                                   **opts.get("default_options", {})}
        return OpenAIClient(model, base_url=base_url or OPENROUTER_BASE_URL, api_key=key,
                            name=spec, provider="openrouter", prices=prices, **opts)
    if prefix == "vllm":
        url = base_url or os.environ.get("VLLM_BASE_URL")
        if not url:
            raise ValueError(f"{spec}: a vLLM server needs base_url= or VLLM_BASE_URL "
                             "(e.g. http://host:8000/v1)")
        key = api_key or os.environ.get("VLLM_API_KEY") or "EMPTY"
        return OpenAIClient(model, base_url=url, api_key=key, name=spec, provider="vllm",
                            prices=prices, **opts)
    return OpenAIClient(model, base_url=base_url, api_key=api_key, name=spec, prices=prices,
                        **opts)
