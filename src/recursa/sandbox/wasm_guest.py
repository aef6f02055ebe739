"""The worker inside the `wasm` sandbox's WebAssembly Python (WASI, no threads, no signals).

Standard library only; started as ``python -I -S /recursa/wasm_guest.py`` with worker.py beside
it. It reuses the worker's REPL and message handling and replaces the two parts WASI cannot
do: the reader thread (calls to the host block on stdin here, reading until their result
arrives) and the signal mask around writes. An interrupt that arrives while a cell waits on
the host raises KeyboardInterrupt in it; one that arrives while it computes cannot be seen
(nothing preempts the guest), so the host stops the worker after its grace and restarts it.
"""

from __future__ import annotations

import io
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recursa.sandbox import worker as w
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import worker as w


class Channel(w._Channel):
    def send(self, msg: dict) -> None:
        data = json.dumps(msg, default=w._json_fallback, ensure_ascii=False).encode("utf-8")
        view = memoryview(w._HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self.wfd, view):]


class GuestWorker(w.Worker):
    """`Worker` on one thread: messages that arrive during a call wait in `pending`."""

    def __init__(self, channel: Channel):
        super().__init__(channel, {})
        self.pending: list[dict] = []

    def call(self, kind: str, args: dict) -> Any:
        if self.dead:
            raise RuntimeError("the host connection is closed")
        self.next_call += 1
        cid = f"c{self.next_call}"
        self.ch.send({"type": "call", "id": cid, "kind": kind, "args": args})
        while True:
            try:
                msg = self.ch.receive()
            except (EOFError, OSError, ValueError):
                self.dead = True
                raise RuntimeError("the host connection is closed") from None
            t = msg.get("type")
            if t == "result" and str(msg.get("id")) == cid:
                if msg.get("error") is not None:
                    raise RuntimeError(msg["error"])
                return msg.get("value")
            if t == "interrupt":
                if self.current_cell is not None and msg.get("id") == self.current_cell:
                    raise KeyboardInterrupt
            elif t != "result":   # a result for an abandoned call is dropped
                self.pending.append(msg)

    def serve(self) -> None:
        while not self.dead:
            if self.pending:
                msg = self.pending.pop(0)
            else:
                try:
                    msg = self.ch.receive()
                except (EOFError, OSError, ValueError):
                    return
            t = msg.get("type")
            if t == "shutdown":
                return
            if t not in ("interrupt", "result"):   # late ones, for a cell already done
                self.handle(msg)


def main() -> int:
    # The protocol owns fds 0 and 1; WASI has no dup(), so user code's print goes through
    # the worker's StreamRouter and a stray write to fd 1 is a protocol breach the host reports.
    sys.stdin = io.StringIO()   # input() in a cell: EOFError, not a read of the protocol
    os.chdir("/workspace")
    GuestWorker(Channel(0, 1)).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
