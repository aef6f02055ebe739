"""Google's Gemini API via the official `google-genai` SDK (async, `client.aio`): the
`gemini:` provider. The adapter writes the request (system instruction apart, the assistant
as `model`, images as `inline_data` parts, the options as a GenerateContentConfig) and reads
the reply (thought parts are not text); attempts, retries, usage and cost are the shared
flow's (hosted.py).

The SDK is imported in the constructor, so `import recursa.models` never needs it
(`pip install 'recursa[gemini]'`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator
from typing import Any, Unpack

from recursa.base.extras import MissingExtra
from recursa.base.images import has_images, image_of_part
from recursa.base.types import Message, ModelError

from .adapter import Reply, UsageFields, connection_error, describe, status_error, timed_out
from .hosted import DEFAULT_TIMEOUT, ClientOptions, HostedClient

# recursa option -> GenerateContentConfig field (None: same name)
_CONFIG_OPTIONS = {"max_tokens": "max_output_tokens", "temperature": None, "top_p": None,
                   "top_k": None, "seed": None, "presence_penalty": None,
                   "frequency_penalty": None, "response_mime_type": None,
                   "response_schema": None, "thinking_config": None, "safety_settings": None,
                   "candidate_count": None}


def gemini_contents(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """(system_instruction, contents): Gemini takes the system prompt apart and calls the
    assistant 'model'; consecutive same-role turns are merged, as for Anthropic."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else "".join(
            str(p.get("text", "")) for p in (content or []) if isinstance(p, dict))
        if m.get("role") == "system":
            system.append(text)
            continue
        role = "model" if m.get("role") == "assistant" else "user"
        if has_images([m]):   # image parts -> inline_data parts (see recursa.base.images)
            parts = gemini_parts(content)
            if contents and contents[-1]["role"] == role:
                contents[-1]["parts"] += parts
            else:
                contents.append({"role": role, "parts": parts})
        elif contents and contents[-1]["role"] == role and "text" in contents[-1]["parts"][0]:
            contents[-1]["parts"][0]["text"] += "\n\n" + text
        else:
            contents.append({"role": role, "parts": [{"text": text}]})
    return ("\n\n".join(system) or None), contents


def gemini_parts(content: Any) -> list[dict[str, Any]]:
    """OpenAI-style parts -> Gemini parts (`inline_data` with the raw bytes)."""
    if not isinstance(content, list):
        return [{"text": "" if content is None else str(content)}]
    parts: list[dict[str, Any]] = []
    for p in content:
        img = image_of_part(p)
        if img is not None:
            parts.append({"inline_data": {"mime_type": img.media_type, "data": img.data}})
        elif isinstance(p, dict) and str(p.get("text", "")):
            parts.append({"text": str(p.get("text", ""))})
    return parts or [{"text": ""}]


def _text(candidates: Any) -> str:
    """The first candidate's text, thought parts left out."""
    content = candidates[0].content if candidates else None
    return "".join(p.text for p in (content.parts if content else None) or []
                   if p.text and not p.thought)


def _finish(reason: Any) -> str | None:
    return None if reason is None else str(getattr(reason, "value", reason))


class GeminiGenerate:
    """Adapter: `generate_content` (and `generate_content_stream`) of a google-genai client.
    Usage: input_tokens is the prompt including tokens served from Gemini's context cache
    (`cached_tokens`); output_tokens includes thinking tokens, which are billed as output."""

    usage_fields = UsageFields(input=("prompt_token_count",),
                               output=("candidates_token_count", "thoughts_token_count"),
                               cached=("cached_content_token_count",))

    def __init__(self, client: Any, model: str, base_url: str) -> None:
        from google.genai import errors, types
        self.client = client
        self.model = model
        self.where = describe(model, base_url)
        self._types = types
        self._errors = errors

    def request(self, messages: list[Message], options: dict[str, Any],
                timeout: float) -> tuple[list[dict[str, Any]], Any]:
        """(contents, config)."""
        system, contents = gemini_contents(messages)
        types = self._types
        cfg: dict[str, Any] = {"http_options": types.HttpOptions(timeout=int(timeout * 1000))}
        stop = options.pop("stop", None)
        if stop:
            cfg["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        for key, field in _CONFIG_OPTIONS.items():
            value = options.pop(key, None)
            if value is not None:
                cfg[field or key] = int(value) if key == "max_tokens" else value
        if system:
            cfg["system_instruction"] = system
        return contents, types.GenerateContentConfig(**cfg)

    async def send(self, request: tuple[list[dict[str, Any]], Any]) -> Any:
        contents, config = request
        # the SDK takes plain dicts at runtime; its stubs want ContentDict TypedDicts
        return await self.client.aio.models.generate_content(
            model=self.model, contents=contents, config=config)

    async def stream(self, request: tuple[list[dict[str, Any]], Any]
                     ) -> AsyncGenerator[str | Reply, None]:
        """Text (not thoughts) as it comes; the last chunk carries the whole call's usage."""
        contents, config = request
        stream = await self.client.aio.models.generate_content_stream(
            model=self.model, contents=contents, config=config)
        last: Any = None
        usage: Any = None
        finish = None
        async for chunk in stream:
            last = chunk
            usage = chunk.usage_metadata or usage
            cands = chunk.candidates or []
            text = _text(cands)
            if text:
                yield text
            if cands and cands[0].finish_reason:
                finish = _finish(cands[0].finish_reason)
        yield Reply(finish=finish, model=last.model_version if last else None, usage=usage,
                    raw=last)

    def read(self, resp: Any) -> Reply:
        cands = resp.candidates or []
        finish = _finish(cands[0].finish_reason) if cands else (
            _finish(getattr(resp.prompt_feedback, "block_reason", None)) or "no candidates")
        return Reply(text=_text(cands), finish=finish, model=resp.model_version,
                     usage=resp.usage_metadata, raw=resp)

    def error(self, e: Exception) -> ModelError:
        if isinstance(e, self._errors.APIError):
            return status_error(self.where, int(e.code or 0) or None,
                                str(e.message or e.status), getattr(e.response, "headers", None))
        if isinstance(e, json.JSONDecodeError):   # a cut or garbled body: worth another try
            return ModelError(f"{self.where}: malformed response ({e})", retryable=True)
        # transport errors of whichever HTTP stack the SDK runs on (httpx or aiohttp)
        kind = type(e).__name__
        if isinstance(e, asyncio.TimeoutError | TimeoutError) or "Timeout" in kind:
            return timed_out(self.where)
        if isinstance(e, OSError) or any(w in kind for w in ("Connect", "Disconnect",
                                                               "Protocol", "Network")):
            return connection_error(self.where, e)
        return ModelError(f"{self.where}: {kind}: {e}", retryable=False)

    async def aclose(self) -> None:
        await self.client.aio.aclose()


class GeminiClient(HostedClient):
    """Same contract and retry policy as OpenAIClient (the SDK's own retries stay off).

    API key: `api_key=`, else GOOGLE_API_KEY, else GEMINI_API_KEY (the SDK's order). `base_url`
    points the SDK at another host (a proxy, a test server); `http_client`, an
    httpx.AsyncClient of the caller's, carries its requests (the SDK does not close it).
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, api_version: str | None = None,
                 http_client: Any = None, **options: Unpack[ClientOptions]) -> None:
        name = name or f"gemini:{model}"
        try:
            from google import genai
            from google.genai import types
        except ImportError as e:
            raise MissingExtra("gemini", name, module="google-genai") from e
        api_key = api_key or os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY")
        if not api_key:
            raise ValueError(f"{name}: no API key (set GEMINI_API_KEY or GOOGLE_API_KEY, "
                             "or pass api_key=)")
        # attempts=1: no SDK retries, including the implicit 1-10 s sleep-and-retry its aiohttp
        # transport does on connection errors when no retry options are set
        http = types.HttpOptions(base_url=base_url, api_version=api_version,
                                 timeout=int(options.get("timeout", DEFAULT_TIMEOUT) * 1000),
                                 retry_options=types.HttpRetryOptions(attempts=1),
                                 httpx_async_client=http_client)
        # vertexai=False: never pick up GOOGLE_GENAI_USE_VERTEXAI and its ADC credentials
        self._client = genai.Client(api_key=api_key, vertexai=False, http_options=http)
        url = base_url or "https://generativelanguage.googleapis.com"
        super().__init__(GeminiGenerate(self._client, model, url), name=name, model=model,
                         base_url=url, **options)
