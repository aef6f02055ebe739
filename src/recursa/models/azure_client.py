"""Azure OpenAI via the `openai` SDK's AsyncAzureOpenAI: the OpenAI client with Azure's URLs
(/openai/deployments/{deployment}/chat/completions?api-version=...) and `api-key` auth.

    make_client("azure:my-gpt-4o-deployment")   # AZURE_OPENAI_ENDPOINT, AZURE_OPENAI_API_KEY
    make_client("azure:my-dep", azure_endpoint="https://res.openai.azure.com",
                api_version="2024-10-21", api_key=..., price_model="gpt-4o")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .openai_client import OpenAIClient
from .pricing import price_for

DEFAULT_API_VERSION = "2024-10-21"   # the GA version current when this was written


class AzureOpenAIClient(OpenAIClient):
    """`model` is the deployment name (spec `azure:DEPLOYMENT`). Endpoint: `azure_endpoint=`
    (or `base_url=`), else AZURE_OPENAI_ENDPOINT. API version: `api_version=`, else
    AZURE_OPENAI_API_VERSION / OPENAI_API_VERSION, else DEFAULT_API_VERSION. Auth: `api_key=`,
    else AZURE_OPENAI_API_KEY, else a Microsoft Entra token (`azure_ad_token=` /
    `azure_ad_token_provider=` / AZURE_OPENAI_AD_TOKEN). Never OPENAI_API_KEY.

    Prices: Azure answers with the underlying model's name (e.g. gpt-4o-mini-2024-07-18), which
    the price table knows; `price_model=` names it when the deployment's replies do not.
    Retries, usage (cached prompt tokens included) and errors are OpenAIClient's.
    """

    def __init__(self, deployment: str, *, azure_endpoint: str | None = None,
                 base_url: str | None = None, api_key: str | None = None,
                 api_version: str | None = None, azure_ad_token: str | None = None,
                 azure_ad_token_provider: Any = None, price_model: str | None = None,
                 name: str | None = None, prices: Mapping[str, Any] | None = None,
                 max_tokens_param: str | None = None, timeout: float = 600.0,
                 default_headers: dict[str, str] | None = None, http_client: Any = None,
                 **opts: Any) -> None:
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
        # Azure takes max_completion_tokens since 2024-09-01 (reasoning models need it).
        super().__init__(deployment, base_url=endpoint + "/openai", api_key=api_key or "EMPTY",
                         name=name, provider="azure", prices=prices, timeout=timeout,
                         max_tokens_param=max_tokens_param or "max_completion_tokens",
                         default_headers=default_headers, http_client=http_client, **opts)
        self.azure_endpoint = endpoint
        self._client = openai.AsyncAzureOpenAI(
            azure_endpoint=endpoint, api_version=self.api_version, api_key=api_key,
            azure_ad_token=None if api_key else azure_ad_token,
            azure_ad_token_provider=None if api_key else azure_ad_token_provider,
            max_retries=0, timeout=timeout, default_headers=default_headers,
            http_client=http_client)

    def __repr__(self) -> str:  # never show the key
        return f"AzureOpenAIClient({self.name!r}, endpoint={self.azure_endpoint!r})"
