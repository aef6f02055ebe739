"""What a model provider is (`Provider`), and recursa's own: the one list of built-in spec
prefixes (registry.py serves them, and other packages' beside them).

A row names its factory by import path ("module:attribute", loaded on the first build, as an
entry point is) or gives it as a callable. The hosted providers are named by path: their
modules import their SDKs and the shared control flow, which prices calls through the
registry, so the rows stay data that listing the providers (or pricing a call) reads without
them. A hosted provider is one adapter file (see adapter.py, hosted.py) plus one row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final, Literal, NamedTuple

Factory = Callable[..., Any]      # (model, *, name, [base_url, api_key, prices], **opts) -> client


class Provider(NamedTuple):
    """One provider: how its clients are built, and what the checks before a run need to know
    about it before any client exists (recursa.core.preflight).

    `factory`: the callable, or its "module:attribute" path. `endpoint`: it takes `base_url=`
    (local and scripted models have none). `default_url` / `url_env`: where it is reached when
    no base_url is given; `needs_endpoint`: it has no default, so one of them is required.
    `key_env`: the variables its key may come from (empty: its SDK finds credentials itself);
    `key_at_default_url_only`: a base_url elsewhere needs no key (an OpenAI-compatible server
    of one's own). `free`: its calls cost nothing; `reports_cost`: the provider reports each
    call's cost, so a cost limit holds without a table price. `model_file`: the model is a file
    on this machine (or a registry name). `structured`: how its clients constrain a reply to a
    JSON schema. `hints`: how model names meant for it start, to suggest the prefix when one is
    missing. `needs_model`: a spec without a model name after the prefix is an error.
    `example`: a model it serves (for the docs and the provider conformance tests)."""

    prefix: str
    factory: Factory | str
    description: str = ""
    endpoint: bool = True
    default_url: str | None = None
    url_env: str | None = None
    needs_endpoint: bool = False
    key_env: tuple[str, ...] = ()
    key_at_default_url_only: bool = False
    free: bool = False
    reports_cost: bool = False
    model_file: bool = False
    structured: Literal["json_schema", "response_format"] | None = None
    hints: tuple[str, ...] = ()
    needs_model: bool = True
    example: str = ""

    def build(self, model: str, *, name: str, base_url: str | None = None,
              api_key: str | None = None, prices: Any = None, **opts: Any) -> Any:
        """A client for `model`; only the arguments given reach the factory."""
        given = {k: v for k, v in (("base_url", base_url), ("api_key", api_key),
                                   ("prices", prices)) if v is not None}
        return self.load()(model, name=name, **given, **opts)

    def load(self) -> Factory:
        """The factory (imported now when the row names it by path)."""
        if callable(self.factory):
            return self.factory
        module, _, attr = self.factory.partition(":")
        factory: Factory = getattr(importlib.import_module(module), attr)
        return factory


# ------------------------------------------------------------------ the local and scripted
def _local(model: str, *, base_url: str | None = None, api_key: str | None = None,
           prices: Any = None, **kw: Any) -> Any:
    from .local import LocalClient
    if base_url or api_key:
        raise ValueError("local: models run in a llama.cpp server recursa starts itself; "
                         "for a server you run, use 'openai:MODEL' with base_url=")
    return LocalClient(model, **kw)


def _replay(model: str, *, name: str, prices: Any = None, **kw: Any) -> Any:
    from .replay import ReplayClient
    responses = kw.pop("responses", ())
    return ReplayClient(responses, name=name, **kw)


def _replay_file(model: str, *, name: str, **_: Any) -> Any:
    from .replay import load_replay_file
    return load_replay_file(name)


_RESPONSE_FORMAT: Final = "response_format"   # OpenAI-compatible servers take a JSON schema there
_HOSTED: Final = "recursa.models."

BUILTIN: tuple[Provider, ...] = (
    Provider("openai", _HOSTED + "openai_client:OpenAIClient",
             "OpenAI, or any OpenAI-compatible server with base_url=",
             default_url="https://api.openai.com/v1", key_env=("OPENAI_API_KEY",),
             key_at_default_url_only=True, structured=_RESPONSE_FORMAT,
             hints=("gpt", "o1", "o3", "o4"), example="gpt-4o-mini"),
    Provider("openrouter", _HOSTED + "openai_client:openrouter",
             "OpenRouter (reports each call's cost)",
             default_url="https://openrouter.ai/api/v1", key_env=("OPENROUTER_API_KEY",),
             reports_cost=True, structured=_RESPONSE_FORMAT,
             example="anthropic/claude-haiku-4.5"),
    Provider("vllm", _HOSTED + "openai_client:vllm", "a vLLM server (base_url= or VLLM_BASE_URL)",
             url_env="VLLM_BASE_URL", needs_endpoint=True, structured=_RESPONSE_FORMAT,
             example="Qwen/Qwen2.5-7B-Instruct"),
    Provider("anthropic", _HOSTED + "anthropic_client:AnthropicClient",
             "Anthropic's Messages API",
             default_url="https://api.anthropic.com", key_env=("ANTHROPIC_API_KEY",),
             hints=("claude",), example="claude-haiku-4-5"),
    Provider("gemini", _HOSTED + "gemini_client:GeminiClient",
             "Google's Gemini API (google-genai)",
             default_url="https://generativelanguage.googleapis.com",
             key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"), hints=("gemini",),
             example="gemini-2.5-flash"),
    Provider("azure", _HOSTED + "azure_client:AzureOpenAIClient",
             "Azure OpenAI (AZURE_OPENAI_ENDPOINT)",
             url_env="AZURE_OPENAI_ENDPOINT", needs_endpoint=True,
             key_env=("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN"),
             structured=_RESPONSE_FORMAT, example="gpt-4o-mini"),
    Provider("bedrock", _HOSTED + "bedrock_client:BedrockClient",
             "Anthropic models on AWS Bedrock",
             hints=("anthropic.", "us.anthropic.", "eu.anthropic.", "apac.anthropic."),
             example="us.anthropic.claude-haiku-4-5-20251001-v1:0"),
    Provider("litellm", _HOSTED + "litellm_client:LiteLLMClient",
             "anything LiteLLM knows (PROVIDER/MODEL)", example="openai/gpt-4o-mini"),
    Provider("local", _local, "a GGUF model in a llama.cpp server recursa runs",
             endpoint=False, free=True, model_file=True, structured="json_schema",
             example="qwen2.5-coder-1.5b"),
    Provider("replay", _replay, "a scripted model (tests)", endpoint=False, free=True,
             needs_model=False),
    Provider("replay-file", _replay_file, "a scripted model read from a JSON file (tests)",
             endpoint=False, free=True),
)
