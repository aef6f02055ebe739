"""Slow clients are dropped: a request's headers must arrive within `header_timeout` seconds of
its first byte, and its body within `body_timeout` seconds of its headers (slowloris: a client
that trickles a byte now and then would otherwise hold a connection, and a run slot, forever).

uvicorn has no such timeout of its own (its keep-alive timer is reset by every byte), so
`recursa serve` runs it with `guarded_h11(...)`: uvicorn's h11 protocol (its `--http` extension
point), watched by a second h11 parser of our own that only follows the client's framing
(where a request's headers end, where its body ends, Content-Length or chunked) and closes the
connection when a deadline passes. Time spent on the response does not count: the deadlines
cover only the client's sending.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("recursa.server")

HEADER_TIMEOUT = 15.0
BODY_TIMEOUT = 60.0
_MAX_HEADERS = 64 * 1024      # uvicorn's own bound on an incomplete request head


class _Framing:
    """A client's requests as h11 sees them: each data chunk says whether a request's headers
    or its body ended in it; the responses are never looked at (a stand-in one ends each
    request, so that the next may begin)."""

    def __init__(self) -> None:
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADERS)

    def feed(self, data: bytes) -> list[str]:
        """'head' (a request's headers are in), 'end' (its body is in) as they happen in
        `data`; raises h11.RemoteProtocolError on what uvicorn will refuse too."""
        self.conn.receive_data(data)
        seen: list[str] = []
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                if event is h11.PAUSED and self.conn.their_state is h11.DONE:
                    self._next()
                    continue
                return seen
            if isinstance(event, h11.Request):
                seen.append("head")
            elif isinstance(event, h11.EndOfMessage):
                seen.append("end")
                self._next()
            elif isinstance(event, h11.ConnectionClosed):
                return seen

    def _next(self) -> None:
        if self.conn.our_state is h11.SEND_RESPONSE:
            self.conn.send(h11.Response(status_code=204, headers=[]))
            self.conn.send(h11.EndOfMessage())
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()


class _GuardedH11(H11Protocol):
    header_timeout = HEADER_TIMEOUT
    body_timeout = BODY_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._framing = _Framing()
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = "idle"            # idle | head | body
        self._conn_transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._conn_transport = transport
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._phase == "idle" and data:
            self._arm("head", self.header_timeout)
        try:
            for what in self._framing.feed(data):
                if what == "head":
                    self._arm("body", self.body_timeout)
                elif what == "end":
                    self._disarm()
        except h11.RemoteProtocolError:
            self._disarm()               # uvicorn answers 400 and closes
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = "idle"

    def _expired(self, phase: str) -> None:
        self._deadline = None
        what = "headers" if phase == "head" else "body"
        seconds = self.header_timeout if phase == "head" else self.body_timeout
        log.warning("dropped a client whose request %s took over %g s to arrive", what, seconds)
        if self._conn_transport is not None:
            self._conn_transport.abort()


def guarded_h11(header_timeout: float = HEADER_TIMEOUT,
                body_timeout: float = BODY_TIMEOUT) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these deadlines (for uvicorn's `http=`)."""
    if header_timeout <= 0 or body_timeout <= 0:
        raise ValueError("header and body timeouts must be positive")
    return type("GuardedH11Protocol", (_GuardedH11,),
                {"header_timeout": float(header_timeout), "body_timeout": float(body_timeout)})
