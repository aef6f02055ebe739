"""Any OpenAI-compatible chat-completions endpoint: OpenAI, OpenRouter, vLLM, SGLang, Ollama,
LM Studio, llama.cpp server...: the `openai:`, `openrouter:`, `vllm:`, `ollama:` and
`lmstudio:` providers.

`ChatWire` is the chat-completions dialect (request, reply, stream chunks), shared with Azure
(azure_client.py); `OpenAIChat` sends it straight through httpx (a keep-alive pool per event
loop, see httppool.py), not the `openai` SDK: the SDK costs ~0.8 s to import (most of a CLI
run's start-up) and ~2 ms of event-loop CPU per request (which kept big batches from going out
as one wave), and the wire format is plain JSON. Proxies (HTTPS_PROXY, NO_PROXY...) are
honoured as httpx does. Attempts, retries, usage and cost are the shared flow's (hosted.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Unpack

from recursa.base.types import Message, ModelError
from recursa.models._http import httpx

from .adapter import Reply, UsageFields, connection_error, describe, status_error, timed_out
from .hosted import ClientOptions, HostedClient
from .httppool import LoopPool
from .logprobs import first_logprobs

log = logging.getLogger("recursa.models")

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"

# Options passed straight to chat.completions when given; anything else is ignored with a
# warning (sandboxed code may pass options meant for another client).
_PASSTHROUGH = ("top_p", "seed", "reasoning_effort", "response_format", "presence_penalty",
                "frequency_penalty", "logit_bias", "user", "service_tier", "verbosity",
                "prompt_cache_key", "extra_headers", "extra_query", "logprobs",
                "top_logprobs")

# OpenAI reasoning models reject any temperature other than the default.
_REASONING_MODEL = re.compile(r"^(o\d|gpt-5)")


class ChatWire:
    """The chat-completions dialect: the request (the SDK's keyword arguments: `extra_body`,
    `extra_headers`, `extra_query` and `timeout` beside the JSON fields), the reply (a dict)
    and the stream's chunks. The transport is a subclass's (`send`, `stream`, `error`)."""

    usage_fields = UsageFields(input=("prompt_tokens",), output=("completion_tokens",),
                               cached=("prompt_tokens_details.cached_tokens",))

    def __init__(self, model: str, base_url: str, *, max_tokens_param: str,
                 drop_temperature: bool = False) -> None:
        self.model = model
        self.where = describe(model, base_url)
        self.max_tokens_param = max_tokens_param
        self.drop_temperature = drop_temperature

    def request(self, messages: list[Message], options: dict[str, Any],
                timeout: float) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": self.model, "messages": messages, "timeout": timeout}
        max_tokens = options.pop("max_tokens", None)
        if max_tokens is not None:
            kw[self.max_tokens_param] = int(max_tokens)
        temperature = options.pop("temperature", None)
        if temperature is not None:
            if self.drop_temperature and temperature != 1:
                log.debug("%s: reasoning model takes no temperature; dropped %s",
                          self.where, temperature)
            else:
                kw["temperature"] = temperature
        stop = options.pop("stop", None)
        if stop:
            kw["stop"] = stop
        tools = options.pop("tools", None)
        if tools:   # native tool calling (recursa.core.tools runs the loop)
            kw["tools"] = tools
            if "tool_choice" in options:
                kw["tool_choice"] = options.pop("tool_choice")
        extra_body = options.pop("extra_body", None)
        if extra_body:
            kw["extra_body"] = extra_body
        for key in _PASSTHROUGH:
            if key in options:
                kw[key] = options.pop(key)
        return kw

    def read(self, resp: dict[str, Any]) -> Reply:
        u = resp.get("usage")
        usage = u if isinstance(u, dict) else None   # some servers send none
        text, finish, tools, logprobs = "", None, False, None
        choices = resp.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            choice = choices[0]
            found = choice.get("message")
            message: dict[str, Any] = found if isinstance(found, dict) else {}
            content = message.get("content")
            if isinstance(content, list):   # content parts, as a few servers send
                content = "".join(str(p.get("text") or "") for p in content
                                  if isinstance(p, dict))
            text = content if isinstance(content, str) else ""
            finish, tools = choice.get("finish_reason"), bool(message.get("tool_calls"))
            logprobs = first_logprobs(resp) if choice.get("logprobs") else None
        return Reply(text=text, finish=finish, model=resp.get("model"), usage=usage,
                     cost_usd=usage.get("cost") if usage else None,   # OpenRouter's charge
                     tool_calls=tools, first_logprobs=logprobs, raw=resp)

    def streamed(self, request: dict[str, Any]) -> dict[str, Any]:
        return {**request, "stream": True, "stream_options": {"include_usage": True}}


class ChatStream:
    """One streamed chat reply, chunk by chunk: `take(chunk)` gives the chunk's text,
    `reply()` the closing Reply (finish None: no chunk said the reply was done)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = ""
        self.usage: Any = None
        self.finish: str | None = None
        self.parts: list[str] = []

    def take(self, chunk: dict[str, Any]) -> str:
        self.model = chunk.get("model") or self.model
        self.id = chunk.get("id") or self.id
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        text = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or (choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                text += delta["content"]
            self.finish = choice.get("finish_reason") or self.finish
        if text:
            self.parts.append(text)
        return text

    def reply(self) -> Reply:
        raw = {"id": self.id or "stream", "object": "chat.completion", "created": 0,
               "model": self.model, "usage": self.usage,
               "choices": [{"index": 0, "finish_reason": self.finish,
                            "message": {"role": "assistant", "content": "".join(self.parts)}}]}
        return Reply(finish=self.finish, model=self.model, usage=self.usage, raw=raw,
                     cost_usd=self.usage.get("cost") if self.usage else None)


class OpenAIChat(ChatWire):
    """Adapter: chat completions over httpx. `http_client`, an httpx.AsyncClient of the
    caller's, replaces the pool (and is closed with it)."""

    def __init__(self, model: str, base_url: str, *, api_key: str, max_tokens_param: str,
                 drop_temperature: bool = False, http_client: Any = None,
                 max_connections: int = 100,
                 default_headers: Mapping[str, str] | None = None) -> None:
        super().__init__(model, base_url, max_tokens_param=max_tokens_param,
                         drop_temperature=drop_temperature)
        url = base_url.rstrip("/") + "/chat/completions"
        try:   # parsed once here, not again for every request of a batch
            self.target: Any = httpx.URL(url)
        except Exception:
            self.target = url     # a bad URL is reported by the request
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                   "Accept": "application/json", "User-Agent": "recursa",
                   **(default_headers or {})}
        # Keep-alive connections up to `max_connections` (keep it at or above the run's
        # concurrency, 32 by default, so a batch reuses its connections); the pool's clients
        # send `headers`, a caller's client has its own: ours go with each request.
        self.pool = LoopPool(max_connections=max_connections, client=http_client,
                             tls=not base_url.lower().startswith("http://"), headers=headers)
        self._headers = headers if http_client is not None else {}

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        body, headers, query = _http_args(request)
        if self._headers:
            headers = {**self._headers, **headers}
        async with self.pool.lease() as http:
            r = await http.post(self.target, content=body, headers=headers or None,
                                params=query)
        raw = r.content
        data = _json_or_none(raw)
        if not 200 <= r.status_code < 300:
            raise self._status(r.status_code, r.headers, data, raw)
        if not isinstance(data, dict):
            raise ModelError(f"{self.where}: malformed response (not a JSON object): "
                             f"{raw[:200]!r}", retryable=True)
        if "choices" not in data and isinstance(data.get("error"), dict):
            # some gateways (OpenRouter) report an upstream failure in a 200 body
            code = data["error"].get("code")
            raise self._status(code if isinstance(code, int) else 502, r.headers, data, raw)
        return data

    async def stream(self, request: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        """Server-sent events, one JSON chunk per `data:` line, until `[DONE]` or the end of
        the body."""
        body, headers, query = _http_args(self.streamed(request))
        # no compressed event streams: some proxies buffer those
        headers = {**self._headers, **headers, "Accept": "text/event-stream",
                   "Accept-Encoding": "identity"}
        state = ChatStream(self.model)
        async with self.pool.lease() as http, http.stream(
                "POST", self.target, content=body, headers=headers, params=query) as r:
            if not 200 <= r.status_code < 300:
                raw = await r.aread()
                raise self._status(r.status_code, r.headers, _json_or_none(raw), raw)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue                        # comments, event names, blank separators
                data = line[5:].strip()
                if data == "[DONE]" or not data:
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError as e:
                    raise ModelError(f"{self.where}: malformed stream chunk: {data[:200]!r}",
                                     retryable=True) from e
                if not isinstance(chunk, dict):
                    continue
                if isinstance(chunk.get("error"), dict) and not chunk.get("choices"):
                    code = chunk["error"].get("code")
                    raise self._status(code if isinstance(code, int) else 502, {}, chunk,
                                       data.encode())
                piece = state.take(chunk)
                if piece:
                    yield piece
        yield state.reply()

    def error(self, exc: Exception) -> ModelError:
        if isinstance(exc, httpx.TimeoutException):
            return timed_out(self.where)
        if isinstance(exc, httpx.RequestError):
            return connection_error(self.where, exc)
        return ModelError(f"{self.where}: {type(exc).__name__}: {exc}", retryable=False)

    def _status(self, status: int, headers: Mapping[str, str], data: Any,
                raw: bytes) -> ModelError:
        err = data.get("error", data) if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            msg = str(err["message"])
        elif isinstance(err, str):
            msg = err
        else:
            msg = raw.decode("utf-8", errors="replace").strip() or "(empty body)"
        return status_error(self.where, status, msg, headers)

    async def aclose(self) -> None:
        await self.pool.aclose()


def _http_args(kw: dict[str, Any]) -> tuple[bytes, dict[str, str], Any]:
    """The JSON body, extra headers and query of one request from `request`'s kwargs."""
    body = dict(kw)
    body.pop("timeout")
    headers = body.pop("extra_headers", None) or {}
    query = body.pop("extra_query", None)
    body.update(body.pop("extra_body", None) or {})
    return json.dumps(body).encode(), headers, query


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None


class OpenAIClient(HostedClient):
    """`complete(messages, max_tokens=, temperature=, stop=, timeout=, extra_body=, ...)`.

    Retries (counted in `.stats`): 429 / 408 / 409 / 5xx / timeouts / connection errors /
    malformed bodies, up to `max_retries` times, exponential backoff with full jitter, honouring
    `Retry-After`. A reply without text is retried once, then raises ModelError("... returned no
    text"). Other 4xx raise ModelError at once. `latency_s` is the wall time of the whole call,
    retries included. Native tool calling: `tools=[...]` passes through, and a reply that only
    calls tools is returned with empty text (its calls are in `raw`).

    API key: `api_key=`, else OPENAI_API_KEY, but only for api.openai.com: an explicit
    `base_url` elsewhere gets "EMPTY" unless a key is passed, so the OpenAI key is not sent to
    whatever server the URL names. OPENAI_BASE_URL is not read; pass `base_url=`.
    """

    supports_tools = True      # the old spelling of capabilities.tools, kept for callers
    _client: Any = None        # an SDK client behind this one: none (it speaks HTTP itself)

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, provider: str = "openai",
                 max_tokens_param: str | None = None,
                 default_headers: dict[str, str] | None = None, http_client: Any = None,
                 max_connections: int = 100, free: bool = False,
                 **options: Unpack[ClientOptions]) -> None:
        url = base_url or OPENAI_BASE_URL
        name = name or f"{provider}:{model}"
        hosted_openai = base_url is None or "api.openai.com" in url
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") if hosted_openai else None
        if api_key is None:
            if hosted_openai:
                raise ValueError(f"{name}: no API key (set OPENAI_API_KEY or pass api_key=)")
            api_key = "EMPTY"  # self-hosted servers usually need none
        self.provider = provider
        # api.openai.com wants max_completion_tokens (reasoning models reject max_tokens);
        # most compatible servers only know max_tokens.
        self.max_tokens_param = max_tokens_param or (
            "max_completion_tokens" if hosted_openai else "max_tokens")
        adapter = OpenAIChat(model, url, api_key=api_key, max_tokens_param=self.max_tokens_param,
                             drop_temperature=hosted_openai and bool(_REASONING_MODEL.match(model)),
                             http_client=http_client, max_connections=max_connections,
                             default_headers=default_headers)
        super().__init__(adapter, name=name, model=model, base_url=url, tools=True,
                         structured="response_format",
                         reports_cost=provider == "openrouter",   # usage.cost
                         free=free, **options)


# ------------------------------------------------------------------ the providers' factories
def openrouter(model: str, *, name: str, api_key: str | None = None,
               **kw: Any) -> OpenAIClient:
    key = api_key or os.environ.get("OPENROUTER_API_KEY")
    if not key:
        raise ValueError(f"{name}: set OPENROUTER_API_KEY or pass api_key=")
    # ask for the charged cost in `usage.cost`: what keeps a cost limit without a price table
    kw["default_options"] = {"extra_body": {"usage": {"include": True}},
                             **(kw.get("default_options") or {})}
    kw["base_url"] = kw.get("base_url") or OPENROUTER_BASE_URL
    return OpenAIClient(model, api_key=key, name=name, provider="openrouter", **kw)


def vllm(model: str, *, name: str, base_url: str | None = None, api_key: str | None = None,
         **kw: Any) -> OpenAIClient:
    url = base_url or os.environ.get("VLLM_BASE_URL")
    if not url:
        raise ValueError(f"{name}: a vLLM server needs base_url= or VLLM_BASE_URL "
                         "(e.g. http://host:8000/v1)")
    key = api_key or os.environ.get("VLLM_API_KEY") or "EMPTY"
    return OpenAIClient(model, base_url=url, api_key=key, name=name, provider="vllm", **kw)


def ollama(model: str, *, name: str, base_url: str | None = None, **kw: Any) -> OpenAIClient:
    return _served_here("ollama", model, name=name, base_url=base_url, **kw)


def lmstudio(model: str, *, name: str, base_url: str | None = None, **kw: Any) -> OpenAIClient:
    return _served_here("lmstudio", model, name=name, base_url=base_url, **kw)


def _served_here(prefix: str, model: str, *, name: str, base_url: str | None,
                 api_key: str | None = None, **kw: Any) -> OpenAIClient:
    """A model an OpenAI-compatible server on one's own machine serves (Ollama, LM Studio):
    reached where its registry row says, with no key unless one is given, and free."""
    from .providers import builtin
    url = builtin(prefix).endpoint_url(base_url)
    assert url is not None            # these rows have a default URL
    return OpenAIClient(model, base_url=url, api_key=api_key or "EMPTY", name=name,
                        provider=prefix, free=True, **kw)
