"""Any OpenAI-compatible chat-completions endpoint: OpenAI, OpenRouter, vLLM, SGLang, Ollama,
llama.cpp server... via the official `openai` SDK (async)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import openai

from ..types import Completion, Message, ModelError, Usage
from .pricing import cost_usd, estimate_usd
from .retry import EmptyResponseError, RetryPolicy, RetryStats, model_error_from_sdk, with_retries
from .streaming import OnDelta, Pieces, StreamCut

log = logging.getLogger("recursa.models")

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"

# Options passed straight to chat.completions.create when given; anything else is ignored
# with a warning (sandboxed code may pass options meant for another client).
_PASSTHROUGH = ("top_p", "seed", "reasoning_effort", "response_format", "presence_penalty",
                "frequency_penalty", "logit_bias", "user", "service_tier", "verbosity",
                "prompt_cache_key", "extra_headers", "extra_query")

# OpenAI reasoning models reject any temperature other than the default.
_REASONING_MODEL = re.compile(r"^(o\d|gpt-5)")


class OpenAIClient:
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

    supports_tools = True

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, provider: str = "openai", max_retries: int = 4,
                 retry_base_delay: float = 0.5, retry_max_delay: float = 30.0,
                 timeout: float = 600.0, prices: Mapping[str, Any] | None = None,
                 max_tokens_param: str | None = None, default_options: dict[str, Any] | None = None,
                 default_headers: dict[str, str] | None = None, http_client: Any = None,
                 stream: bool = True) -> None:
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
        self.policy = RetryPolicy(max_retries=max_retries, base_delay=retry_base_delay,
                                  max_delay=retry_max_delay)
        self.stats = RetryStats()
        self.timeout = timeout
        self.prices = prices
        self.default_options = dict(default_options or {})
        self._warned: set[str] = set()
        if http_client is None:   # share one TLS context: see tls.py
            from .tls import shared_ssl_context
            http_client = openai.DefaultAsyncHttpxClient(verify=shared_ssl_context())
        self._client = openai.AsyncOpenAI(api_key=api_key, base_url=self.base_url,
                                          max_retries=0, timeout=timeout,
                                          default_headers=default_headers,
                                          http_client=http_client)

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIClient({self.name!r}, base_url={self.base_url!r})"

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
        if tools:   # native tool calling (recursa.tools runs the loop)
            kw["tools"] = tools
            if "tool_choice" in opts:
                kw["tool_choice"] = opts.pop("tool_choice")
        extra_body = opts.pop("extra_body", None)
        if extra_body:
            kw["extra_body"] = extra_body
        for key in _PASSTHROUGH:
            if key in opts:
                kw[key] = opts.pop(key)
        for key in opts:
            if key not in self._warned:
                self._warned.add(key)
                log.warning("%s: ignoring unknown option %r", self.name, key)
        return kw

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        kw = self._request(messages, options)
        t0 = time.perf_counter()

        async def attempt() -> Any:
            try:
                return await self._client.chat.completions.create(**kw)
            except Exception as e:
                raise model_error_from_sdk(e, openai, where=self._where) from e

        wants_tools = "tools" in kw

        async def attempt_with_text() -> tuple[Any, str]:
            resp = await attempt()
            return resp, self._text(resp, tool_calls_ok=wants_tools)

        resp, text = await with_retries(attempt_with_text, self.policy, self.stats,
                                        what=self.name)
        usage, cost = self._usage_and_cost(resp)
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=getattr(resp, "model", None) or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

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
        # httpx's timeout bounds each read of a stream, not the whole reply: bound it here
        total = float(kw["timeout"])
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, str]:
            pieces = Pieces(on_delta)
            state: dict[str, Any] = {"model": None, "usage": None, "finish": None, "id": ""}
            try:
                async with asyncio.timeout(total):
                    stream = await self._client.chat.completions.create(**kw)
                    try:
                        async for chunk in stream:
                            self._take_chunk(chunk, pieces, state)
                    finally:
                        await stream.close()
            except TimeoutError as e:
                raise ModelError(f"{self._where}: request timed out", retryable=True) from e
            except Exception as e:
                err = model_error_from_sdk(e, openai, where=self._where)
                if pieces.chars and err.retryable:
                    raise StreamCut(self._where, pieces.chars, str(err)) from e
                raise err from e
            if state["finish"] is None:
                raise StreamCut(self._where, pieces.chars, "it ended with no finish_reason")
            resp = self._assemble(pieces.text, state)
            if state["usage"] is None and "no-stream-usage" not in self._warned:
                self._warned.add("no-stream-usage")
                log.warning("%s: the stream carried no usage (the server ignores "
                            "stream_options.include_usage), so streamed calls count no tokens; "
                            "pass stream=False to this client", self.name)
            return resp, self._text(resp)

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        usage, cost = self._usage_and_cost(resp)
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=getattr(resp, "model", None) or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

    @staticmethod
    def _take_chunk(chunk: Any, pieces: Pieces, state: dict[str, Any]) -> None:
        state["model"] = getattr(chunk, "model", None) or state["model"]
        state["id"] = getattr(chunk, "id", None) or state["id"]
        if getattr(chunk, "usage", None) is not None:
            state["usage"] = chunk.usage
        for choice in getattr(chunk, "choices", None) or ():
            if choice.index != 0:
                continue
            if choice.delta is not None:
                pieces.add(choice.delta.content)
            state["finish"] = choice.finish_reason or state["finish"]

    def _assemble(self, text: str, state: dict[str, Any]) -> Any:
        """A ChatCompletion built from a stream's chunks (what `complete` would have got)."""
        data = {"id": state["id"] or "stream", "object": "chat.completion", "created": 0,
                "model": state["model"] or self.model,
                "choices": [{"index": 0, "finish_reason": state["finish"],
                             "message": {"role": "assistant", "content": text}}]}
        try:
            resp: Any = openai.types.chat.ChatCompletion.model_validate(data)
        except ValueError:       # a finish_reason the SDK's schema does not know
            message = SimpleNamespace(content=text, tool_calls=None)
            resp = SimpleNamespace(model=data["model"], choices=[SimpleNamespace(
                message=message, finish_reason=state["finish"])])
        resp.usage = state["usage"]
        return resp

    def _text(self, resp: Any, *, tool_calls_ok: bool = False) -> str:
        if not isinstance(resp, openai.BaseModel) and isinstance(resp, str | bytes):
            # Some servers answer 200 with a non-JSON body; the SDK then hands back the text.
            raise ModelError(f"{self._where}: malformed response (not JSON): {resp[:200]!r}",
                             retryable=True)
        choices = getattr(resp, "choices", None)
        if not choices:
            raise EmptyResponseError(f"{self._where} returned no text (no choices)")
        choice = choices[0]
        content = getattr(choice.message, "content", None) if choice.message else None
        if tool_calls_ok and choice.message and getattr(choice.message, "tool_calls", None):
            return content or ""      # a reply that only calls tools has no text, rightly
        if not content or not content.strip():
            why = f"finish_reason={choice.finish_reason}"
            if choice.finish_reason == "length":
                why += ": max_tokens too small?"
            raise EmptyResponseError(f"{self._where} returned no text ({why})")
        return content

    def _usage_and_cost(self, resp: Any) -> tuple[Usage, float | None]:
        u = getattr(resp, "usage", None)
        if u is None:  # some servers send none: we cannot price what we cannot count
            return Usage(), None
        details = getattr(u, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
        usage = Usage(input_tokens=u.prompt_tokens or 0, output_tokens=u.completion_tokens or 0,
                      cached_tokens=cached)
        reported = (u.model_extra or {}).get("cost")  # OpenRouter reports the charged cost
        if isinstance(reported, int | float):
            return usage, float(reported)
        cost = cost_usd(self.model, usage, overrides=self.prices)
        if cost is None and getattr(resp, "model", None):
            cost = cost_usd(resp.model, usage, overrides=self.prices)
        return usage, cost

    def estimate_cost(self, input_tokens: int, output_tokens: int) -> float | None:
        """Worst-case USD of a call, for the budget's reservation (prices given to this client
        included); None when the model has no known price."""
        return estimate_usd(self.model, input_tokens, output_tokens, overrides=self.prices)

    async def aclose(self) -> None:
        await self._client.close()
