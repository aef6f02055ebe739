"""Azure OpenAI via the `openai` SDK's AsyncAzureOpenAI: the chat-completions dialect
(openai_client.ChatWire) with Azure's URLs
(/openai/deployments/{deployment}/chat/completions?api-version=...) and `api-key` auth.

    make_client("azure:my-gpt-4o-deployment")   # AZURE_OPENAI_ENDPOINT, AZURE_OPENAI_API_KEY
    make_client("azure:my-dep", azure_endpoint="https://res.openai.azure.com",
                api_version="2024-10-21", api_key=..., price_model="gpt-4o")
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Unpack

from recursa.base.types import ModelError

from .adapter import Reply, sdk_error
from .hosted import DEFAULT_TIMEOUT, ClientOptions, HostedClient
from .openai_client import ChatStream, ChatWire
from .pricing import price_for

DEFAULT_API_VERSION = "2024-10-21"   # the GA version current when this was written


class AzureChat(ChatWire):
    """Adapter: chat completions through an `openai.AsyncAzureOpenAI` (it writes Azure's URLs
    and auth, an Entra token provider included)."""

    def __init__(self, sdk: Any, model: str, base_url: str, *, max_tokens_param: str) -> None:
        super().__init__(model, base_url, max_tokens_param=max_tokens_param)
        self.sdk = sdk

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        resp = await self.sdk.chat.completions.create(**request)
        if isinstance(resp, str | bytes):
            # some servers answer 200 with a non-JSON body; the SDK then hands back the text
            raise ModelError(f"{self.where}: malformed response (not JSON): {resp[:200]!r}",
                             retryable=True)
        result: dict[str, Any] = resp.model_dump()
        return result

    async def stream(self, request: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        state = ChatStream(self.model)
        stream = await self.sdk.chat.completions.create(**self.streamed(request))
        try:
            async for chunk in stream:
                piece = state.take(chunk.model_dump())
                if piece:
                    yield piece
        finally:
            await stream.close()
        yield state.reply()

    def error(self, exc: Exception) -> ModelError:
        import openai  # loaded already: the SDK client is one of its objects
        return sdk_error(exc, openai, self.where)

    async def aclose(self) -> None:
        await self.sdk.close()


class AzureOpenAIClient(HostedClient):
    """`model` is the deployment name (spec `azure:DEPLOYMENT`). Endpoint: `azure_endpoint=`
    (or `base_url=`), else AZURE_OPENAI_ENDPOINT. API version: `api_version=`, else
    AZURE_OPENAI_API_VERSION / OPENAI_API_VERSION, else DEFAULT_API_VERSION. Auth: `api_key=`,
    else AZURE_OPENAI_API_KEY, else a Microsoft Entra token (`azure_ad_token=` /
    `azure_ad_token_provider=` / AZURE_OPENAI_AD_TOKEN). Never OPENAI_API_KEY.

    Prices: Azure answers with the underlying model's name (e.g. gpt-4o-mini-2024-07-18), which
    the price table knows; `price_model=` names it when the deployment's replies do not.
    Retries, usage (cached prompt tokens included), tool calls and errors are OpenAIClient's.
    `max_connections` is accepted and unused: the SDK keeps its own pool.
    """

    supports_tools = True

    def __init__(self, deployment: str, *, azure_endpoint: str | None = None,
                 base_url: str | None = None, api_key: str | None = None,
                 api_version: str | None = None, azure_ad_token: str | None = None,
                 azure_ad_token_provider: Any = None, price_model: str | None = None,
                 name: str | None = None, max_tokens_param: str | None = None,
                 default_headers: dict[str, str] | None = None, http_client: Any = None,
                 max_connections: int = 100, **options: Unpack[ClientOptions]) -> None:
        name = name or f"azure:{deployment}"
        endpoint = azure_endpoint or base_url or os.environ.get("AZURE_OPENAI_ENDPOINT")
        if not endpoint:
            raise ValueError(f"{name}: no Azure endpoint (set AZURE_OPENAI_ENDPOINT, e.g. "
                             "https://RESOURCE.openai.azure.com, or pass azure_endpoint=)")
        endpoint = endpoint.rstrip("/")
        if endpoint.endswith("/openai"):      # accept the SDK's base_url form too
            endpoint = endpoint[: -len("/openai")]
        api_key = api_key or os.environ.get("AZURE_OPENAI_API_KEY")
        azure_ad_token = azure_ad_token or os.environ.get("AZURE_OPENAI_AD_TOKEN")
        if not (api_key or azure_ad_token or azure_ad_token_provider):
            raise ValueError(f"{name}: no credentials (set AZURE_OPENAI_API_KEY, or "
                             "AZURE_OPENAI_AD_TOKEN, or pass api_key= / azure_ad_token= / "
                             "azure_ad_token_provider=)")
        self.api_version = (api_version or os.environ.get("AZURE_OPENAI_API_VERSION")
                            or os.environ.get("OPENAI_API_VERSION") or DEFAULT_API_VERSION)
        common: dict[str, Any] = dict(options)
        prices: Mapping[str, Any] | None = common.pop("prices", None)
        if price_model:
            p = price_for(price_model, prices)
            if p is None:
                raise ValueError(f"{name}: price_model={price_model!r} has no known price "
                                 "(pass prices= or register_price())")
            prices = {**(prices or {}), deployment: p}
        import openai  # the SDK is a core dependency; imported here to keep module import light

        if http_client is None:   # share one TLS context: see tls.py
            from .tls import shared_ssl_context
            http_client = openai.DefaultAsyncHttpxClient(verify=shared_ssl_context())
        self.azure_endpoint = endpoint
        self.max_tokens_param = max_tokens_param or "max_completion_tokens"  # since 2024-09-01
        self._client = openai.AsyncAzureOpenAI(
            azure_endpoint=endpoint, api_version=self.api_version, api_key=api_key,
            azure_ad_token=None if api_key else azure_ad_token,
            azure_ad_token_provider=None if api_key else azure_ad_token_provider,
            max_retries=0, timeout=common.get("timeout", DEFAULT_TIMEOUT),
            default_headers=default_headers, http_client=http_client)
        url = endpoint + "/openai"
        super().__init__(AzureChat(self._client, deployment, url,
                                   max_tokens_param=self.max_tokens_param),
                         name=name, model=deployment, base_url=url, prices=prices, tools=True,
                         structured="response_format", **common)
