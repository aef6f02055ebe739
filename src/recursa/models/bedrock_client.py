"""Anthropic models on AWS Bedrock via the `anthropic` SDK's AsyncAnthropicBedrock
(`pip install 'recursa[bedrock]'`: botocore signs each request with SigV4).

    make_client("bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0")      # AWS_REGION + creds
    make_client("bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0", aws_region="us-east-1")
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from recursa.base.extras import MissingExtra

from .anthropic_client import AnthropicClient

# us.anthropic.claude-sonnet-4-5-20250929-v1:0 -> claude-sonnet-4-5 (the price table's name)
_REGION_PREFIX = re.compile(r"^(?:[a-z]{2,6}\.)?anthropic\.")
_VERSION_SUFFIX = re.compile(r"(?:-\d{8})?(?:-v\d+(?::\d+)?)?$")


def bedrock_price_name(model_id: str) -> str:
    """The Anthropic model name a Bedrock model id or inference profile id is priced as.
    An ARN (application inference profile) gives itself back: price it with `price_model=`."""
    name = _REGION_PREFIX.sub("", model_id.strip().lower())
    return _VERSION_SUFFIX.sub("", name)


def _has_aws_credentials(profile: str | None) -> bool:
    """Whether botocore's credential chain finds anything (env, profile, SSO, role...)."""
    import boto3
    return boto3.Session(profile_name=profile).get_credentials() is not None


class BedrockClient(AnthropicClient):
    """AnthropicClient over Bedrock's /model/{id}/invoke: same request shape (the SDK moves the
    model id into the URL and adds `anthropic_version`), same retries, usage, prompt caching
    (Bedrock supports `cache_control` on Claude models) and prices (Anthropic's list prices;
    `price_model=` for ids that do not reveal the model).

    Region: `aws_region=`, else AWS_REGION / AWS_DEFAULT_REGION / the profile's. Credentials:
    `aws_access_key=` + `aws_secret_key=` (+ `aws_session_token=`), else `aws_profile=`, else a
    Bedrock API key (`api_key=` / AWS_BEARER_TOKEN_BEDROCK), else botocore's default chain.
    `base_url=` (or ANTHROPIC_BEDROCK_BASE_URL) replaces the regional endpoint.
    """

    def __init__(self, model: str, *, aws_region: str | None = None,
                 aws_access_key: str | None = None, aws_secret_key: str | None = None,
                 aws_session_token: str | None = None, aws_profile: str | None = None,
                 api_key: str | None = None, base_url: str | None = None,
                 price_model: str | None = None, name: str | None = None,
                 timeout: float = 600.0, prices: Mapping[str, Any] | None = None,
                 http_client: Any = None, **opts: Any) -> None:
        name = name or f"bedrock:{model}"
        try:
            import anthropic
            import boto3  # noqa: F401 - the SDK signs with botocore, imported on first request
        except ImportError as e:
            raise MissingExtra("bedrock", name, module="boto3") from e
        region = (aws_region or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION"))
        if not region:
            import boto3
            import botocore.exceptions
            try:
                region = boto3.Session(profile_name=aws_profile).region_name
            except botocore.exceptions.ProfileNotFound as e:
                raise ValueError(f"{name}: {e}") from e
        if not region:
            raise ValueError(f"{name}: no AWS region (set AWS_REGION or pass aws_region=)")
        if bool(aws_access_key) != bool(aws_secret_key):
            raise ValueError(f"{name}: pass both aws_access_key= and aws_secret_key=, or neither")
        keys = aws_access_key is not None or aws_profile is not None
        bearer = api_key or (None if keys else os.environ.get("AWS_BEARER_TOKEN_BEDROCK"))
        if not bearer and not keys and not _has_aws_credentials(aws_profile):
            raise ValueError(f"{name}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or AWS_BEARER_TOKEN_BEDROCK; "
                             "or pass aws_access_key= and aws_secret_key=)")
        base_url = base_url or os.environ.get("ANTHROPIC_BEDROCK_BASE_URL")
        if http_client is None:   # share one TLS context: see tls.py
            from .tls import shared_ssl_context
            http_client = anthropic.DefaultAsyncHttpxClient(verify=shared_ssl_context())
        # Bedrock streams in AWS's binary event-stream framing, which no test here speaks:
        # off unless asked for (stream=True), so live views show each turn when it ends.
        opts.setdefault("stream", False)
        super().__init__(model, base_url=base_url or f"https://bedrock-runtime.{region}"
                         ".amazonaws.com", api_key="unused", name=name, timeout=timeout,
                         prices=prices, http_client=http_client, **opts)
        self.aws_region = region
        self.price_model = price_model or bedrock_price_name(model)
        self._client = anthropic.AsyncAnthropicBedrock(
            aws_region=region, aws_access_key=aws_access_key if not bearer else None,
            aws_secret_key=aws_secret_key if not bearer else None,
            aws_session_token=aws_session_token if not bearer else None,
            aws_profile=aws_profile if not bearer else None, api_key=bearer,
            base_url=self.base_url, max_retries=0, timeout=timeout, http_client=http_client)

    def __repr__(self) -> str:
        return f"BedrockClient({self.name!r}, region={self.aws_region!r})"
