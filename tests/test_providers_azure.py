"""The azure: client (openai SDK's AsyncAzureOpenAI) against a local server speaking Azure
OpenAI's /openai/deployments/{d}/chat/completions?api-version= shape."""

from __future__ import annotations

import pytest

from provider_fakes import ProviderFake
from recursa.base.types import ModelClient, ModelError
from recursa.models import make_client
from recursa.models.azure_client import DEFAULT_API_VERSION, AzureOpenAIClient

USER = [{"role": "user", "content": "hello azure"}]


@pytest.fixture
def fake():
    with ProviderFake(cached_tokens=2) as f:
        yield f


@pytest.fixture(autouse=True)
def _no_azure_env(monkeypatch):
    for var in ("AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN",
                "AZURE_OPENAI_API_VERSION", "OPENAI_API_VERSION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-must-not-leak")


async def test_roundtrip_url_auth_usage_and_cost(fake):
    c = make_client("azure:my-4o-mini", azure_endpoint=fake.url + "/", api_key="az-key",
                    retry_base_delay=0.01)
    assert isinstance(c, AzureOpenAIClient) and isinstance(c, ModelClient)
    r = await c.complete(USER, max_tokens=40, temperature=0.5)
    assert r.text == "echo: hello azure"
    req = fake.requests[-1]
    assert req["path"] == "/openai/deployments/my-4o-mini/chat/completions"
    assert req["query"]["api-version"] == [DEFAULT_API_VERSION]
    assert req["headers"]["api-key"] == "az-key"
    assert "sk-openai" not in str(req["headers"])       # never the OpenAI key
    assert req["body"]["max_completion_tokens"] == 40 and req["body"]["temperature"] == 0.5
    # the deployment name is unknown to the price table; Azure's reply names the model
    assert r.model == "gpt-4o-mini-2024-07-18" and r.usage.cached_tokens == 2
    fresh = r.usage.input_tokens - 2
    assert r.cost_usd == pytest.approx((fresh * 0.15 + 2 * 0.075
                                        + r.usage.output_tokens * 0.60) / 1e6)
    await c.aclose()


async def test_env_config_entra_token_and_price_model(fake, monkeypatch):
    fake.azure_model = "some-custom-model"
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", fake.url)
    monkeypatch.setenv("AZURE_OPENAI_AD_TOKEN", "entra-token")
    monkeypatch.setenv("OPENAI_API_VERSION", "2025-04-01-preview")
    c = make_client("azure:dep1", price_model="gpt-4.1-mini")
    r = await c.complete(USER)
    req = fake.requests[-1]
    assert req["query"]["api-version"] == ["2025-04-01-preview"]
    assert req["headers"]["authorization"] == "Bearer entra-token"
    assert "api-key" not in req["headers"]
    fresh = r.usage.input_tokens - 2
    assert r.cost_usd == pytest.approx((fresh * 0.40 + 2 * 0.10
                                        + r.usage.output_tokens * 1.60) / 1e6)
    await c.aclose()
    c2 = make_client("azure:dep1")                 # no price known anywhere: None, not 0
    assert (await c2.complete(USER)).cost_usd is None
    await c2.aclose()


async def test_retry_then_answer_and_404_not_retried(fake):
    c = make_client("azure:dep", azure_endpoint=fake.url, api_key="k", retry_base_delay=0.01)
    fake.inject(429, retry_after="0.05")
    fake.inject(500)
    assert (await c.complete(USER)).text == "echo: hello azure"
    assert c.stats.retries == 2
    fake.inject(404)
    with pytest.raises(ModelError) as ei:
        await c.complete(USER)
    assert ei.value.status == 404 and c.stats.retries == 2
    await c.aclose()


def test_missing_endpoint_credentials_and_bad_price_model(monkeypatch):
    with pytest.raises(ValueError, match="AZURE_OPENAI_ENDPOINT"):
        make_client("azure:dep", api_key="k")
    with pytest.raises(ValueError, match="AZURE_OPENAI_API_KEY"):
        make_client("azure:dep", azure_endpoint="https://res.openai.azure.com")
    with pytest.raises(ValueError, match="no known price"):
        make_client("azure:dep", azure_endpoint="https://res.openai.azure.com", api_key="k",
                    price_model="not-a-model")
    with pytest.raises(ValueError, match="unknown prefix 'azure-openai'"):
        make_client("azure-openai:dep")
    c = make_client("azure:dep", base_url="https://res.openai.azure.com/openai",
                    api_key="secret-azure-key")
    assert c.azure_endpoint == "https://res.openai.azure.com"
    assert "secret-azure-key" not in repr(c)
