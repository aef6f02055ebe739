"""Any provider LiteLLM knows, via `litellm.acompletion` (`pip install 'recursa[litellm]'`): the
catch-all for providers recursa has no client of its own for.

    make_client("litellm:mistral/mistral-large-latest")          # LiteLLM reads MISTRAL_API_KEY
    make_client("litellm:openai/my-model", base_url="http://127.0.0.1:8000/v1")

LiteLLM is imported on the first call, not with recursa: it is large and slow to import (~5 s).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from typing import Any, Unpack

from recursa.base.extras import MissingExtra
from recursa.base.types import Message, ModelError

from .adapter import Reply, UsageFields, describe, sdk_error
from .hosted import ClientOptions, HostedClient

_PASSTHROUGH = ("top_p", "seed", "reasoning_effort", "response_format", "presence_penalty",
                "frequency_penalty", "logit_bias", "user", "tools", "tool_choice",
                "extra_headers", "extra_body", "thinking")


def _import_litellm(name: str) -> Any:
    # LiteLLM fetches its model price map from the internet at import unless told not to;
    # recursa runs offline-capable and uses the copy bundled with the package. The variable is
    # read at import only, so it is set for the import and the user's environment restored.
    ours = "LITELLM_LOCAL_MODEL_COST_MAP" not in os.environ
    if ours:
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    try:
        import litellm
    except ImportError as e:
        raise MissingExtra("litellm", name, module="litellm") from e
    finally:
        if ours:
            os.environ.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    litellm.suppress_debug_info = True
    return litellm


class LiteLLMCompletion:
    """Adapter: `litellm.acompletion` (LiteLLM's own retries off: num_retries=0,
    max_retries=0). LiteLLM maps every provider's errors onto the `openai` SDK's exception
    classes, so errors are classified as for OpenAI. A reply's `price` is the cost LiteLLM
    computes from its bundled price map (a 0.0 there counts as no price)."""

    usage_fields = UsageFields(input=("prompt_tokens",), output=("completion_tokens",),
                               cached=("prompt_tokens_details.cached_tokens",))

    def __init__(self, model: str, *, name: str, base_url: str | None = None,
                 api_key: str | None = None, http_client: Any = None) -> None:
        self.model = model
        self.name = name
        self.where = describe(model, base_url)
        self.base_url = base_url
        self._api_key = api_key
        self._http_client = http_client
        self._sdk: Any = None     # the AsyncOpenAI LiteLLM sends through, over `http_client`
        self._litellm: Any = None

    def _lib(self) -> Any:
        if self._litellm is None:
            self._litellm = _import_litellm(self.name)
        return self._litellm

    def request(self, messages: list[Message], options: dict[str, Any],
                timeout: float) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": self.model, "messages": messages, "timeout": timeout,
                              "num_retries": 0, "max_retries": 0}
        if self.base_url:
            kw["api_base"] = self.base_url
        if self._api_key:
            kw["api_key"] = self._api_key
        if self._http_client is not None:
            kw["client"] = self._openai_sdk()
        for key in ("max_tokens", "temperature", "stop", *_PASSTHROUGH):
            value = options.pop(key, None)
            if value is not None:
                kw[key] = value
        return kw

    def _openai_sdk(self) -> Any:
        """LiteLLM's public seam for a caller's HTTP client: an `openai.AsyncOpenAI` over it,
        for the OpenAI-compatible routes (`openai/...`)."""
        if self._sdk is None:
            import openai
            self._sdk = openai.AsyncOpenAI(api_key=self._api_key or "EMPTY",
                                           base_url=self.base_url, max_retries=0,
                                           http_client=self._http_client)
        return self._sdk

    async def send(self, request: dict[str, Any]) -> Any:
        return await self._lib().acompletion(**request)

    async def stream(self, request: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        """LiteLLM's stream (`include_usage`), rebuilt by its `stream_chunk_builder`, so usage
        and cost are `send`'s."""
        litellm = self._lib()
        stream = await litellm.acompletion(**request, stream=True,
                                           stream_options={"include_usage": True})
        chunks: list[Any] = []
        finish = None
        async for chunk in stream:
            chunks.append(chunk)
            for choice in getattr(chunk, "choices", None) or ():
                delta = getattr(choice, "delta", None)
                if delta is not None and delta.content:
                    yield delta.content
                finish = getattr(choice, "finish_reason", None) or finish
        whole = litellm.stream_chunk_builder(chunks, messages=request["messages"])
        yield self.read(whole)._replace(text=None, finish=finish)

    def read(self, resp: Any) -> Reply:
        choices = getattr(resp, "choices", None) or []
        message = choices[0].message if choices else None
        content = message.content if message else None
        return Reply(text=str(content) if content else "",
                     finish=choices[0].finish_reason if choices else None,
                     model=getattr(resp, "model", None), usage=getattr(resp, "usage", None),
                     price=lambda: self._price(resp), raw=resp)

    def _price(self, resp: Any) -> float | None:
        try:   # LiteLLM's own price map; raises for models it does not know
            cost = float(self._lib().completion_cost(completion_response=resp))
        except Exception:
            return None
        return cost or None   # 0.0 there may mean "no price listed": never count that as free

    def error(self, exc: Exception) -> ModelError:
        import openai
        return sdk_error(exc, openai, self.where)

    async def aclose(self) -> None:
        # LiteLLM keeps its own module-level HTTP clients; a caller's is the caller's
        if self._sdk is not None:
            await self._sdk.close()


class LiteLLMClient(HostedClient):
    """`model` is LiteLLM's `provider/model` string. Credentials are whatever LiteLLM reads for
    that provider (its own env variables), or `api_key=`; `base_url=` becomes `api_base`.
    `http_client`, an httpx.AsyncClient, carries the requests of the OpenAI-compatible routes
    (`openai/...`: LiteLLM takes an `AsyncOpenAI` client for those).

    Retries are recursa's. Usage includes cached prompt tokens (`prompt_tokens_details`).
    Cost: recursa's price table first (by the model part of the name), else the cost LiteLLM
    computes from its bundled price map, else None.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 name: str | None = None, http_client: Any = None,
                 **options: Unpack[ClientOptions]) -> None:
        if "/" not in model:
            raise ValueError(f"litellm:{model}: LiteLLM models are named PROVIDER/MODEL "
                             f"(e.g. 'litellm:openai/{model}')")
        from importlib.util import find_spec
        if find_spec("litellm") is None:
            raise ValueError(f"litellm:{model}: the LiteLLM client needs litellm: "
                             "pip install 'recursa[litellm]'")
        if http_client is not None and not model.startswith("openai/"):
            raise ValueError(f"litellm:{model}: http_client= carries only the OpenAI-compatible "
                             "routes (litellm:openai/MODEL)")
        name = name or f"litellm:{model}"
        # priced by recursa's table when it knows the model; LiteLLM's own map prices the
        # rest after the call (not declared `reported`: that map may not know the model)
        super().__init__(LiteLLMCompletion(model, name=name, base_url=base_url,
                                           api_key=api_key, http_client=http_client),
                         name=name, model=model, base_url=base_url, **options)
