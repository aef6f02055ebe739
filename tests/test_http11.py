"""The lean HTTP/1.1 client behind OpenAIClient, against real local servers: keep-alive reuse,
a server that closes idle connections, chunked and gzip bodies, Connection: close, the SDK
fallback when a proxy is configured, and that a request never imports the `openai` SDK."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from openai_testserver import OpenAITestServer
from recursa.models.http11 import HTTPError, HTTPTimeout, Pool, proxy_configured
from recursa.models.openai_client import OpenAIClient

USER = [{"role": "user", "content": "hello"}]


def reply(text: str = "hi") -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


class RawServer:
    """An asyncio TCP server whose handler writes raw HTTP, to shape responses exactly."""

    def __init__(self, respond: Callable[[int], bytes], *, close_after: bool = False):
        self.respond, self.close_after = respond, close_after
        self.connections = 0
        self.requests = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                self.requests += 1
                writer.write(self.respond(self.requests))
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)   # type: ignore[arg-type]


def test_keep_alive_reuses_one_connection_per_sequential_caller() -> None:
    async def main() -> None:
        with OpenAITestServer() as srv:
            c = OpenAIClient("m", base_url=srv.base_url)
            assert c._pool is not None and c._client is None
            for _ in range(5):
                r = await c.complete(USER)
                assert r.text == "echo: hello" and isinstance(r.raw, dict)
                assert r.usage.input_tokens > 0
            assert len(c._pool._idle) == 1          # one connection served all five
            await asyncio.gather(*(c.complete(USER) for _ in range(8)))
            assert len(c._pool._idle) == 8          # concurrent callers open their own
            await c.aclose()
            assert c._pool._idle == []
    run(main())


def test_chunked_gzip_and_connection_close() -> None:
    body = gzip.compress(reply("zipped"))
    chunked = (b"HTTP/1.1 100 Continue\r\n\r\n"
               b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n" +
               b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7])
                        for i in range(0, len(body), 7)) + b"0\r\n\r\n")
    plain = reply("closed")
    closing = (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
               % (len(plain), plain))

    async def main() -> None:
        async with RawServer(lambda n: chunked) as url:
            c = OpenAIClient("m", base_url=url)
            assert (await c.complete(USER)).text == "zipped"
            assert (await c.complete(USER)).text == "zipped"
            await c.aclose()
        srv = RawServer(lambda n: closing)
        async with srv as url:
            c = OpenAIClient("m", base_url=url)
            for _ in range(3):
                assert (await c.complete(USER)).text == "closed"
            assert srv.connections == 3 and c._pool is not None and c._pool._idle == []
            await c.aclose()
    run(main())


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    ok = reply("fresh")
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok)

    async def main() -> None:
        srv = RawServer(lambda n: response, close_after=True)   # closes without saying so
        async with srv as url:
            c = OpenAIClient("m", base_url=url, max_retries=0)
            assert (await c.complete(USER)).text == "fresh"
            await asyncio.sleep(0.05)                  # the server's close arrives
            assert (await c.complete(USER)).text == "fresh"
            assert srv.connections == 2 and c.stats.retries == 0
            await c.aclose()
    run(main())


def test_transport_errors() -> None:
    async def main() -> None:
        pool = Pool("http://127.0.0.1:9/v1")              # nothing listens on port 9
        with pytest.raises(HTTPError, match="cannot connect"):
            await pool.post("/x", b"{}", {}, timeout=5)
        async with RawServer(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
                             close_after=True) as url:
            with pytest.raises(HTTPError, match="IncompleteRead"):
                await Pool(url).post("/chat/completions", b"{}", {}, timeout=5)
        with OpenAITestServer(latency=1.0) as srv:
            with pytest.raises(HTTPTimeout):
                await Pool(srv.base_url).post("/chat/completions",
                                              json.dumps({"messages": USER}).encode(), {},
                                              timeout=0.1)
        with pytest.raises(ValueError, match="http:// or https://"):
            Pool("ftp://example.com/v1")
    run(main())


def test_error_status_body_and_headers_reach_the_model_error() -> None:
    err = json.dumps({"error": {"message": "slow down", "type": "rate_limit"}}).encode()
    resp = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: %d\r\n\r\n%s"
            % (len(err), err))

    async def main() -> None:
        async with RawServer(lambda n: resp) as url:
            c = OpenAIClient("m", base_url=url, max_retries=0)
            with pytest.raises(Exception) as e:
                await c.complete(USER)
            assert "HTTP 429: slow down" in str(e.value)
            assert e.value.retryable and e.value.retry_after == 7 and e.value.status == 429
            await c.aclose()
    run(main())


def test_a_proxy_or_an_http_client_selects_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    assert proxy_configured({"HTTPS_PROXY": "http://proxy:3128"})
    assert not proxy_configured({})
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    c = OpenAIClient("m", base_url="https://example.invalid/v1")
    assert c._client is not None and c._pool is None
    monkeypatch.delenv("https_proxy")

    import httpx

    async def main() -> None:
        with OpenAITestServer() as srv:
            c = OpenAIClient("m", base_url=srv.base_url, http_client=httpx.AsyncClient())
            assert c._client is not None
            r = await c.complete(USER)
            assert r.text == "echo: hello" and isinstance(r.raw, dict)
            await c.aclose()
    run(main())


def test_a_streamed_reply_in_chunks_with_crlf_and_an_error_event() -> None:
    events = [{"model": "m", "choices": [{"index": 0, "delta": {"content": "hel"}}]},
              {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}]
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + \
        b": comment\r\n\r\ndata: [DONE]\r\n\r\n"
    chunked = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" +
               b"".join(b"%x\r\n%s\r\n" % (len(sse[i:i + 5]), sse[i:i + 5])
                        for i in range(0, len(sse), 5)) + b"0\r\n\r\n")
    err = b'data: {"error": {"message": "upstream overloaded", "code": 503}}\n\n'
    failing = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err)

    async def main() -> None:
        async with RawServer(lambda n: chunked) as url:
            c = OpenAIClient("m", base_url=url)
            got: list[tuple[str, int]] = []
            r = await c.astream(USER, lambda piece, at: got.append((piece, at)))
            assert r.text == "hello" and got == [("hel", 0), ("lo", 3)]
            assert r.usage.input_tokens == 4 and r.usage.output_tokens == 2
            await c.aclose()
        async with RawServer(lambda n: failing) as url:
            c = OpenAIClient("m", base_url=url, max_retries=0)
            with pytest.raises(Exception, match="HTTP 503: upstream overloaded"):
                await c.astream(USER, lambda piece, at: None)
            await c.aclose()
    run(main())


def test_a_request_does_not_import_the_openai_sdk() -> None:
    code = (
        "import asyncio, sys\n"
        "from openai_testserver import OpenAITestServer\n"
        "from recursa.models import make_client\n"
        "with OpenAITestServer() as srv:\n"
        "    c = make_client('openai:m', base_url=srv.base_url)\n"
        "    print(asyncio.run(c.complete([{'role': 'user', 'content': 'x'}])).text)\n"
        "    got = []\n"
        "    r = asyncio.run(c.astream([{'role': 'user', 'content': 'y'}],\n"
        "                              lambda piece, at: got.append(piece)))\n"
        "    assert r.text == ''.join(got) == 'echo: y', got\n"
        "print('openai' in sys.modules, 'httpx' in sys.modules)\n")
    tests = str(Path(__file__).parent)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([tests, *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["echo: x", "False False"]
