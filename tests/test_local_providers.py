"""`ollama:` and `lmstudio:` against a real HTTP server speaking their API
(tests/openai_testserver.py: chat completions, Ollama's /api/tags, /v1/models), and
`recursa models list` with one server reachable and one not. No real Ollama or LM Studio."""

from __future__ import annotations

import socket
import time

import pytest

from openai_testserver import OpenAITestServer
from recursa.cli import main
from recursa.core.preflight import PreflightError, check, target_of_spec
from recursa.models import make_client, provider
from recursa.models.listing import ListError, served_models
from recursa.models.pricing import status
from recursa.models.providers import LMSTUDIO_URL, OLLAMA_URL, ollama_url

USER = [{"role": "user", "content": "hello there"}]
OPENAI_SECRET = "sk-openai-must-not-travel-3f9a"


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def srv():
    with OpenAITestServer(listed=["llama3.2:latest", "qwen2.5:7b"]) as s:
        yield s


@pytest.mark.parametrize("given, url", [
    ("", None),
    ("127.0.0.1:5000", "http://127.0.0.1:5000/v1"),
    ("0.0.0.0", "http://0.0.0.0:11434/v1"),
    ("gpu-box", "http://gpu-box:11434/v1"),
    ("http://gpu-box", "http://gpu-box:80/v1"),
    ("https://ollama.example.com", "https://ollama.example.com:443/v1"),
    ("https://proxy.example.com:8443/ollama/", "https://proxy.example.com:8443/ollama/v1"),
    ("[::1]:11500", "http://[::1]:11500/v1"),
])
def test_ollama_host_is_read_as_ollama_reads_it(given, url, monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", given)
    assert provider("ollama").endpoint_url() == (url or OLLAMA_URL)
    if given:
        assert ollama_url(given) == url
    assert provider("ollama").endpoint_url("http://elsewhere:1/v1") == "http://elsewhere:1/v1"
    assert provider("lmstudio").endpoint_url() == LMSTUDIO_URL


@pytest.mark.parametrize("prefix", ["ollama", "lmstudio"])
async def test_a_completion_through_each_local_server_is_free_and_sends_no_key(
        prefix, srv, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_SECRET)     # must stay with api.openai.com
    if prefix == "ollama":
        monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{srv.port}")   # Ollama's own spelling
        client = make_client("ollama:llama3.2")
    else:                                    # LM Studio defines no variable: base_url=
        client = make_client("lmstudio:qwen2.5-7b-instruct", base_url=srv.base_url)
    try:
        assert client.base_url == srv.base_url and client.name.startswith(prefix + ":")
        comp = await client.complete(USER, max_tokens=20)
        assert comp.text == "echo: hello there"
        assert comp.usage.input_tokens > 0 and comp.usage.output_tokens > 0
        assert comp.cost_usd == 0.0                        # free, not "unknown"
        assert status(client.capabilities.pricing) == "free"
        got: list[str] = []
        streamed = await client.astream(USER, lambda piece, _: got.append(piece))
        assert "".join(got) == comp.text and streamed.cost_usd == 0.0
    finally:
        await client.aclose()
    body = srv.requests[0]
    assert body["model"] == client.name.partition(":")[2] and body["max_tokens"] == 20
    assert all(OPENAI_SECRET not in v for h in srv.headers for v in h.values())


def test_preflight_checks_the_local_servers_address_and_knows_it_is_free(srv, monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{srv.port}")
    t = target_of_spec("ollama:llama3.2")
    assert (t.endpoint, t.price, t.missing_key) == (srv.base_url, "free", None)
    check([t], max_cost_usd=0.01)                  # a cost limit holds: the model is free
    down = free_port()
    t = target_of_spec("lmstudio:m", base_url=f"http://127.0.0.1:{down}/v1")
    with pytest.raises(PreflightError, match=f"lmstudio:m: cannot reach http://127.0.0.1:{down}"):
        check([t])


async def test_each_servers_own_listing_is_read(srv):
    assert await served_models(provider("ollama"), base_url=srv.base_url) == \
        ["llama3.2:latest", "qwen2.5:7b"]               # GET /api/tags, beside /v1
    assert await served_models(provider("lmstudio"), base_url=srv.base_url) == \
        ["llama3.2:latest", "qwen2.5:7b"]               # GET /v1/models
    t0 = time.monotonic()
    with pytest.raises(ListError, match="not reachable at http://127.0.0.1:") as ei:
        await served_models(provider("ollama"), base_url=f"http://127.0.0.1:{free_port()}/v1",
                            timeout=1.0)
    assert time.monotonic() - t0 < 2 and "\n" not in str(ei.value)
    with pytest.raises(ListError, match="answered HTTP 404"):      # not a model server
        await served_models(provider("ollama"), base_url=srv.url + "/nothing/v1")


def test_models_list_shows_every_provider_and_what_a_reachable_server_serves(
        srv, monkeypatch, capsys):
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{srv.port}")
    down = free_port()
    monkeypatch.setenv("VLLM_BASE_URL", f"http://127.0.0.1:{down}/v1")
    assert main(["models", "list", "--timeout", "1"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert any(line.startswith("qwen2.5-coder-1.5b ") for line in lines)   # the GGUF files
    for prefix in ("openai", "openrouter", "vllm", "ollama", "lmstudio", "anthropic",
                   "gemini", "azure", "bedrock", "litellm", "local"):
        assert any(line.strip().startswith(prefix + ":") for line in lines), prefix
    assert "ollama:llama3.2:latest" in out.out and "ollama:qwen2.5:7b" in out.out
    note = [line for line in lines if f"127.0.0.1:{down}" in line]
    assert len(note) == 1 and "not reachable" in note[0]      # one line, no traceback
    assert "Traceback" not in out.out + out.err
