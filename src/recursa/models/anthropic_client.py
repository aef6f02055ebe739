"""Anthropic's Messages API via the official `anthropic` SDK (async): the `anthropic:`
provider, and `bedrock:`'s wire (bedrock_client.py). The adapter writes the request (system
prompt apart, turns merged, images as base64 blocks, prompt-cache breakpoints) and reads the
reply; attempts, retries, usage and cost are the shared flow's (hosted.py).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncGenerator
from typing import Any, Unpack

import anthropic

from recursa.base.images import has_images, image_of_part
from recursa.base.types import Message, ModelError

from .adapter import Reply, UsageFields, describe, sdk_error
from .hosted import DEFAULT_TIMEOUT, ClientOptions, HostedClient

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


def anthropic_content(content: Any) -> Any:
    """OpenAI-style parts -> Anthropic content blocks (base64 `image` sources)."""
    if not isinstance(content, list):
        return content
    blocks: list[dict[str, Any]] = []
    for p in content:
        img = image_of_part(p)
        if img is not None:
            blocks.append({"type": "image", "source": {"type": "base64",
                                                       "media_type": img.media_type,
                                                       "data": img.b64()}})
        elif isinstance(p, dict):
            text = str(p.get("text", ""))
            if text:
                blocks.append({"type": "text", "text": text})
    return blocks


class AnthropicMessages:
    """Adapter: the Messages API through an `anthropic` SDK client (AsyncAnthropic, or
    AsyncAnthropicBedrock: the same `messages` API). Usage: input_tokens counts fresh +
    cache-read + cache-write tokens; cached_tokens the cache reads."""

    usage_fields = UsageFields(
        input=("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"),
        output=("output_tokens",), cached=("cache_read_input_tokens",),
        cache_write=("cache_creation_input_tokens",))

    def __init__(self, sdk: Any, model: str, base_url: str, *, prompt_cache: bool = True,
                 default_max_tokens: int = 8192) -> None:
        self.sdk = sdk
        self.model = model
        self.where = describe(model, base_url)
        self.prompt_cache = prompt_cache
        self.default_max_tokens = default_max_tokens

    def request(self, messages: list[Message], options: dict[str, Any],
                timeout: float) -> dict[str, Any]:
        system, turns = split_system(messages)
        system_arg: Any = system
        if options.pop("prompt_cache", self.prompt_cache):
            system_arg, turns = add_cache_breakpoints(system, turns)
        kw: dict[str, Any] = {
            "model": self.model, "messages": turns, "timeout": timeout,
            "max_tokens": int(options.pop("max_tokens", None) or self.default_max_tokens)}
        if system_arg:
            kw["system"] = system_arg
        stop = options.pop("stop", None)
        if stop:
            kw["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        extra_body = dict(options.pop("extra_body", None) or {})
        for key in ("temperature", *_PASSTHROUGH):
            value = options.pop(key, None)
            if value is not None:
                (kw if key in _SDK_PARAMS else extra_body)[key] = value
        if extra_body:
            kw["extra_body"] = extra_body
        return kw

    async def send(self, request: dict[str, Any]) -> Any:
        return await self.sdk.messages.create(**request)

    async def stream(self, request: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        """The SDK's `messages.stream`: its text as it comes, then the final message (usage,
        stop reason; no stop reason when the stream ended early)."""
        async with self.sdk.messages.stream(**request) as stream:
            async for piece in stream.text_stream:
                yield piece
            final = await stream.get_final_message()
        yield self.read(final)

    def read(self, resp: Any) -> Reply:
        text = "".join(getattr(b, "text", "") for b in (resp.content or [])
                       if getattr(b, "type", None) == "text")
        return Reply(text=text, finish=resp.stop_reason, model=resp.model, usage=resp.usage,
                     raw=resp)

    def error(self, exc: Exception) -> ModelError:
        return sdk_error(exc, anthropic, self.where)

    async def aclose(self) -> None:
        await self.sdk.close()


class AnthropicClient(HostedClient):
    """Same contract and retry policy as OpenAIClient. `max_tokens` defaults to
    `default_max_tokens` (the API requires one). `.cache_write_tokens` totals the prompt-cache
    writes. `prompt_cache` (default on) adds `cache_control` breakpoints (see
    add_cache_breakpoints; per call: `prompt_cache=False`). `sdk_client`: an SDK client to
    send through instead of one made here (BedrockClient's)."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, default_max_tokens: int = 8192,
                 http_client: Any = None, prompt_cache: bool = True, sdk_client: Any = None,
                 **options: Unpack[ClientOptions]) -> None:
        name = name or f"anthropic:{model}"
        url = base_url or "https://api.anthropic.com"
        if sdk_client is None:
            api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not api_key:
                if base_url is None:
                    raise ValueError(f"{name}: no API key (set ANTHROPIC_API_KEY or pass "
                                     "api_key=)")
                api_key = "EMPTY"
            if http_client is None:   # share one TLS context: see tls.py
                from .tls import shared_ssl_context
                http_client = anthropic.DefaultAsyncHttpxClient(verify=shared_ssl_context())
            sdk_client = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=url, max_retries=0,
                timeout=options.get("timeout", DEFAULT_TIMEOUT), http_client=http_client)
        self.default_max_tokens = default_max_tokens
        self._client = sdk_client
        adapter = AnthropicMessages(sdk_client, model, url, prompt_cache=prompt_cache,
                                    default_max_tokens=default_max_tokens)
        # with prompt caching on, input may be billed as cache writes (1.25x): the worst case
        super().__init__(adapter, name=name, model=model, base_url=url,
                         cache_writes=prompt_cache, **options)
