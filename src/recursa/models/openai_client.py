"""Any OpenAI-compatible chat-completions endpoint: OpenAI, OpenRouter, vLLM, SGLang, Ollama,
llama.cpp server...

Requests go straight through httpx (a keep-alive pool per event loop, see httppool.py), not the
`openai` SDK: the SDK costs ~0.8 s to import (most of a CLI run's start-up) and ~2 ms of
event-loop CPU per request (which kept big batches from going out as one wave), and the wire
format is plain JSON. Proxies (HTTPS_PROXY, NO_PROXY...) are honoured as httpx does. Only
AzureOpenAIClient still sets an SDK client (`_client`); both paths give the same `Completion`
(with `raw` the reply as a dict) and the same ModelErrors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelError,
    Pricing,
    Usage,
    model_identity,
)
from recursa.models._http import httpx

from .httppool import LoopPool
from .logprobs import first_logprobs
from .pricing import charge
from .retry import (
    RETRYABLE_STATUSES,
    EmptyResponseError,
    HostedClientState,
    model_error_from_sdk,
    parse_retry_after,
    with_retries,
)
from .streaming import OnDelta, Pieces, StreamCut

log = logging.getLogger("recursa.models")

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"

# Options passed straight to chat.completions.create when given; anything else is ignored
# with a warning (sandboxed code may pass options meant for another client).
_PASSTHROUGH = ("top_p", "seed", "reasoning_effort", "response_format", "presence_penalty",
                "frequency_penalty", "logit_bias", "user", "service_tier", "verbosity",
                "prompt_cache_key", "extra_headers", "extra_query", "logprobs",
                "top_logprobs")

# OpenAI reasoning models reject any temperature other than the default.
_REASONING_MODEL = re.compile(r"^(o\d|gpt-5)")


class OpenAIClient(HostedClientState):
    """`complete(messages, max_tokens=, temperature=, stop=, timeout=, extra_body=, ...)`.

    Retries (ours, counted in `.stats`): 429 / 408 / 409 / 5xx / timeouts / connection errors /
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

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, provider: str = "openai", max_retries: int = 4,
                 retry_base_delay: float = 0.5, retry_max_delay: float = 30.0,
                 timeout: float = 600.0, prices: Mapping[str, Any] | None = None,
                 max_tokens_param: str | None = None, default_options: dict[str, Any] | None = None,
                 default_headers: dict[str, str] | None = None, http_client: Any = None,
                 stream: bool = True, max_connections: int = 100) -> None:
        self.model = model
        self.stream = stream          # False: astream never streams (a proxy that buffers SSE)
        self.provider = provider
        self.name = name or f"{provider}:{model}"
        self.base_url = base_url or OPENAI_BASE_URL
        hosted_openai = base_url is None or "api.openai.com" in self.base_url
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") if hosted_openai else None
        if api_key is None:
            if hosted_openai:
                raise ValueError(f"{self.name}: no API key (set OPENAI_API_KEY or pass api_key=)")
            api_key = "EMPTY"  # self-hosted servers usually need none, the SDK wants a string
        # api.openai.com wants max_completion_tokens (reasoning models reject max_tokens);
        # most compatible servers only know max_tokens.
        self.max_tokens_param = max_tokens_param or (
            "max_completion_tokens" if hosted_openai else "max_tokens")
        self._drop_temperature = hosted_openai and bool(_REASONING_MODEL.match(model))
        self._init_state(max_retries=max_retries, retry_base_delay=retry_base_delay,
                         retry_max_delay=retry_max_delay, timeout=timeout, prices=prices,
                         default_options=default_options)
        self._client: Any = None    # an SDK client: only AzureOpenAIClient sets one
        self._url = self.base_url.rstrip("/") + "/chat/completions"
        try:   # parsed once here, not again for every request of a batch
            self._target: Any = httpx.URL(self._url)
        except Exception:
            self._target = self._url     # a bad URL is reported by the request, as before
        # Keep-alive connections up to `max_connections` (keep it at or above the run's
        # concurrency, 32 by default, so a batch reuses its connections); `http_client`, an
        # httpx.AsyncClient of the caller's, replaces the pool.
        self._http = LoopPool(
            max_connections=max_connections, client=http_client,
            tls=not self.base_url.lower().startswith("http://"),
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                     "Accept": "application/json", "User-Agent": "recursa",
                     **(default_headers or {})})

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIClient({self.name!r}, base_url={self.base_url!r})"

    def _declare(self) -> Capabilities:
        return Capabilities(
            max_output_tokens=self.default_options.get("max_tokens"), streaming=self.stream,
            tools=True, images=True, structured="response_format",
            pricing=Pricing(model=self.model, overrides=self.prices,
                            reported=self.provider == "openrouter"),   # usage.cost
            identity=model_identity(self.name, self.model, self.base_url, self.default_options))

    @property
    def _where(self) -> str:
        return f"model {self.model!r} at {self.base_url}"

    def _request(self, messages: list[Message], options: dict[str, Any]) -> dict[str, Any]:
        opts = {**self.default_options, **options}
        kw: dict[str, Any] = {"model": self.model, "messages": messages,
                              "timeout": opts.pop("timeout", None) or self.timeout}
        max_tokens = opts.pop("max_tokens", None)
        if max_tokens is not None:
            kw[self.max_tokens_param] = int(max_tokens)
        temperature = opts.pop("temperature", None)
        if temperature is not None:
            if self._drop_temperature and temperature != 1:
                log.debug("%s: reasoning model takes no temperature; dropped %s",
                          self.name, temperature)
            else:
                kw["temperature"] = temperature
        stop = opts.pop("stop", None)
        if stop:
            kw["stop"] = stop
        tools = opts.pop("tools", None)
        if tools:   # native tool calling (recursa.core.tools runs the loop)
            kw["tools"] = tools
            if "tool_choice" in opts:
                kw["tool_choice"] = opts.pop("tool_choice")
        extra_body = opts.pop("extra_body", None)
        if extra_body:
            kw["extra_body"] = extra_body
        for key in _PASSTHROUGH:
            if key in opts:
                kw[key] = opts.pop(key)
        self._warn_unknown(opts)
        return kw

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        kw = self._request(messages, options)
        t0 = time.perf_counter()
        attempt = self._post if self._client is None else self._sdk_create
        wants_tools = "tools" in kw

        async def attempt_with_text() -> tuple[dict[str, Any], str]:
            resp = await attempt(kw)
            return resp, self._text(resp, tool_calls_ok=wants_tools)

        resp, text = await with_retries(attempt_with_text, self.policy, self.stats,
                                        what=self.name)
        usage, cost = self._usage_and_cost(resp)
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=resp.get("model") or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp,
                          first_logprobs=first_logprobs(resp) if kw.get("logprobs") else None)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """`complete`, streamed (`stream: true` with `stream_options.include_usage`): text goes
        to `on_delta(piece, offset)` as it arrives; the Completion, its usage and cost are
        those `complete` would return. A call with `tools=` does not stream."""
        if options.get("tools") or not self.stream:
            return await self.complete(messages, **options)
        kw = self._request(messages, options)
        kw["stream"] = True
        kw["stream_options"] = {"include_usage": True}
        total = float(kw["timeout"])     # bounds the whole reply, not each read
        t0 = time.perf_counter()

        async def attempt() -> tuple[dict[str, Any], str]:
            pieces = Pieces(on_delta)
            state: dict[str, Any] = {"model": None, "usage": None, "finish": None, "id": ""}
            try:
                if self._client is None:
                    await self._stream_http(kw, total, pieces, state)
                else:
                    await self._stream_sdk(kw, total, pieces, state)
            except ModelError as err:
                if pieces.chars and err.retryable and not isinstance(err, StreamCut):
                    raise StreamCut(self._where, pieces.chars, str(err)) from err
                raise
            if state["finish"] is None:
                raise StreamCut(self._where, pieces.chars, "it ended with no finish_reason")
            resp = {"id": state["id"] or "stream", "object": "chat.completion", "created": 0,
                    "model": state["model"] or self.model, "usage": state["usage"],
                    "choices": [{"index": 0, "finish_reason": state["finish"],
                                 "message": {"role": "assistant", "content": pieces.text}}]}
            if state["usage"] is None and "no-stream-usage" not in self._warned:
                self._warned.add("no-stream-usage")
                log.warning("%s: the stream carried no usage (the server ignores "
                            "stream_options.include_usage), so streamed calls count no tokens; "
                            "pass stream=False to this client", self.name)
            return resp, self._text(resp)

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        usage, cost = self._usage_and_cost(resp)
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=resp.get("model") or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

    def _http_args(self, kw: dict[str, Any]) -> tuple[bytes, dict[str, str], Any]:
        """The JSON body, extra headers and query of one request from `_request`'s kwargs."""
        body = dict(kw)
        body.pop("timeout")
        headers = body.pop("extra_headers", None) or {}
        query = body.pop("extra_query", None)
        body.update(body.pop("extra_body", None) or {})
        return json.dumps(body).encode(), headers, query

    def _transport_error(self, e: Exception) -> ModelError:
        if isinstance(e, TimeoutError | httpx.TimeoutException):
            return ModelError(f"{self._where}: request timed out", retryable=True)
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return ModelError(f"{self._where}: connection error ({why})", retryable=True)

    async def _stream_http(self, kw: dict[str, Any], total: float, pieces: Pieces,
                           state: dict[str, Any]) -> None:
        """One streamed request: server-sent events, one JSON chunk per `data:` line, until
        `[DONE]` or the end of the body. `total` bounds the whole exchange."""
        body, headers, query = self._http_args(kw)
        # no compressed event streams: some proxies buffer those
        headers = {**headers, "Accept": "text/event-stream", "Accept-Encoding": "identity"}

        def on_line(line: str) -> None:
            if not line.startswith("data:"):
                return                              # comments, event names, blank separators
            data = line[5:].strip()
            if data == "[DONE]" or not data:
                return
            try:
                chunk = json.loads(data)
            except ValueError as e:
                raise ModelError(f"{self._where}: malformed stream chunk: {data[:200]!r}",
                                 retryable=True) from e
            if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict) \
                    and not chunk.get("choices"):
                code = chunk["error"].get("code")
                raise self._status_error(code if isinstance(code, int) else 502, {}, chunk,
                                         data.encode())
            if isinstance(chunk, dict):
                self._take_chunk(chunk, pieces, state)

        try:
            async with asyncio.timeout(total), self._http.lease() as http, http.stream(
                    "POST", self._target, content=body, headers=headers, params=query) as r:
                if not 200 <= r.status_code < 300:
                    raw = await r.aread()
                    raise self._status_error(r.status_code, r.headers, _json_or_none(raw), raw)
                async for line in r.aiter_lines():
                    on_line(line)
        except (TimeoutError, httpx.RequestError) as e:
            raise self._transport_error(e) from e

    async def _stream_sdk(self, kw: dict[str, Any], total: float, pieces: Pieces,
                          state: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(total):
                stream = await self._client.chat.completions.create(**kw)
                try:
                    async for chunk in stream:
                        self._take_chunk(chunk.model_dump(), pieces, state)
                finally:
                    await stream.close()
        except TimeoutError as e:
            raise ModelError(f"{self._where}: request timed out", retryable=True) from e
        except ModelError:
            raise
        except Exception as e:
            import openai  # loaded already: the SDK client is one of its objects
            raise model_error_from_sdk(e, openai, where=self._where) from e

    @staticmethod
    def _take_chunk(chunk: dict[str, Any], pieces: Pieces, state: dict[str, Any]) -> None:
        state["model"] = chunk.get("model") or state["model"]
        state["id"] = chunk.get("id") or state["id"]
        if isinstance(chunk.get("usage"), dict):
            state["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or (choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                pieces.add(delta.get("content"))
            state["finish"] = choice.get("finish_reason") or state["finish"]

    async def _post(self, kw: dict[str, Any]) -> dict[str, Any]:
        body, headers, query = self._http_args(kw)
        try:
            async with asyncio.timeout(float(kw["timeout"])), \
                    self._http.lease() as http:          # the whole exchange
                r = await http.post(self._target, content=body, headers=headers or None,
                                    params=query)
        except (TimeoutError, httpx.RequestError) as e:
            raise self._transport_error(e) from e
        raw = r.content
        data = _json_or_none(raw)
        if not 200 <= r.status_code < 300:
            raise self._status_error(r.status_code, r.headers, data, raw)
        if not isinstance(data, dict):
            raise ModelError(f"{self._where}: malformed response (not a JSON object): "
                             f"{raw[:200]!r}", retryable=True)
        if "choices" not in data and isinstance(data.get("error"), dict):
            # Some gateways (OpenRouter) report an upstream failure in a 200 body.
            err = data["error"]
            code = err.get("code")
            raise self._status_error(code if isinstance(code, int) else 502, r.headers, data,
                                     raw)
        return data

    def _status_error(self, status: int, headers: Mapping[str, str], data: Any,
                      raw: bytes) -> ModelError:
        err = data.get("error", data) if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            msg = str(err["message"])
        elif isinstance(err, str):
            msg = err
        else:
            msg = raw.decode("utf-8", errors="replace").strip() or "(empty body)"
        retry_after = parse_retry_after(headers) if status in (429, 503) or status >= 500 \
            else None
        return ModelError(f"{self._where}: HTTP {status}: {msg[:500]}",
                          retryable=status in RETRYABLE_STATUSES or status >= 500,
                          status=status, retry_after=retry_after)

    async def _sdk_create(self, kw: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self._client.chat.completions.create(**kw)
        except Exception as e:
            import openai  # loaded already: the SDK client is one of its objects
            raise model_error_from_sdk(e, openai, where=self._where) from e
        if isinstance(resp, str | bytes):
            # Some servers answer 200 with a non-JSON body; the SDK then hands back the text.
            raise ModelError(f"{self._where}: malformed response (not JSON): {resp[:200]!r}",
                             retryable=True)
        return resp.model_dump()

    def _text(self, resp: dict[str, Any], *, tool_calls_ok: bool = False) -> str:
        choices = resp.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise EmptyResponseError(f"{self._where} returned no text (no choices)")
        choice = choices[0]
        raw_message = choice.get("message")
        message: dict[str, Any] = raw_message if isinstance(raw_message, dict) else {}
        content = message.get("content")
        if isinstance(content, list):   # content parts, as a few servers send
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        if tool_calls_ok and message.get("tool_calls"):
            return content or ""      # a reply that only calls tools has no text, rightly
        if not isinstance(content, str) or not content.strip():
            finish = choice.get("finish_reason")
            why = f"finish_reason={finish}"
            if finish == "length":
                why += ": max_tokens too small?"
            raise EmptyResponseError(f"{self._where} returned no text ({why})")
        return content

    def _usage_and_cost(self, resp: dict[str, Any]) -> tuple[Usage, float | None]:
        u = resp.get("usage")
        if not isinstance(u, dict):  # some servers send none: we cannot price what we cannot count
            return Usage(), None
        details = u.get("prompt_tokens_details")
        cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        usage = Usage(input_tokens=u.get("prompt_tokens") or 0,
                      output_tokens=u.get("completion_tokens") or 0, cached_tokens=cached)
        reported = u.get("cost")  # OpenRouter reports the charged cost
        if isinstance(reported, int | float) and not isinstance(reported, bool):
            return usage, float(reported)
        return usage, charge(self.capabilities.pricing, usage,
                             model=str(resp.get("model") or "") or None)

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._client is not None:
            await self._client.close()


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None
