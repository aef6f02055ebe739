"""httpcore's network layer on plain asyncio streams, for the pools of httppool.py.

httpcore (under httpx) reaches the network through a pluggable backend; on asyncio its default
goes through anyio, whose cancel scope and `fail_after` on every read and write, and attribute
dict and `getpeername` on every idle-connection check, cost about a quarter of httpx's CPU per
request. An 80-wide batch sends its requests one after another on one event loop, so that CPU
is wall time: measured side by side on 2 cores, 80 wide on new connections, 1.2 ms instead of
1.6 ms of CPU per request (docs/performance-archive.md). HTTP itself (h11, pooling, keep-alive) is still httpcore's and httpx's;
this module only moves bytes, and maps failures to httpcore's exceptions as its anyio backend
does, so httpx reports them the same way.

httpx takes no network backend, so `AsyncioTransport` is a transport of its own at httpx's
public seam (`AsyncBaseTransport.handle_async_request`, passed as `transport=`): it hands each
request to an httpcore pool on this backend and httpcore's exceptions back as httpx's, as
httpx's own transport does. No private attribute of httpx or httpcore is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpcore

from recursa.models._http import httpx


def _socket_readable(sock: socket.socket | None) -> bool:
    """Data or an end of stream waiting on the socket (a gone socket counts as readable)."""
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return True
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


@contextlib.contextmanager
def _mapped(timeout_exc: type[Exception], error_exc: type[Exception]) -> Iterator[None]:
    try:
        yield
    except TimeoutError as e:
        raise timeout_exc(str(e) or "timed out") from e
    except (OSError, EOFError, ssl.SSLError) as e:   # resets, refusals, a broken TLS session
        raise error_exc(str(e) or type(e).__name__) from e


def _bounded(timeout: float | None) -> contextlib.AbstractAsyncContextManager[Any]:
    # No timer at all for the usual case: recursa bounds each request with its own deadline
    return contextlib.nullcontext() if timeout is None else asyncio.timeout(timeout)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP (or TLS) connection as an asyncio StreamReader / StreamWriter pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._socket = writer.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _mapped(httpcore.ReadTimeout, httpcore.ReadError):
            async with _bounded(timeout):
                return await self._reader.read(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        with _mapped(httpcore.WriteTimeout, httpcore.WriteError):
            if self._writer.transport.is_closing():
                raise ConnectionResetError("the connection is closed")
            self._writer.write(buffer)
            async with _bounded(timeout):
                await self._writer.drain()

    async def aclose(self) -> None:
        self._writer.transport.abort()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        try:
            with _mapped(httpcore.ConnectTimeout, httpcore.ConnectError):
                async with _bounded(timeout):
                    await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except BaseException:
            await self.aclose()
            raise
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # an idle keep-alive connection the server closed (or wrote to): asyncio may have
            # read that already, so ask the stream as well as the socket
            return (self._writer.transport.is_closing() or self._reader.at_eof()
                    or self._reader.exception() is not None
                    or _socket_readable(self._socket))
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._socket
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        with _mapped(httpcore.ConnectTimeout, httpcore.ConnectError):
            async with _bounded(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(local_address, 0) if local_address else None)
            # asyncio sets TCP_NODELAY on its TCP sockets already
            sock: socket.socket | None = writer.get_extra_info("socket")
            for option in socket_options or ():
                if sock is not None:
                    sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        with _mapped(httpcore.ConnectTimeout, httpcore.ConnectError):
            async with _bounded(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# httpcore's exceptions and httpx's for the same failure (httpx's public names on both sides)
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)   # most specific first


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for theirs, ours in _ERRORS:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc   # httpx's client adds the request
        raise


class _Body(httpx.AsyncByteStream):
    """A response body from httpcore, with httpcore's failures raised as httpx's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        if hasattr(self._stream, "aclose"):
            await self._stream.aclose()


class AsyncioTransport(httpx.AsyncBaseTransport):
    """An httpx transport over an httpcore pool that uses `AsyncioBackend`. For direct
    connections only: proxies keep httpx's transports."""

    def __init__(self, *, ssl_context: ssl.SSLContext, limits: httpx.Limits,
                 uds: str | None = None) -> None:
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, uds=uds, network_backend=AsyncioBackend())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        with _as_httpx_errors():
            resp = await self.pool.handle_async_request(req)
        return httpx.Response(status_code=resp.status, headers=resp.headers,
                              stream=_Body(resp.stream), extensions=resp.extensions)

    async def aclose(self) -> None:
        await self.pool.aclose()
