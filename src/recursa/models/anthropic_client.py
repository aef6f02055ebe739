"""Anthropic's Messages API via the official `anthropic` SDK (async)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import anthropic

from recursa.base.images import anthropic_content, has_images
from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelError,
    Pricing,
    Usage,
    model_identity,
)

from .pricing import charge
from .retry import EmptyResponseError, HostedClientState, model_error_from_sdk, with_retries
from .streaming import OnDelta, Pieces, StreamCut

log = logging.getLogger("recursa.models")

_PASSTHROUGH = ("top_p", "top_k", "metadata", "thinking", "service_tier", "extra_headers",
                "extra_query")
# Recent SDKs dropped some sampling parameters from messages.create's signature; those still
# reach the API through extra_body.
_SDK_PARAMS = frozenset(inspect.signature(anthropic.resources.messages.AsyncMessages.create)
                        .parameters)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def split_system(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """Anthropic takes the system prompt apart from the turns, and wants user/assistant turns
    to alternate: system messages are joined into `system`, consecutive same-role turns merged."""
    system_parts: list[str] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role", "user")
        text = _text_of(m.get("content"))
        if role == "system":
            system_parts.append(text)
            continue
        role = "assistant" if role == "assistant" else "user"
        content: Any = text
        if has_images([m]):   # image parts -> content blocks (see recursa.base.images)
            content = anthropic_content(m["content"])
        if turns and turns[-1]["role"] == role:
            prev = turns[-1]["content"]
            if isinstance(prev, str) and isinstance(content, str):
                turns[-1]["content"] = prev + "\n\n" + content
            else:
                blocks = lambda c: [{"type": "text", "text": c}] if isinstance(c, str) else c  # noqa: E731
                turns[-1]["content"] = blocks(prev) + blocks(content)
        else:
            turns.append({"role": role, "content": content})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": "(continue)"})
    return ("\n\n".join(system_parts) or None), turns


_EPHEMERAL = {"type": "ephemeral"}


def add_cache_breakpoints(system: str | None, turns: list[dict[str, Any]]
                          ) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Mark the prefixes worth caching with `cache_control` (Anthropic allows 4 per request).

    The system prompt is the same on every call of a run, so it always gets one. A conversation
    (the root's history: it has an assistant turn) grows by appending, so the prefix ending at
    its last user turn is what the next call starts with: that turn gets one (written now, read
    next time), and so does the user turn before it (read now, whatever the server's lookback).
    A one-shot call (a sub-call's single user turn) gets none: writing costs 1.25x input and
    nothing would read it. Prefixes under the model's minimum (1024-4096 tokens) are not
    cached by the API and cost nothing extra.
    """
    sys_blocks = ([{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
                  if system else None)
    out = [dict(t) for t in turns]
    if any(t["role"] == "assistant" for t in out):
        users = [i for i, t in enumerate(out) if t["role"] == "user"]
        for i in users[-2:]:
            if not out[i]["content"]:    # the API rejects cache_control on an empty block
                continue
            if isinstance(out[i]["content"], list):   # blocks (images): mark the last one
                out[i]["content"] = [*out[i]["content"][:-1],
                                     {**out[i]["content"][-1], "cache_control": _EPHEMERAL}]
                continue
            out[i]["content"] = [{"type": "text", "text": out[i]["content"],
                                  "cache_control": _EPHEMERAL}]
    return sys_blocks, out


class AnthropicClient(HostedClientState):
    """Same contract and retry policy as OpenAIClient. `max_tokens` defaults to
    `default_max_tokens` (the API requires one). Usage: input_tokens counts fresh + cache-read +
    cache-write tokens; cached_tokens the cache reads (`.cache_write_tokens` totals the writes).
    `prompt_cache` (default on) adds `cache_control` breakpoints: see add_cache_breakpoints."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, max_retries: int = 4, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 30.0, timeout: float = 600.0,
                 default_max_tokens: int = 8192, prices: Mapping[str, Any] | None = None,
                 default_options: dict[str, Any] | None = None, http_client: Any = None,
                 prompt_cache: bool = True, stream: bool = True) -> None:
        self.model = model
        self.stream = stream          # False: astream never streams (a proxy that buffers SSE)
        self.price_model = model      # the name prices are looked up by (Bedrock ids differ)
        self.prompt_cache = prompt_cache
        self.cache_write_tokens = 0
        self.name = name or f"anthropic:{model}"
        api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            if base_url is None:
                raise ValueError(f"{self.name}: no API key (set ANTHROPIC_API_KEY or pass api_key=)")
            api_key = "EMPTY"
        self.base_url = base_url or "https://api.anthropic.com"
        self._init_state(max_retries=max_retries, retry_base_delay=retry_base_delay,
                         retry_max_delay=retry_max_delay, timeout=timeout, prices=prices,
                         default_options=default_options)
        self.default_max_tokens = default_max_tokens
        if http_client is None:   # share one TLS context: see tls.py
            from .tls import shared_ssl_context
            http_client = anthropic.DefaultAsyncHttpxClient(verify=shared_ssl_context())
        # BedrockClient swaps in AsyncAnthropicBedrock: same `messages` API, not a subclass.
        self._client: anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock = (
            anthropic.AsyncAnthropic(api_key=api_key, base_url=self.base_url, max_retries=0,
                                     timeout=timeout, http_client=http_client))

    def __repr__(self) -> str:
        return f"AnthropicClient({self.name!r}, base_url={self.base_url!r})"

    _counters = frozenset({"cache_write_tokens"})

    def _declare(self) -> Capabilities:
        # with prompt caching on, input may be billed as cache writes (1.25x): the worst case
        return Capabilities(
            max_output_tokens=self.default_options.get("max_tokens"), streaming=self.stream,
            images=True, pricing=Pricing(model=self.price_model, overrides=self.prices,
                                         cache_writes=self.prompt_cache),
            identity=model_identity(self.name, self.model, self.base_url, self.default_options))

    @property
    def _where(self) -> str:
        return f"model {self.model!r} at {self.base_url}"

    def _request(self, messages: list[Message], options: dict[str, Any]) -> dict[str, Any]:
        opts = {**self.default_options, **options}
        system, turns = split_system(messages)
        cache = opts.pop("prompt_cache", self.prompt_cache)
        system_arg: Any = system
        if cache:
            system_arg, turns = add_cache_breakpoints(system, turns)
        kw: dict[str, Any] = {
            "model": self.model, "messages": turns,
            "max_tokens": int(opts.pop("max_tokens", None) or self.default_max_tokens),
            "timeout": opts.pop("timeout", None) or self.timeout,
        }
        if system_arg:
            kw["system"] = system_arg
        stop = opts.pop("stop", None)
        if stop:
            kw["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        extra_body = dict(opts.pop("extra_body", None) or {})
        for key in ("temperature", *_PASSTHROUGH):
            if opts.get(key) is not None:
                if key in _SDK_PARAMS:
                    kw[key] = opts.pop(key)
                else:
                    extra_body[key] = opts.pop(key)
            else:
                opts.pop(key, None)
        if extra_body:
            kw["extra_body"] = extra_body
        self._warn_unknown(opts)
        return kw

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        kw = self._request(messages, options)
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, str]:
            try:
                resp = await self._client.messages.create(**kw)
            except Exception as e:
                raise model_error_from_sdk(e, anthropic, where=self._where) from e
            return resp, self._text_of(resp)

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        return self._completion(resp, text, t0)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """`complete`, streamed through the SDK's `messages.stream` helper: text goes to
        `on_delta(piece, offset)` as it arrives; the final message (usage, stop reason) is the
        one `complete` would get, so usage and cost are the same."""
        if not self.stream:
            return await self.complete(messages, **options)
        kw = self._request(messages, options)
        total = float(kw["timeout"])   # the SDK's timeout bounds each read, not the stream
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, str]:
            pieces = Pieces(on_delta)
            try:
                async with asyncio.timeout(total), self._client.messages.stream(**kw) as stream:
                    async for piece in stream.text_stream:
                        pieces.add(piece)
                    resp = await stream.get_final_message()
            except TimeoutError as e:
                raise ModelError(f"{self._where}: request timed out", retryable=True) from e
            except Exception as e:
                err = model_error_from_sdk(e, anthropic, where=self._where)
                if pieces.chars and err.retryable:
                    raise StreamCut(self._where, pieces.chars, str(err)) from e
                raise err from e
            if resp.stop_reason is None:   # no message_delta: the stream ended early
                raise StreamCut(self._where, pieces.chars, "it ended with no stop_reason")
            return resp, self._text_of(resp)

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        return self._completion(resp, text, t0)

    def _text_of(self, resp: Any) -> str:
        """The reply's text blocks joined; an empty reply is a (retryable once) error."""
        text = "".join(getattr(b, "text", "") for b in (resp.content or [])
                       if getattr(b, "type", None) == "text")
        if not text.strip():
            raise EmptyResponseError(
                f"{self._where} returned no text (stop_reason={resp.stop_reason})")
        return text

    def _completion(self, resp: Any, text: str, t0: float) -> Completion:
        u = resp.usage
        read = u.cache_read_input_tokens or 0
        write = u.cache_creation_input_tokens or 0
        usage = Usage(input_tokens=(u.input_tokens or 0) + read + write,
                      output_tokens=u.output_tokens or 0, cached_tokens=read)
        self.cache_write_tokens += write
        cost = charge(self.capabilities.pricing, usage, cache_write_tokens=write)
        return Completion(text=text, usage=usage, cost_usd=cost, model=resp.model or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

    async def aclose(self) -> None:
        await self._client.close()
