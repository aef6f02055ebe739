"""OpenAIClient's HTTP (httpx, no SDK) against real local servers: keep-alive reuse, a server
that closes idle connections, chunked and gzip bodies, Connection: close, transport errors and
timeouts, error statuses with Retry-After, streaming, proxies from the environment, a caller's
own httpx client, and that a request never imports the `openai` SDK."""

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
from recursa.base.types import ModelError
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
        self.heads: list[bytes] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
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
    ok = reply("kept")
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok)

    async def main() -> None:
        srv = RawServer(lambda n: response)
        async with srv as url:
            c = OpenAIClient("m", base_url=url, max_connections=16)
            assert c._client is None                 # no SDK client
            for _ in range(5):
                r = await c.complete(USER)
                assert r.text == "kept" and type(r.raw) is dict
                assert r.usage.input_tokens == 3
            assert srv.connections == 1              # one connection served all five
            await asyncio.gather(*(c.complete(USER) for _ in range(8)))
            assert srv.connections <= 8              # concurrent callers: at most one each
            before = srv.connections
            await asyncio.gather(*(c.complete(USER) for _ in range(8)))
            assert srv.connections == before         # ...and all of them kept for the next wave
            head = srv.heads[0].decode("latin-1").lower()
            assert "authorization: bearer empty" in head and "user-agent: recursa" in head
            await c.aclose()
        srv = RawServer(lambda n: response)
        async with srv as url:                       # the pool never exceeds max_connections
            c = OpenAIClient("m", base_url=url, max_connections=2)
            await asyncio.gather(*(c.complete(USER) for _ in range(10)))
            assert srv.connections == 2 and srv.requests == 10
            await c.aclose()
    run(main())


def test_a_client_used_under_a_new_event_loop_starts_a_fresh_pool() -> None:
    with OpenAITestServer() as srv:
        c = OpenAIClient("m", base_url=srv.base_url)
        for _ in range(2):      # what the sync wrappers do: asyncio.run per completion
            assert asyncio.run(c.complete(USER)).text == "echo: hello"


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
            assert srv.connections == 3 and c.stats.retries == 0
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


def test_transport_errors_and_timeouts_are_retryable_model_errors() -> None:
    async def main() -> None:
        c = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", max_retries=0)  # nothing there
        with pytest.raises(ModelError, match="connection error .*ConnectError") as e:
            await c.complete(USER)
        assert e.value.retryable and e.value.status is None
        srv = RawServer(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
                        close_after=True)
        async with srv as url:
            c = OpenAIClient("m", base_url=url, max_retries=1, retry_base_delay=0.01)
            with pytest.raises(ModelError, match="connection error") as e:
                await c.complete(USER)
            assert srv.requests == 2 and c.stats.retries == 1     # retried once, then gave up
        with OpenAITestServer(latency=1.0) as srv:
            c = OpenAIClient("m", base_url=srv.base_url, max_retries=0)
            with pytest.raises(ModelError, match="request timed out"):
                await c.complete(USER, timeout=0.1)
            with pytest.raises(ModelError, match="request timed out"):
                await c.astream(USER, lambda piece, at: None, timeout=0.1)
            await c.aclose()
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
        bad = b'{"error": {"message": "no such model"}}'
        srv = RawServer(lambda n: b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(bad), bad))
        async with srv as url:
            c = OpenAIClient("m", base_url=url, max_retries=3)
            with pytest.raises(ModelError, match="HTTP 404: no such model") as e:
                await c.complete(USER)
            assert not e.value.retryable and e.value.status == 404 and srv.requests == 1
            await c.aclose()

    run(main())


def test_429_with_retry_after_is_waited_for_then_retried() -> None:
    err = b'{"error": {"message": "slow down"}}'
    limited = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0.05\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(err), err))
    ok = reply("after the wait")
    fine = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok)

    async def main() -> None:
        async with RawServer(lambda n: limited if n == 1 else fine) as url:
            c = OpenAIClient("m", base_url=url, max_retries=2)
            assert (await c.complete(USER)).text == "after the wait"
            assert c.stats.retries == 1 and c.stats.slept_s >= 0.05
            await c.aclose()
    run(main())


def test_a_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY is honoured: the request goes to the proxy with the absolute URL of a host
    that does not even resolve; NO_PROXY exempts a host."""
    ok = reply("via proxy")
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok)

    async def main() -> None:
        proxy = RawServer(lambda n: response)
        async with proxy as url:
            monkeypatch.setenv("HTTP_PROXY", url.removesuffix("/v1"))
            c = OpenAIClient("m", base_url="http://upstream.invalid/v1")
            assert (await c.complete(USER)).text == "via proxy"
            assert proxy.heads[0].startswith(
                b"POST http://upstream.invalid/v1/chat/completions HTTP/1.1")
            await c.aclose()
            async with RawServer(lambda n: response) as direct:
                monkeypatch.setenv("NO_PROXY", "127.0.0.1")
                c = OpenAIClient("m", base_url=direct)
                assert (await c.complete(USER)).text == "via proxy"
                assert proxy.requests == 1          # NO_PROXY: went straight to the server
                await c.aclose()
    run(main())


def test_a_callers_http_client_is_used() -> None:
    import httpx
    seen: list[str] = []

    async def hook(request: httpx.Request) -> None:
        seen.append(str(request.url))

    async def main() -> None:
        with OpenAITestServer() as srv:
            http = httpx.AsyncClient(event_hooks={"request": [hook]})
            c = OpenAIClient("m", base_url=srv.base_url, http_client=http)
            r = await c.complete(USER)
            assert r.text == "echo: hello" and type(r.raw) is dict and c._client is None
            assert seen == [srv.base_url + "/chat/completions"]
            await c.aclose()
            assert http.is_closed
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
        "print('openai' in sys.modules)\n")
    tests = str(Path(__file__).parent)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([tests, *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["echo: x", "False"]


async def test_the_pool_leases_the_least_busy_shard_and_reuses_the_first_when_idle():
    from recursa.models.httppool import LoopPool
    pool = LoopPool(max_connections=40, tls=False, trust_env=False)   # up to 5 shards of 8
    async with pool.lease() as a:
        pass
    async with pool.lease() as b:
        pass
    assert a is b                        # one request after another: one shard, one connection
    async with pool.lease() as c, pool.lease() as d, pool.lease() as e:
        assert len({id(c), id(d), id(e)}) == 3     # requests at once spread over the shards
        assert pool._busy == [1, 1, 1]
    assert pool._busy == [0, 0, 0]
    await pool.aclose()
