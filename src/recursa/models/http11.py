"""A small HTTP/1.1 client on asyncio streams, for JSON POSTs to one model endpoint.

Why not httpx / the openai SDK for the request path: importing the SDK costs ~0.8 s of CPU (most
of a short CLI run's start-up), and the SDK + httpcore spend ~2 ms of CPU per request on the one
event-loop thread, which is what kept an 80-call batch from running as one wave
(docs/performance.md). This client imports nothing beyond the standard library (ssl, asyncio,
json are loaded anyway) and costs tens of microseconds per request.

Scope, kept small on purpose: POST with a body, keep-alive connections per client and event loop
(a stale one is dropped before reuse), Content-Length, chunked and read-to-close bodies, a body
handed over line by line as it arrives (server-sent events), gzip/deflate if a server compresses
anyway, TLS with the shared context, one timeout for the whole exchange. No proxies, redirects or
HTTP/2: OpenAIClient uses the SDK when a proxy is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

_LINE_LIMIT = 1 << 20       # the longest header line we accept
_MAX_IDLE = 256             # idle keep-alive connections kept per pool

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")


def proxy_configured(env: Mapping[str, str] | None = None) -> bool:
    """True when a proxy environment variable is set (then the SDK, which honours it, is used)."""
    env = os.environ if env is None else env
    return any(env.get(v) or env.get(v.upper()) for v in PROXY_VARS)


class HTTPError(Exception):
    """A transport failure: connection refused or reset, a bad response, a timeout."""


class HTTPTimeout(HTTPError):
    pass


@dataclass
class Response:
    status: int
    headers: dict[str, str]      # lower-case names
    body: bytes


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Pool:
    """Keep-alive connections to the host of `base_url`; `post()` sends one request."""

    def __init__(self, base_url: str, *, ssl_context: Callable[[], ssl.SSLContext] | None = None,
                 user_agent: str = "recursa"):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base URL {base_url!r}: need http:// or https:// and a host")
        self.tls = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.tls else 80)
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.prefix = u.path.rstrip("/")
        self._ssl = ssl_context
        self.user_agent = user_agent
        self._idle: list[_Conn] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def _connect(self) -> _Conn:
        ctx = None
        if self.tls:
            if self._ssl is None:
                from .tls import shared_ssl_context
                self._ssl = shared_ssl_context
            ctx = self._ssl()
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=ctx, server_hostname=self.host if ctx else None,
                limit=_LINE_LIMIT)
        except (OSError, ssl.SSLError) as e:
            raise HTTPError(f"cannot connect to {self.host}:{self.port}: "
                            f"{type(e).__name__}: {e}") from e
        return _Conn(reader, writer)

    def _take(self) -> _Conn | None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:      # a new event loop (asyncio.run again): the old
            for conn in self._idle:     # connections belong to the old one
                conn.close()
            self._idle, self._loop = [], loop
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Conn) -> None:
        if self._closed or len(self._idle) >= _MAX_IDLE:
            conn.close()
        else:
            self._idle.append(conn)

    async def post(self, path: str, body: bytes, headers: Mapping[str, str], *,
                   timeout: float | None,
                   on_line: Callable[[bytes], None] | None = None) -> Response:
        """POST `body` to prefix + `path`; any failure raises HTTPError (HTTPTimeout on time)."""
        encoding = "identity" if on_line else "gzip, deflate"   # no compressed event streams
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}",
                 f"Content-Length: {len(body)}", f"Accept-Encoding: {encoding}",
                 f"User-Agent: {self.user_agent}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn: _Conn | None = None
        try:
            async with asyncio.timeout(timeout):
                conn = self._take() or await self._connect()
                conn.writer.write(head + body)
                await conn.writer.drain()
                resp, keep = await _read_response(conn.reader, on_line)
        except TimeoutError as e:
            if conn is not None:
                conn.close()
            raise HTTPTimeout(f"no complete response within {timeout:g} s") from e
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                zlib.error) as e:
            if conn is not None:
                conn.close()
            raise HTTPError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
        except BaseException:       # cancelled mid-request: the connection is in an unknown state
            if conn is not None:
                conn.close()
            raise
        if keep:
            self._give_back(conn)
        else:
            conn.close()
        return resp

    async def post_stream(self, path: str, body: bytes, headers: Mapping[str, str],
                          on_line: Callable[[bytes], None], *,
                          timeout: float | None) -> Response:
        """POST and hand each line of a 2xx body to `on_line` as it arrives (server-sent
        events); a non-2xx reply is read whole and returned with its body. `timeout` bounds the
        whole exchange. Exceptions raised by `on_line` propagate (the connection is closed)."""
        return await self.post(path, body, headers, timeout=timeout, on_line=on_line)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.writer.wait_closed(), 1.0)


class _Lines:
    """Splits a byte stream into lines for `on_line` (CR LF or LF)."""

    def __init__(self, on_line: Callable[[bytes], None]):
        self.on_line, self.buf = on_line, b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        for line in done:
            self.on_line(line.rstrip(b"\r"))

    def close(self) -> None:
        if self.buf:
            self.on_line(self.buf.rstrip(b"\r"))
            self.buf = b""


async def _read_response(reader: asyncio.StreamReader,
                         on_line: Callable[[bytes], None] | None = None
                         ) -> tuple[Response, bool]:
    while True:
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionResetError("server closed the connection without a response")
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
        version, status = parts[0], int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ConnectionResetError("connection closed inside the response headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                key = name.strip().lower()
                v = value.strip()
                headers[key] = f"{headers[key]}, {v}" if key in headers else v
        if status >= 200 or status == 101:
            break                      # 1xx (100 Continue, 103 Early Hints): the real one follows
    conn_hdr = headers.get("connection", "").lower()
    keep = "close" not in conn_hdr and (version != "HTTP/1.0" or "keep-alive" in conn_hdr)
    sink = _Lines(on_line) if on_line is not None and 200 <= status < 300 else None
    if sink is not None:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await _read_chunked(reader, sink.feed)
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left:
                data = await reader.read(min(left, 65536))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                sink.feed(data)
        else:
            while data := await reader.read(65536):
                sink.feed(data)
            keep = False
        sink.close()
        return Response(status, headers, b""), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif status in (204, 304):
        body = b""
    else:
        body = await reader.read()     # delimited by the end of the connection
        keep = False
    enc = headers.get("content-encoding", "").lower()
    if enc in ("gzip", "x-gzip"):
        body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
    elif enc == "deflate":
        try:
            body = zlib.decompress(body)
        except zlib.error:
            body = zlib.decompress(body, -zlib.MAX_WBITS)
    return Response(status, headers, body), keep


async def _read_chunked(reader: asyncio.StreamReader,
                        feed: Callable[[bytes], None] | None = None) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise ConnectionResetError("connection closed inside a chunked body")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass                   # trailers
            return bytes(out)
        data = await reader.readexactly(size)
        if feed is None:
            out += data
        else:
            feed(data)
        await reader.readexactly(2)    # CRLF after the chunk
