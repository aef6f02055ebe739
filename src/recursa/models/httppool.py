"""One `httpx.AsyncClient` per event loop, for the model clients that speak HTTP themselves
(OpenAIClient, LocalClient).

httpx's pooled connections belong to the event loop that opened them, and the sync wrappers run
each completion under an `asyncio.run` of its own, so a pool is made for each new loop (the old
one's connections cannot be used from the new loop and are dropped). Keep-alive connections are
kept up to `max_connections`, so a batch at the client's concurrency reuses its connections.
TLS uses the process's shared context (tls.py), loaded only when the URL is https.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping

import httpx


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
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            verify: ssl.SSLContext | bool = False   # plain http: no CA bundle to load
            if self.tls or (self.trust_env and _https_proxy_in_env()):
                from .tls import shared_ssl_context
                verify = shared_ssl_context()
            limits = httpx.Limits(max_connections=self.max_connections,
                                  max_keepalive_connections=self.max_connections)
            self._client = httpx.AsyncClient(limits=limits, timeout=None, verify=verify,
                                             trust_env=self.trust_env, headers=self.headers)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close this loop's pool (a pool of a loop that has ended has nothing left to close)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()
        if self._given is not None:
            await self._given.aclose()


def _https_proxy_in_env() -> bool:
    """An https:// proxy needs certificate checks even when the target URL is plain http."""
    return any(v.lower().startswith("https:") for k, v in os.environ.items()
               if k.lower().endswith("_proxy"))
