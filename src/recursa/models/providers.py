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
import os
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, NamedTuple
from urllib.parse import urlsplit

Factory = Callable[..., Any]      # (model, *, name, [base_url, api_key, prices], **opts) -> client


class Provider(NamedTuple):
    """One provider: how its clients are built, and what the checks before a run need to know
    about it before any client exists (recursa.core.preflight).

    `factory`: the callable, or its "module:attribute" path. `endpoint`: it takes `base_url=`
    (local and scripted models have none). `default_url` / `url_env`: where it is reached when
    no base_url is given (the variable first; `url_of_env` turns its value into the base URL
    when it is not one already, as OLLAMA_HOST's `host:port`); `needs_endpoint`: it has no
    default, so one of them is required.
    `key_env`: the variables its key may come from (empty: its SDK finds credentials itself,
    or it needs none; a key stored in the user's config file is used when none of them is set);
    `key_at_default_url_only`: a base_url elsewhere needs no key (an OpenAI-compatible server
    of one's own). `free`: its calls cost nothing; `reports_cost`: the provider reports each
    call's cost, so a cost limit holds without a table price. `model_file`: the model is a file
    on this machine (or a registry name). `structured`: how its clients constrain a reply to a
    JSON schema. `hints`: how model names meant for it start, to suggest the prefix when one is
    missing. `needs_model`: a spec without a model name after the prefix is an error.
    `example`: a model it serves (for the docs and the provider conformance tests).
    `models_api`: how its server lists the models it serves (`recursa models list`):
    "ollama" (GET /api/tags beside the /v1 base URL) or "openai" (GET {base_url}/models)."""

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
    url_of_env: Callable[[str], str] | None = None
    models_api: Literal["ollama", "openai"] | None = None

    def build(self, model: str, *, name: str, base_url: str | None = None,
              api_key: str | None = None, prices: Any = None, **opts: Any) -> Any:
        """A client for `model`; only the arguments given reach the factory."""
        given = {k: v for k, v in (("base_url", base_url), ("api_key", api_key),
                                   ("prices", prices)) if v is not None}
        return self.load()(model, name=name, **given, **opts)

    def endpoint_url(self, base_url: str | None = None,
                     env: Mapping[str, str] | None = None) -> str | None:
        """Where its clients go: `base_url`, else the `url_env` variable's URL, else
        `default_url` (None: nowhere known)."""
        if base_url:
            return base_url
        value = (os.environ if env is None else env).get(self.url_env or "", "").strip()
        if value:
            return self.url_of_env(value) if self.url_of_env else value
        return self.default_url

    def wants_key(self, base_url: str | None = None) -> bool:
        """Whether its clients need a key when sent to `base_url` (None: its default URL); a
        key of a provider that sends it to its own URL only is not sent elsewhere."""
        if not self.key_env:
            return False
        elsewhere = bool(base_url) and self.default_url is not None and \
            urlsplit(base_url or "").hostname != urlsplit(self.default_url).hostname
        return not (self.key_at_default_url_only and elsewhere)

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


def ollama_url(host: str) -> str:
    """The /v1 base URL of the Ollama server OLLAMA_HOST names, read as Ollama's own command
    reads it: `[scheme://]host[:port][/path]`, http and port 11434 when not given (80 / 443
    for an explicit http:// / https:// without a port), 127.0.0.1 when only a port is."""
    scheme, sep, rest = host.strip().partition("://")
    if not sep:
        scheme, rest, port = "http", scheme, "11434"
    else:
        port = "443" if scheme == "https" else "80"
    hostport, _, path = rest.partition("/")
    name, colon, given = hostport.rpartition(":")
    if colon and given.isdigit() and (not name.startswith("[") or name.endswith("]")):
        hostport, port = name, given
    hostport = hostport or "127.0.0.1"
    path = path.strip("/")
    return f"{scheme}://{hostport}:{port}" + (f"/{path}" if path else "") + "/v1"


OLLAMA_URL: Final = "http://localhost:11434/v1"
LMSTUDIO_URL: Final = "http://localhost:1234/v1"
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
             example="Qwen/Qwen2.5-7B-Instruct", models_api="openai"),
    Provider("ollama", _HOSTED + "openai_client:ollama",
             "an Ollama server (OLLAMA_HOST, else localhost:11434); free",
             default_url=OLLAMA_URL, url_env="OLLAMA_HOST", url_of_env=ollama_url, free=True,
             structured=_RESPONSE_FORMAT, example="llama3.2", models_api="ollama"),
    Provider("lmstudio", _HOSTED + "openai_client:lmstudio",
             "LM Studio's server (localhost:1234, or base_url=); free",
             default_url=LMSTUDIO_URL, free=True, structured=_RESPONSE_FORMAT,
             example="qwen2.5-7b-instruct", models_api="openai"),
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


def builtin(prefix: str) -> Provider:
    """recursa's own row for `prefix` (KeyError: none)."""
    for p in BUILTIN:
        if p.prefix == prefix:
            return p
    raise KeyError(prefix)
