"""Anthropic models on AWS Bedrock via the `anthropic` SDK's AsyncAnthropicBedrock
(`pip install 'recursa[bedrock]'`: botocore signs each request with SigV4).

    make_client("bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0")      # AWS_REGION + creds
    make_client("bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0", aws_region="us-east-1")
"""

from __future__ import annotations

import os
import re
from typing import Any, Unpack

from recursa.base.extras import MissingExtra

from .anthropic_client import AnthropicClient
from .hosted import DEFAULT_TIMEOUT, ClientOptions

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
                 http_client: Any = None, default_max_tokens: int = 8192,
                 prompt_cache: bool = True, **options: Unpack[ClientOptions]) -> None:
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
        url = (base_url or os.environ.get("ANTHROPIC_BEDROCK_BASE_URL")
               or f"https://bedrock-runtime.{region}.amazonaws.com")
        if http_client is None:   # share one TLS context: see tls.py
            from .tls import shared_ssl_context
            http_client = anthropic.DefaultAsyncHttpxClient(verify=shared_ssl_context())
        sdk = anthropic.AsyncAnthropicBedrock(
            aws_region=region, aws_access_key=aws_access_key if not bearer else None,
            aws_secret_key=aws_secret_key if not bearer else None,
            aws_session_token=aws_session_token if not bearer else None,
            aws_profile=aws_profile if not bearer else None, api_key=bearer, base_url=url,
            max_retries=0, timeout=options.get("timeout", DEFAULT_TIMEOUT),
            http_client=http_client)
        self.aws_region = region
        # Bedrock streams in AWS's binary event-stream framing, which no test here speaks:
        # off unless asked for (stream=True), so live views show each turn when it ends.
        options.setdefault("stream", False)
        super().__init__(model, base_url=url, name=name, default_max_tokens=default_max_tokens,
                         prompt_cache=prompt_cache, sdk_client=sdk, **options)
        self.price_model = price_model or bedrock_price_name(model)
