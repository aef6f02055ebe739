"""One `httpx.AsyncClient` per event loop, for the model clients that speak HTTP themselves
(OpenAIClient, LocalClient).

httpx's pooled connections belong to the event loop that opened them, and the sync wrappers run
each completion under an `asyncio.run` of its own, so a pool is made for each new loop (the old
one's connections cannot be used from the new loop and are dropped). Keep-alive connections are
kept up to `max_connections`, so a batch at the client's concurrency reuses its connections.
TLS uses the process's shared context (tls.py), loaded only when the URL is https.

The pool is split into shards of at most SHARD connections; `lease()` hands out the least busy
(the first on a tie, so requests one after another keep reusing one connection), and makes a
new shard only when every shard has a request in flight. httpcore checks every pooled connection
each time it assigns a request or a response ends, and each idle one twice over
(encode/httpcore#1035), so one pool of 80 busy connections costs ~80x per request what a pool of
a few does. Measured: an 80-wide batch was +26-34 % over a raw client with one pool
(benchmarks/run_all.py --only batch). Shards are made on demand because a client costs
~0.1-0.3 ms to make: a run's first request makes one, not all of them.

Connections go through httpcore over plain asyncio streams (aionet.py) instead of its anyio
backend, which cost about a quarter of httpx's CPU per request; with a proxy in the
environment, clients are httpx's defaults, so proxies work exactly as httpx has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Mapping

from recursa.models._http import httpx

SHARD = 8      # connections per httpx client


class LoopPool:
    """`get()` returns this event loop's AsyncClient, making it on first use in the loop.

    `trust_env=True` honours HTTP(S)_PROXY / ALL_PROXY / NO_PROXY and SSL_CERT_FILE as httpx
    does; a client of a server we started ourselves passes False. A caller's own `client` is
    used as it is, in whatever loop it belongs to. `uds`: connect to this Unix socket instead
    of the URL's host and port (a server we started; see `use_socket`)."""

    def __init__(self, *, max_connections: int = 64, trust_env: bool = True, tls: bool = True,
                 headers: Mapping[str, str] | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.trust_env = trust_env
        self.tls = tls
        self.headers = dict(headers or {})
        self._given = client
        self.uds: str | None = None
        self._clients: list[httpx.AsyncClient] = []
        self._busy: list[int] = []        # requests in flight per shard
        self._loop: asyncio.AbstractEventLoop | None = None
        self._verify: ssl.SSLContext | None = None
        self._direct = True              # no proxy in the environment: our asyncio transport
        self._shards = -(-max_connections // SHARD)
        size = -(-max_connections // self._shards)
        self._limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[httpx.AsyncClient]:
        """The least busy shard's client for one request (or stream), counted while in use."""
        if self._given is not None:
            yield self._given
            return
        i = self._pick()
        client = self._clients[i]
        busy = self._busy
        busy[i] += 1
        try:
            yield client
        finally:
            # the pool may have been closed or remade (another loop) meanwhile
            if busy is self._busy:
                busy[i] -= 1

    def get(self) -> httpx.AsyncClient:
        """This loop's least busy client (made on first use in the loop)."""
        if self._given is not None:
            return self._given
        i = self._pick()      # first: it may start this loop's list of shards
        return self._clients[i]

    def _pick(self) -> int:
        """Index of the shard for the next request: the least busy, the first on a tie; a new
        one when all are busy and there is room."""
        loop = asyncio.get_running_loop()
        if not self._clients or self._loop is not loop or self._clients[0].is_closed:
            self._clients, self._busy, self._loop = [], [], loop
            self._verify = None
        busy = self._busy
        low = min(busy) if busy else 1
        if low and len(busy) < self._shards:
            self._clients.append(self._new_client())
            busy.append(0)
            return len(busy) - 1
        return busy.index(low)

    async def use_socket(self, path: str) -> None:
        """Send this pool's requests to the Unix socket `path` from now on. A new path (the
        server was restarted) drops and closes this loop's clients of the old one."""
        if path == self.uds:
            return
        old = self._clients if self._loop is asyncio.get_running_loop() else []
        self.uds, self._clients, self._busy = path, [], []
        if old:
            await asyncio.gather(*(c.aclose() for c in old), return_exceptions=True)

    def _new_client(self) -> httpx.AsyncClient:
        if self._verify is None:    # once per loop
            from . import tls
            proxies = _env_proxies() if self.trust_env else []
            # plain http: no CA bundle to load (but an https proxy is checked as usual)
            https = self.tls or any(p.lower().startswith("https:") for p in proxies)
            self._verify = tls.shared_ssl_context() if https else tls.plain_http_context()
            # httpx mounts the environment's proxies only on a client with its own transport
            self._direct = not proxies
        transport: httpx.AsyncBaseTransport | None = None
        if self._direct:
            from .aionet import AsyncioTransport
            transport = AsyncioTransport(ssl_context=self._verify, limits=self._limits,
                                         uds=self.uds)
        elif self.uds is not None:      # a socket is never proxied
            transport = httpx.AsyncHTTPTransport(verify=self._verify, limits=self._limits,
                                                 uds=self.uds)
        return httpx.AsyncClient(transport=transport, limits=self._limits, timeout=None,
                                 verify=self._verify, trust_env=self.trust_env,
                                 headers=self.headers)

    async def aclose(self) -> None:
        """Close this loop's pool (a pool of a loop that has ended has nothing left to close).
        The shards close at once: each waits a loop turn per connection it closes."""
        clients, self._clients, self._busy = self._clients, [], []
        if clients and self._loop is asyncio.get_running_loop():
            await asyncio.gather(*(c.aclose() for c in clients))
        if self._given is not None:
            await self._given.aclose()


def _env_proxies() -> list[str]:
    """The proxy URLs httpx would honour from the environment (NO_PROXY routes nothing). An
    https:// one needs certificate checks even when the target URL is plain http."""
    return [v for k, v in os.environ.items()
            if v and k.lower().endswith("_proxy") and k.lower() != "no_proxy"]
