"""recursa's own model providers: the one list of built-in spec prefixes (see registry.py).

Each factory imports its client module when called, so listing the providers imports no SDK.
"""

from __future__ import annotations

import os
from typing import Any, Final

from .registry import Provider

OPENAI_URL = "https://api.openai.com/v1"


def _openai(model: str, **kw: Any) -> Any:
    from .openai_client import OpenAIClient
    return OpenAIClient(model, **kw)


def _openrouter(model: str, *, name: str, api_key: str | None = None, **kw: Any) -> Any:
    from .openai_client import OPENROUTER_BASE_URL, OpenAIClient
    key = api_key or os.environ.get("OPENROUTER_API_KEY")
    if not key:
        raise ValueError(f"{name}: set OPENROUTER_API_KEY or pass api_key=")
    # ask for the charged cost in `usage.cost`: what keeps a cost limit without a price table
    kw["default_options"] = {"extra_body": {"usage": {"include": True}},
                             **kw.get("default_options", {})}
    kw["base_url"] = kw.get("base_url") or OPENROUTER_BASE_URL
    return OpenAIClient(model, api_key=key, name=name, provider="openrouter", **kw)


def _vllm(model: str, *, name: str, base_url: str | None = None, api_key: str | None = None,
          **kw: Any) -> Any:
    from .openai_client import OpenAIClient
    url = base_url or os.environ.get("VLLM_BASE_URL")
    if not url:
        raise ValueError(f"{name}: a vLLM server needs base_url= or VLLM_BASE_URL "
                         "(e.g. http://host:8000/v1)")
    key = api_key or os.environ.get("VLLM_API_KEY") or "EMPTY"
    return OpenAIClient(model, base_url=url, api_key=key, name=name, provider="vllm", **kw)


def _anthropic(model: str, **kw: Any) -> Any:
    from .anthropic_client import AnthropicClient
    return AnthropicClient(model, **kw)


def _gemini(model: str, **kw: Any) -> Any:
    from .gemini_client import GeminiClient
    return GeminiClient(model, **kw)


def _azure(model: str, **kw: Any) -> Any:
    from .azure_client import AzureOpenAIClient
    return AzureOpenAIClient(model, **kw)


def _bedrock(model: str, **kw: Any) -> Any:
    from .bedrock_client import BedrockClient
    return BedrockClient(model, **kw)


def _litellm(model: str, **kw: Any) -> Any:
    from .litellm_client import LiteLLMClient
    return LiteLLMClient(model, **kw)


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

BUILTIN: tuple[Provider, ...] = (
    Provider("openai", _openai, "OpenAI, or any OpenAI-compatible server with base_url=",
             default_url=OPENAI_URL, key_env=("OPENAI_API_KEY",), key_at_default_url_only=True,
             structured=_RESPONSE_FORMAT, hints=("gpt", "o1", "o3", "o4")),
    Provider("openrouter", _openrouter, "OpenRouter (reports each call's cost)",
             default_url="https://openrouter.ai/api/v1", key_env=("OPENROUTER_API_KEY",),
             reports_cost=True, structured=_RESPONSE_FORMAT),
    Provider("vllm", _vllm, "a vLLM server (base_url= or VLLM_BASE_URL)",
             url_env="VLLM_BASE_URL", needs_endpoint=True, structured=_RESPONSE_FORMAT),
    Provider("anthropic", _anthropic, "Anthropic's Messages API",
             default_url="https://api.anthropic.com", key_env=("ANTHROPIC_API_KEY",),
             hints=("claude",)),
    Provider("gemini", _gemini, "Google's Gemini API (google-genai)",
             default_url="https://generativelanguage.googleapis.com",
             key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"), hints=("gemini",)),
    Provider("azure", _azure, "Azure OpenAI (AZURE_OPENAI_ENDPOINT)",
             url_env="AZURE_OPENAI_ENDPOINT", needs_endpoint=True,
             key_env=("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN"),
             structured=_RESPONSE_FORMAT),
    Provider("bedrock", _bedrock, "Anthropic models on AWS Bedrock",
             hints=("anthropic.", "us.anthropic.", "eu.anthropic.", "apac.anthropic.")),
    Provider("litellm", _litellm, "anything LiteLLM knows (PROVIDER/MODEL)"),
    Provider("local", _local, "a GGUF model in a llama.cpp server recursa runs",
             endpoint=False, free=True, model_file=True, structured="json_schema"),
    Provider("replay", _replay, "a scripted model (tests)", endpoint=False, free=True,
             needs_model=False),
    Provider("replay-file", _replay_file, "a scripted model read from a JSON file (tests)",
             endpoint=False, free=True),
)
