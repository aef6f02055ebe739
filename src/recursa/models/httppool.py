"""One `httpx.AsyncClient` per event loop, for the model clients that speak HTTP themselves
(OpenAIClient, LocalClient).

httpx's pooled connections belong to the event loop that opened them, and the sync wrappers run
each completion under an `asyncio.run` of its own, so a pool is made for each new loop (the old
one's connections cannot be used from the new loop and are dropped). Keep-alive connections are
kept up to `max_connections`, so a batch at the client's concurrency reuses its connections.
TLS uses the process's shared context (tls.py), loaded only when the URL is https.

The pool is split into shards of at most SHARD connections; `lease()` hands out the least busy
(the first on a tie, so requests one after another keep reusing one connection). httpcore checks
every pooled connection each time it assigns a request (encode/httpcore#1035), so one pool of 80
busy connections costs ~80x per request what a pool of a few does. Measured: an 80-wide batch
was +26-34 % over a raw client with one pool (benchmarks/run_all.py --only batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Mapping

from recursa.models._http import httpx

SHARD = 16     # connections per httpx client


class LoopPool:
    """`get()` returns this event loop's AsyncClient, making it on first use in the loop.

    `trust_env=True` honours HTTP(S)_PROXY / ALL_PROXY / NO_PROXY and SSL_CERT_FILE as httpx
    does; a client of a server we started ourselves passes False. A caller's own `client` is
    used as it is, in whatever loop it belongs to."""

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
        self._clients: list[httpx.AsyncClient] = []
        self._busy: list[int] = []        # requests in flight per shard
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[httpx.AsyncClient]:
        """The least busy shard's client for one request (or stream), counted while in use."""
        client = self.get()
        if self._given is not None:
            yield client
            return
        i = self._clients.index(client)
        self._busy[i] += 1
        try:
            yield client
        finally:
            if i < len(self._busy) and self._clients and self._clients[i] is client:
                self._busy[i] -= 1

    def get(self) -> httpx.AsyncClient:
        """This loop's least busy client (made on first use in the loop)."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if not self._clients or self._loop is not loop or self._clients[0].is_closed:
            verify: ssl.SSLContext | bool = False   # plain http: no CA bundle to load
            if self.tls or (self.trust_env and _https_proxy_in_env()):
                from .tls import shared_ssl_context
                verify = shared_ssl_context()
            shards = -(-self.max_connections // SHARD)
            size = -(-self.max_connections // shards)
            limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
            self._clients = [httpx.AsyncClient(limits=limits, timeout=None, verify=verify,
                                               trust_env=self.trust_env, headers=self.headers)
                             for _ in range(shards)]
            self._busy = [0] * shards
            self._loop = loop
        return self._clients[self._busy.index(min(self._busy))]

    async def aclose(self) -> None:
        """Close this loop's pool (a pool of a loop that has ended has nothing left to close)."""
        clients, self._clients, self._busy = self._clients, [], []
        if clients and self._loop is asyncio.get_running_loop():
            for client in clients:
                await client.aclose()
        if self._given is not None:
            await self._given.aclose()


def _https_proxy_in_env() -> bool:
    """An https:// proxy needs certificate checks even when the target URL is plain http."""
    return any(v.lower().startswith("https:") for k, v in os.environ.items()
               if k.lower().endswith("_proxy"))
