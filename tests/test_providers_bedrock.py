"""The bedrock: client (anthropic SDK's AsyncAnthropicBedrock) against a local server speaking
Bedrock's /model/{id}/invoke. The fake checks only that a SigV4 signature is present; the client
signs with fake credentials through botocore, as it would for AWS."""

from __future__ import annotations

import pytest

pytest.importorskip("boto3")

from provider_fakes import ProviderFake  # noqa: E402
from recursa.base.types import ModelClient, ModelError  # noqa: E402
from recursa.models import make_client  # noqa: E402
from recursa.models.bedrock_client import BedrockClient, bedrock_price_name  # noqa: E402

MODEL = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
USER = [{"role": "user", "content": "hello bedrock"}]


@pytest.fixture(autouse=True)
def _no_aws_env(monkeypatch, tmp_path):
    # botocore's credential chain must find nothing and never ask the EC2 metadata service
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK",
                "ANTHROPIC_BEDROCK_BASE_URL", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


@pytest.fixture
def fake():
    with ProviderFake() as f:
        yield f


def bclient(fake, **kw) -> BedrockClient:
    kw.setdefault("aws_region", "us-west-2")
    kw.setdefault("aws_access_key", "AKIDFAKEFAKE")
    kw.setdefault("aws_secret_key", "fake-secret")
    kw.setdefault("retry_base_delay", 0.01)
    return make_client(f"bedrock:{MODEL}", base_url=fake.url, **kw)  # type: ignore[return-value]


async def test_signed_invoke_usage_and_cost(fake):
    c = bclient(fake)
    assert isinstance(c, BedrockClient) and isinstance(c, ModelClient)
    msgs = [{"role": "system", "content": "be brief"}, *USER]
    r = await c.complete(msgs, max_tokens=32, temperature=0.1)
    assert r.text == "echo: hello bedrock"
    req = fake.requests[-1]
    assert req["path"] == f"/model/{MODEL}/invoke"
    auth = req["headers"]["authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDFAKEFAKE/")
    assert "/us-west-2/bedrock/aws4_request" in auth and "Signature=" in auth
    assert "fake-secret" not in str(req["headers"])
    body = req["body"]
    assert "model" not in body and body["anthropic_version"] and body["max_tokens"] == 32
    assert body["system"][0]["text"] == "be brief"
    # priced as claude-haiku-4-5: 1 in / 5 out per 1M
    u = r.usage
    assert r.cost_usd == pytest.approx((u.input_tokens * 1 + u.output_tokens * 5) / 1e6)
    await c.aclose()


async def test_retries_and_unsigned_request_is_refused(fake, monkeypatch):
    c = bclient(fake)
    fake.inject(529)
    fake.inject(429, retry_after="0.05")
    assert (await c.complete(USER)).text.startswith("echo")
    assert c.stats.retries == 2
    await c.aclose()
    # a Bedrock API key is sent as a bearer token, not signed: the fake refuses it (403)
    b = make_client(f"bedrock:{MODEL}", base_url=fake.url, aws_region="us-east-1",
                    api_key="bedrock-api-key", retry_base_delay=0.01)
    with pytest.raises(ModelError) as ei:
        await b.complete(USER)
    assert ei.value.status == 403 and b.stats.retries == 0
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer bedrock-api-key"
    await b.aclose()


def test_env_credentials_are_found(fake, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    c = make_client(f"bedrock:{MODEL}")
    assert c.aws_region == "eu-west-1"
    assert c.base_url == "https://bedrock-runtime.eu-west-1.amazonaws.com"


def test_missing_region_credentials_and_bad_specs():
    with pytest.raises(ValueError, match="no AWS region"):
        make_client(f"bedrock:{MODEL}", aws_access_key="a", aws_secret_key="b")
    with pytest.raises(ValueError, match="no AWS credentials"):
        make_client(f"bedrock:{MODEL}", aws_region="us-east-1")
    with pytest.raises(ValueError, match="both aws_access_key"):
        make_client(f"bedrock:{MODEL}", aws_region="us-east-1", aws_access_key="a")
    with pytest.raises(ValueError, match="could not be found"):
        make_client(f"bedrock:{MODEL}", aws_profile="no-such-profile")
    with pytest.raises(ValueError, match=r"Did you mean 'bedrock:anthropic\.claude"):
        make_client("anthropic.claude-sonnet-4-5-20250929-v1:0")
    with pytest.raises(ValueError, match="unknown prefix 'aws'"):
        make_client("aws:anthropic.claude-sonnet-4-5")


def test_price_names():
    assert bedrock_price_name("anthropic.claude-sonnet-4-5-20250929-v1:0") == "claude-sonnet-4-5"
    assert bedrock_price_name("us.anthropic.claude-haiku-4-5-20251001-v1:0") == "claude-haiku-4-5"
    assert bedrock_price_name("global.anthropic.claude-opus-4-1-20250805-v1:0") == "claude-opus-4-1"
    assert bedrock_price_name("anthropic.claude-3-5-haiku-20241022-v1:0") == "claude-3-5-haiku"
