"""The root's reply as it is written: throttled `turn` / `delta` events for live views.

A model client that streams (`recursa.models.streaming`) hands each piece of a reply to a
`DeltaEmitter`, which groups the pieces into at most one event per `interval` (the first piece at
once) so a live view updates ten times a second, not once a token. Delta events go only to the
sinks that ask for them (`wants_deltas = True`: the console view, `--events jsonl`, `on_event=`
callbacks, the server's progress), never to a trace file. `StreamedText` rebuilds the text from
them on the receiving side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

DELTA_INTERVAL = 0.1     # seconds between two delta events of one turn


class DeltaEmitter:
    """`emitter(piece, offset)` as a client's on_delta; `flush()` sends what is pending.

    `send(text, offset)` gets the pieces joined; `offset` is where `text` starts in the reply.
    A piece at offset 0 after text was sent means the client retried the reply from the start:
    it is sent at once, so a view drops what it showed."""

    def __init__(self, send: Callable[[str, int], None], *, interval: float = DELTA_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.send = send
        self.interval = interval
        self.clock = clock
        self.pending: list[str] = []
        self.start = 0          # offset of the first pending piece
        self.end = 0            # offset after the last piece seen
        self.last = float("-inf")
        self.events = 0

    def __call__(self, piece: str, offset: int) -> None:
        restart = offset == 0 and self.end > 0
        if restart:
            self.pending = []
        if not self.pending:
            self.start = offset
        self.pending.append(piece)
        self.end = offset + len(piece)
        if restart or self.clock() - self.last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            text, self.pending = "".join(self.pending), []
            self.last = self.clock()
            self.events += 1
            self.send(text, self.start)


def turn_deltas(tracer: Any, turn_ev: str, run_ev: str, depth: int) -> DeltaEmitter | None:
    """An emitter of `turn` / `delta` events for one turn, or None when no sink wants them
    (then the model is called without streaming)."""
    if not getattr(tracer, "wants_deltas", False):
        return None

    def send(text: str, offset: int) -> None:
        tracer.emit_delta("turn", id=turn_ev, parent=run_ev, depth=depth, text=text,
                          offset=offset)
    return DeltaEmitter(send)


class StreamedText:
    """A reply rebuilt from its delta events (`text` at `offset`); a restart replaces it."""

    def __init__(self) -> None:
        self.text = ""
        self.restarts = 0

    def add(self, text: str, offset: int) -> bool:
        """Place a delta; True when it restarted the reply (offset 0 after some text)."""
        restarted = offset == 0 and bool(self.text)
        self.restarts += restarted
        self.text = self.text[:offset] + text
        return restarted

    def clear(self) -> None:
        self.text = ""

    def tail(self, lines: int, width: int = 160) -> str:
        """The last `lines` lines, each cut at `width` characters."""
        rows = self.text.splitlines()[-lines:] if self.text else []
        return "\n".join(r if len(r) <= width else r[:width - 1] + "…" for r in rows)
