"""Any provider LiteLLM knows, via `litellm.acompletion` (`pip install 'recursa[litellm]'`): the
catch-all for providers recursa has no client of its own for.

    make_client("litellm:mistral/mistral-large-latest")          # LiteLLM reads MISTRAL_API_KEY
    make_client("litellm:openai/my-model", base_url="http://127.0.0.1:8000/v1")

LiteLLM is imported on the first call, not with recursa: it is large and slow to import (~5 s).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from recursa.base.extras import MissingExtra
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

_PASSTHROUGH = ("top_p", "seed", "reasoning_effort", "response_format", "presence_penalty",
                "frequency_penalty", "logit_bias", "user", "tools", "tool_choice",
                "extra_headers", "extra_body", "thinking")


def _import_litellm(name: str) -> Any:
    # LiteLLM fetches its model price map from the internet at import unless told not to;
    # recursa runs offline-capable and uses the copy bundled with the package.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as e:
        raise MissingExtra("litellm", name, module="litellm") from e
    litellm.suppress_debug_info = True
    return litellm


class LiteLLMClient(HostedClientState):
    """`model` is LiteLLM's `provider/model` string. Credentials are whatever LiteLLM reads for
    that provider (its own env variables), or `api_key=`; `base_url=` becomes `api_base`.

    Retries are recursa's (LiteLLM's own are off: num_retries=0, max_retries=0). LiteLLM maps
    every provider's errors onto the `openai` SDK's exception classes, so errors are classified
    as for OpenAIClient. Usage includes cached prompt tokens (`prompt_tokens_details`).
    Cost: recursa's price table first (by the model part of the name), else the cost LiteLLM
    computes from its bundled price map, else None.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, max_retries: int = 4, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 30.0, timeout: float = 600.0,
                 prices: Mapping[str, Any] | None = None,
                 default_options: dict[str, Any] | None = None, stream: bool = True) -> None:
        if "/" not in model:
            raise ValueError(f"litellm:{model}: LiteLLM models are named PROVIDER/MODEL "
                             f"(e.g. 'litellm:openai/{model}')")
        from importlib.util import find_spec
        if find_spec("litellm") is None:
            raise ValueError(f"litellm:{model}: the LiteLLM client needs litellm: "
                             "pip install 'recursa[litellm]'")
        self.model = model
        self.stream = stream          # False: astream never streams
        self.name = name or f"litellm:{model}"
        self.base_url = base_url
        self._api_key = api_key
        self._init_state(max_retries=max_retries, retry_base_delay=retry_base_delay,
                         retry_max_delay=retry_max_delay, timeout=timeout, prices=prices,
                         default_options=default_options)
        self._litellm: Any = None

    def __repr__(self) -> str:  # never show the key
        return f"LiteLLMClient({self.name!r}, base_url={self.base_url!r})"

    def _declare(self) -> Capabilities:
        # priced by recursa's table when it knows the model; LiteLLM's own map prices the
        # rest after the call (not declared `reported`: that map may not know the model)
        return Capabilities(
            max_output_tokens=self.default_options.get("max_tokens"), streaming=self.stream,
            images=True, pricing=Pricing(model=self.model, overrides=self.prices),
            identity=model_identity(self.name, self.model, self.base_url, self.default_options))

    @property
    def _where(self) -> str:
        return f"model {self.model!r}" + (f" at {self.base_url}" if self.base_url else "")

    def _request(self, messages: list[Message], options: dict[str, Any]) -> dict[str, Any]:
        opts = {**self.default_options, **options}
        kw: dict[str, Any] = {"model": self.model, "messages": messages,
                              "timeout": opts.pop("timeout", None) or self.timeout,
                              "num_retries": 0, "max_retries": 0}
        if self.base_url:
            kw["api_base"] = self.base_url
        if self._api_key:
            kw["api_key"] = self._api_key
        for key in ("max_tokens", "temperature", "stop", *_PASSTHROUGH):
            value = opts.pop(key, None)
            if value is not None:
                kw[key] = value
        self._warn_unknown(opts)
        return kw

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        if self._litellm is None:
            self._litellm = _import_litellm(self.name)
        litellm = self._litellm
        kw = self._request(messages, options)
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, str]:
            import openai
            try:
                resp = await litellm.acompletion(**kw)
            except Exception as e:
                raise model_error_from_sdk(e, openai, where=self._where) from e
            choices = getattr(resp, "choices", None) or []
            content = choices[0].message.content if choices and choices[0].message else None
            if not content or not str(content).strip():
                why = choices[0].finish_reason if choices else "no choices"
                raise EmptyResponseError(f"{self._where} returned no text ({why})")
            return resp, str(content)

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        usage, cost = self._usage_and_cost(resp)
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=getattr(resp, "model", None) or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """`complete`, streamed (`stream=True` with `include_usage`); LiteLLM's
        `stream_chunk_builder` rebuilds the response, so usage and cost are `complete`'s.
        A call with `tools=` does not stream."""
        if options.get("tools") or not self.stream:
            return await self.complete(messages, **options)
        if self._litellm is None:
            self._litellm = _import_litellm(self.name)
        litellm = self._litellm
        kw = self._request(messages, options)
        kw["stream"] = True
        kw["stream_options"] = {"include_usage": True}
        total = float(kw["timeout"])
        t0 = time.perf_counter()

        async def attempt() -> tuple[Any, str]:
            import openai
            pieces = Pieces(on_delta)
            chunks: list[Any] = []
            finish = None
            try:
                async with asyncio.timeout(total):
                    stream = await litellm.acompletion(**kw)
                    async for chunk in stream:
                        chunks.append(chunk)
                        for choice in getattr(chunk, "choices", None) or ():
                            if getattr(choice, "delta", None) is not None:
                                pieces.add(choice.delta.content)
                            finish = getattr(choice, "finish_reason", None) or finish
            except TimeoutError as e:
                raise ModelError(f"{self._where}: request timed out", retryable=True) from e
            except Exception as e:
                err = model_error_from_sdk(e, openai, where=self._where)
                if pieces.chars and err.retryable:
                    raise StreamCut(self._where, pieces.chars, str(err)) from e
                raise err from e
            if finish is None:
                raise StreamCut(self._where, pieces.chars, "it ended with no finish_reason")
            if not pieces.text.strip():
                raise EmptyResponseError(f"{self._where} returned no text ({finish})")
            return litellm.stream_chunk_builder(chunks, messages=messages), pieces.text

        resp, text = await with_retries(attempt, self.policy, self.stats, what=self.name)
        usage, cost = self._usage_and_cost(resp)
        return Completion(text=text, usage=usage, cost_usd=cost,
                          model=getattr(resp, "model", None) or self.model,
                          latency_s=time.perf_counter() - t0, raw=resp)

    def _usage_and_cost(self, resp: Any) -> tuple[Usage, float | None]:
        u = getattr(resp, "usage", None)
        if u is None:
            return Usage(), None
        details = getattr(u, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
        usage = Usage(input_tokens=u.prompt_tokens or 0, output_tokens=u.completion_tokens or 0,
                      cached_tokens=cached)
        cost = charge(self.capabilities.pricing, usage)
        if cost is None:
            try:   # LiteLLM's own price map; raises for models it does not know
                cost = float(self._litellm.completion_cost(completion_response=resp))
            except Exception:
                cost = None
            if not cost:   # 0.0 there may mean "no price listed": never count that as free
                cost = None
        return usage, cost

    async def aclose(self) -> None:
        return None   # LiteLLM keeps its own module-level HTTP clients
