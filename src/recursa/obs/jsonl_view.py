"""Every event of a run as one JSON line, for scripts (`recursa run --events jsonl`)."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from recursa.base.types import Event


class JsonLinesView:
    """Prints every event as one JSON line (for scripts), `delta` events included: the root's
    reply as it is written (`data.text` placed at `data.offset`; offset 0 again restarts it)."""

    wants_deltas = True

    def __init__(self, stream: TextIO | None = None):
        from recursa.obs.trace import Redactor
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()
        self._redact = Redactor()     # stderr is often captured in logs: no secrets there either

    def emit(self, ev: Event) -> None:
        with self._lock:
            self.stream.write(self._redact(ev.model_dump_json()) + "\n")
            self.stream.flush()

    def close(self) -> None:
        pass
