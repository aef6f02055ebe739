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
    make_client("ollama:llama3.2")                  # Ollama (OLLAMA_HOST), free
    make_client("lmstudio:qwen2.5-7b-instruct")     # LM Studio on localhost:1234, free
    make_client("replay:", responses=["...", "..."])
    make_client("fast")                             # an alias of the user's settings file

Each prefix is a Provider (registry.py; recursa's own in providers.py); another package adds
one through the `recursa.providers` entry point group, so `theirs:model` works everywhere a
spec does (`--model`, `RLM(model=...)`). Every front end turns what the user named (or did not
name) into a spec through `resolve_model` (aliases, the default model: userconfig.py).
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


def resolve_model(spec: str | None = None,
                  env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The spec to run for what the user named, and why (for a front end to say; "" when a
    full spec was named). An alias of the user's settings file (userconfig.py) becomes its
    spec; no name at all is the default model: RECURSA_MODEL, else the file's default_model,
    else openai:/anthropic: when their key variable is set (or, after those, a key of theirs is
    stored in the file), else the free local model. The one place model names are resolved:
    `run`, `chat`, `serve`, `bench`, RLM(), make_client and the llm plugin all come here."""
    env = os.environ if env is None else env
    if spec is not None and spec.strip():
        return _unalias(spec.strip()), ""
    chosen = (env.get("RECURSA_MODEL") or "").strip()
    if chosen:
        return _unalias(chosen), "RECURSA_MODEL is set"
    from .userconfig import config_path, load
    path = config_path()
    cfg = load(path)
    if cfg.default_model:
        return _unalias(cfg.default_model, cfg.aliases), f"the default model set in {path}"
    if env.get("OPENAI_API_KEY"):
        return DEFAULT_OPENAI, "OPENAI_API_KEY is set"
    if env.get("ANTHROPIC_API_KEY"):
        return DEFAULT_ANTHROPIC, "ANTHROPIC_API_KEY is set (OPENAI_API_KEY is not)"
    for name, default in (("openai", DEFAULT_OPENAI), ("anthropic", DEFAULT_ANTHROPIC)):
        if name in cfg.key_names:
            return default, f"a key for {name}: is stored in {path}"
    return DEFAULT_LOCAL, ("no OPENAI_API_KEY or ANTHROPIC_API_KEY: using the free local model "
                           "(runs on CPU; fetched once, ~1.1 GB)")


def default_model_spec(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The model to use when none is named, and why (for the CLI to print)."""
    return resolve_model(None, env)


def _unalias(spec: str, aliases: Mapping[str, str] | None = None) -> str:
    """`spec`, or the spec it is an alias of. A spec has a prefix and an alias never does, so
    the settings file is read only for a bare name."""
    if ":" in spec:
        return spec
    if aliases is None:
        from .userconfig import load
        aliases = load().aliases
    return aliases.get(spec, spec)


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
        raise _bad_spec(spec, "no provider prefix, and no alias of that name "
                        "(recursa aliases list)")
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
    """Build the client a spec string (or an alias of one) names, through its provider
    (registry.py). `opts` go to the client's constructor (e.g. max_retries, retry_base_delay,
    timeout, n_ctx, responses=...). Without `api_key`, a provider that needs one gets it from
    its variables (OPENAI_API_KEY...), else from the user's settings file."""
    spec = resolve_model(spec)[0]
    p, model = provider_for_spec(spec)
    if api_key is None and p.wants_key(base_url) and \
            not any(os.environ.get(n) for n in p.key_env):
        from .userconfig import stored_key
        api_key = stored_key(p.prefix)
    client: ModelClient = p.build(model, name=spec, base_url=base_url, api_key=api_key,
                                  prices=prices, **opts)
    return client
