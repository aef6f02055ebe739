"""Google's Gemini API via the official `google-genai` SDK (async, `client.aio`).

The SDK is imported in the constructor, so `import recursa.models` never needs it
(`pip install 'recursa[gemini]'`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from recursa.base.extras import MissingExtra
from recursa.base.images import gemini_parts, has_images
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
from .retry import (
    RETRYABLE_STATUSES,
    EmptyResponseError,
    HostedClientState,
    parse_retry_after,
    with_retries,
)
from .streaming import OnDelta, Pieces, StreamCut

log = logging.getLogger("recursa.models")

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


class GeminiClient(HostedClientState):
    """Same contract and retry policy as OpenAIClient (the SDK's own retries stay off).

    API key: `api_key=`, else GOOGLE_API_KEY, else GEMINI_API_KEY (the SDK's order). `base_url` points the SDK
    at another host (a proxy, a test server). Usage: input_tokens is the prompt including
    tokens served from Gemini's context cache (`cached_tokens`); output_tokens includes
    thinking tokens, which are billed as output.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, max_retries: int = 4, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 30.0, timeout: float = 600.0,
                 prices: Mapping[str, Any] | None = None, api_version: str | None = None,
                 default_options: dict[str, Any] | None = None, stream: bool = True) -> None:
        self.model = model
        self.stream = stream          # False: astream never streams
        self.name = name or f"gemini:{model}"
        try:
            from google import genai
            from google.genai import errors, types
        except ImportError as e:
            raise MissingExtra("gemini", self.name, module="google-genai") from e
        api_key = api_key or os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY")
        if not api_key:
            raise ValueError(f"{self.name}: no API key (set GEMINI_API_KEY or GOOGLE_API_KEY, "
                             "or pass api_key=)")
        self.base_url = base_url or "https://generativelanguage.googleapis.com"
        self._init_state(max_retries=max_retries, retry_base_delay=retry_base_delay,
                         retry_max_delay=retry_max_delay, timeout=timeout, prices=prices,
                         default_options=default_options)
        self._types = types
        self._errors = errors
        # attempts=1: no SDK retries, including the implicit 1-10 s sleep-and-retry its aiohttp
        # transport does on connection errors when no retry options are set
        http = types.HttpOptions(base_url=base_url, api_version=api_version,
                                 timeout=int(timeout * 1000),
                                 retry_options=types.HttpRetryOptions(attempts=1))
        # vertexai=False: never pick up GOOGLE_GENAI_USE_VERTEXAI and its ADC credentials
        self._client = genai.Client(api_key=api_key, vertexai=False, http_options=http)

    def __repr__(self) -> str:
        return f"GeminiClient({self.name!r}, base_url={self.base_url!r})"

    def _declare(self) -> Capabilities:
        return Capabilities(
            max_output_tokens=self.default_options.get("max_tokens"), streaming=self.stream,
            images=True, pricing=Pricing(model=self.model, overrides=self.prices),
            identity=model_identity(self.name, self.model, self.base_url, self.default_options))

    @property
    def _where(self) -> str:
        return f"model {self.model!r} at {self.base_url}"

    def _config(self, system: str | None, options: dict[str, Any]) -> Any:
        opts = {**self.default_options, **options}
        cfg: dict[str, Any] = {}
        timeout = opts.pop("timeout", None)
        if timeout:
            cfg["http_options"] = self._types.HttpOptions(timeout=int(float(timeout) * 1000))
        stop = opts.pop("stop", None)
        if stop:
            cfg["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        for key, field in _CONFIG_OPTIONS.items():
            value = opts.pop(key, None)
            if value is not None:
                cfg[field or key] = int(value) if key == "max_tokens" else value
        if system:
            cfg["system_instruction"] = system
        self._warn_unknown(opts)
        return self._types.GenerateContentConfig(**cfg)

    def _error(self, e: BaseException) -> ModelError:
        if isinstance(e, ModelError):
            return e
        if isinstance(e, self._errors.APIError):
            status = int(e.code or 0)
            retryable = status in RETRYABLE_STATUSES or status >= 500
            retry_after = parse_retry_after(getattr(e.response, "headers", None)) \
                if retryable else None
            return ModelError(f"{self._where}: HTTP {status}: {e.message or e.status}"[:600],
                              retryable=retryable, status=status or None,
                              retry_after=retry_after)
        # transport errors of whichever HTTP stack the SDK runs on (httpx or aiohttp)
        kind = type(e).__name__
        if isinstance(e, asyncio.TimeoutError | TimeoutError) or "Timeout" in kind:
            return ModelError(f"{self._where}: request timed out", retryable=True)
        if isinstance(e, OSError) or any(w in kind for w in ("Connect", "Disconnect",
                                                               "Protocol", "Network")):
            return ModelError(f"{self._where}: connection error ({kind}: {e})", retryable=True)
        return ModelError(f"{self._where}: {kind}: {e}", retryable=False)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        system, contents = gemini_contents(messages)
        config = self._config(system, options)
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, str]:
            try:
                # the SDK takes plain dicts at runtime; its stubs want ContentDict TypedDicts
                resp = await self._client.aio.models.generate_content(
                    model=self.model, contents=contents, config=config)  # type: ignore[arg-type]
            except Exception as e:
                raise self._error(e) from e
            cands = resp.candidates or []
            parts = (cands[0].content.parts if cands and cands[0].content else None) or []
            text = "".join(p.text for p in parts if p.text and not p.thought)
            if not text.strip():
                why = cands[0].finish_reason if cands else (
                    getattr(resp.prompt_feedback, "block_reason", None) or "no candidates")
                raise EmptyResponseError(f"{self._where} returned no text ({why})")
            return resp, text

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        return self._completion(resp, resp.usage_metadata, text, t0)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """`complete`, streamed (`generate_content_stream`): text (not thoughts) goes to
        `on_delta(piece, offset)` as it arrives; the last chunk's usage is the whole call's,
        so usage and cost are `complete`'s."""
        if not self.stream:
            return await self.complete(messages, **options)
        system, contents = gemini_contents(messages)
        total = float(options.get("timeout") or self.timeout)   # the SDK's bounds each read
        config = self._config(system, options)
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, Any, str]:
            pieces = Pieces(on_delta)
            last: Any = None
            usage_meta: Any = None
            finish = None
            try:
                async with asyncio.timeout(total):
                    # plain-dict contents, as in complete()
                    stream = await self._client.aio.models.generate_content_stream(
                        model=self.model, contents=contents,  # type: ignore[arg-type]
                        config=config)
                    async for chunk in stream:
                        last = chunk
                        usage_meta = chunk.usage_metadata or usage_meta
                        cands = chunk.candidates or []
                        parts = (cands[0].content.parts if cands and cands[0].content
                                 else None) or []
                        for p in parts:
                            if p.text and not p.thought:
                                pieces.add(p.text)
                        if cands and cands[0].finish_reason:
                            finish = cands[0].finish_reason
            except TimeoutError as e:
                raise ModelError(f"{self._where}: request timed out", retryable=True) from e
            except Exception as e:
                err = self._error(e)
                if pieces.chars and err.retryable:
                    raise StreamCut(self._where, pieces.chars, str(err)) from e
                raise err from e
            if finish is None:
                raise StreamCut(self._where, pieces.chars, "it ended with no finishReason")
            if not pieces.text.strip():
                raise EmptyResponseError(f"{self._where} returned no text ({finish})")
            return last, usage_meta, pieces.text

        resp, usage_meta, text = await with_retries(attempt, self.policy, self.stats,
                                                    what=self.name)
        return self._completion(resp, usage_meta, text, t0)

    def _completion(self, resp: Any, u: Any, text: str, t0: float) -> Completion:
        usage = Usage(
            input_tokens=(u.prompt_token_count or 0) if u else 0,
            output_tokens=((u.candidates_token_count or 0) + (u.thoughts_token_count or 0))
            if u else 0,
            cached_tokens=(u.cached_content_token_count or 0) if u else 0)
        cost = charge(self.capabilities.pricing, usage) if u else None
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=resp.model_version or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

    async def aclose(self) -> None:
        await self._client.aio.aclose()
