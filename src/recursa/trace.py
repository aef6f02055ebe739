"""Events, sinks and redaction.

Trace format `recursa-trace/1`: JSONL, one Event per line, appended and flushed as it happens, so a
killed run leaves a valid trace up to its last event. Every message and output is written exactly
once (a turn event carries only that turn's new model text and cell outputs, never the history),
and the context is referenced by its SHA-256 and size, so a trace grows neither with the context
nor quadratically with turns.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from recursa.types import Event, TraceSink

TRACE_FORMAT = "recursa-trace/1"

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)$", re.I)
_SECRET_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}"),          # OpenAI / Anthropic style keys
    re.compile(r"(?i)bearer\s+[A-Za-z0-9._\-]{16,}"),
]


def new_id() -> str:
    return uuid.uuid4().hex[:12]


class Redactor:
    """Replaces secret values (from the environment, or given) and key-shaped strings."""

    def __init__(self, extra: Iterable[str] = ()):
        values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8}
        values.update(s for s in extra if s and len(s) >= 8)
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for v in self._values:
            if v in text:
                text = text.replace(v, "[REDACTED]")
        for pat in _SECRET_PATTERNS:
            text = pat.sub("[REDACTED]", text)
        return text


class JsonlSink:
    """Appends events to a JSONL file, flushed per line. Thread-safe."""

    def __init__(self, path: str | Path, redact: Callable[[str], str] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._redact = redact or Redactor()

    def emit(self, event: Event) -> None:
        line = self._redact(event.model_dump_json(exclude_defaults=False))
        with self._lock:
            if self._f.closed:
                return
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


class CallbackSink:
    """Hands every event to a user callback; a failing callback never fails the run."""

    def __init__(self, fn: Callable[[Event], Any]):
        self.fn = fn
        self.errors = 0

    def emit(self, event: Event) -> None:
        try:
            self.fn(event)
        except Exception:
            self.errors += 1

    def close(self) -> None:
        pass


class Tracer:
    """Emits events of one top-level run (children included) to its sinks."""

    def __init__(self, sinks: list[TraceSink], run_id: str | None = None):
        self.sinks = sinks
        self.run_id = run_id or new_id()
        self._lock = threading.Lock()

    def emit(self, kind: str, *, id: str | None = None, parent: str | None = None,
             phase: str = "point", depth: int = 0, **data: Any) -> str:
        ev = Event(kind=kind, id=id or new_id(), parent=parent, run_id=self.run_id,
                   phase=phase, t=time.time(), depth=depth, data=data)
        for s in self.sinks:
            s.emit(ev)
        return ev.id

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:
                pass


def load_events(path: str | Path) -> list[Event]:
    """Read a trace; a torn last line (killed writer) is skipped, not an error."""
    out: list[Event] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(Event.model_validate(json.loads(line)))
            except (json.JSONDecodeError, ValueError):
                continue
    return out
