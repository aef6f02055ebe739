"""The litellm: catch-all (litellm.acompletion) pointed at a local OpenAI-compatible server.
Slow: importing LiteLLM takes ~5 s."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("litellm") is None:   # not importorskip: importing it here would
    pytest.skip("litellm not installed", allow_module_level=True)   # bypass the offline setting

from openai_testserver import Fault, OpenAITestServer  # noqa: E402
from recursa.base.types import ModelClient, ModelError  # noqa: E402
from recursa.models import make_client  # noqa: E402
from recursa.models.litellm_client import LiteLLMClient  # noqa: E402

pytestmark = pytest.mark.slow
USER = [{"role": "user", "content": "hello litellm"}]


async def test_roundtrip_retries_errors_and_cost(caplog):
    with OpenAITestServer(cached_tokens=2) as srv:
        c = make_client("litellm:openai/gpt-4o-mini", base_url=srv.base_url,
                        api_key="sk-fake-litellm", retry_base_delay=0.01)
        assert isinstance(c, LiteLLMClient) and isinstance(c, ModelClient)
        r = await c.complete(USER, max_tokens=30, temperature=0.3, stop=["\n\n"])
        assert r.text == "echo: hello litellm"
        body = srv.requests[-1]
        assert body["model"] == "gpt-4o-mini" and body["max_tokens"] == 30
        assert body["temperature"] == 0.3 and body["stop"] == ["\n\n"]
        assert "sk-fake-litellm" in srv.headers[-1].get("authorization", "")
        assert r.usage.cached_tokens == 2
        fresh = r.usage.input_tokens - 2
        assert r.cost_usd == pytest.approx((fresh * 0.15 + 2 * 0.075
                                            + r.usage.output_tokens * 0.60) / 1e6)
        # one 429: recursa retries it (LiteLLM's own retries are off), so exactly 2 requests
        srv.reset()
        srv.inject(Fault.status(429, retry_after="0.05"))
        assert (await c.complete(USER)).text.startswith("echo")
        assert srv.request_count == 2 and c.stats.retries == 1
        srv.reset()
        srv.inject(Fault.status(401, body="bad key"))
        with pytest.raises(ModelError) as ei:
            await c.complete(USER)
        assert ei.value.status == 401 and srv.request_count == 1
        # a model neither recursa nor LiteLLM has a price for: cost None, never 0
        u = make_client("litellm:openai/my-finetune", base_url=srv.base_url, api_key="x")
        assert (await u.complete(USER)).cost_usd is None
        await c.aclose()
    # the client imported LiteLLM in offline mode: no fetch of its remote price map
    assert "remote model cost map" not in caplog.text


def test_bad_specs():
    with pytest.raises(ValueError, match="PROVIDER/MODEL"):
        make_client("litellm:gpt-4o-mini")
    with pytest.raises(ValueError, match="unknown prefix 'lite'"):
        make_client("lite:openai/gpt-4o")
