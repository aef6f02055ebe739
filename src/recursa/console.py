"""Live, compact terminal view of a run (rich, on stderr), and a JSON-lines event printer."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from recursa.types import Event


def _money(v: float | None) -> str:
    return "cost ?" if v is None else f"${v:.4f}"


class ConsoleView:
    """A TraceSink that shows the current turn, sub-calls in flight and done, tokens and spend."""

    def __init__(self, console: Console | None = None, *, budget: dict[str, Any] | None = None,
                 live: bool = True):
        self.console = console or Console(stderr=True)
        self.budget = budget or {}
        self._lock = threading.Lock()
        self.turn = 0
        self.depth_turns: dict[int, int] = {}
        self.inflight = 0
        self.done = 0
        self.failed = 0
        self.tokens = 0
        self.cost: float | None = 0.0
        self.children = 0
        self.t0 = time.monotonic()
        self.last_answer: dict[str, Any] | None = None
        self._live = Live(self._render(), console=self.console, refresh_per_second=8,
                          transient=True) if live and self.console.is_terminal else None
        if self._live:
            self._live.start()

    def _add_usage(self, data: dict[str, Any]) -> None:
        u = data.get("usage") or {}
        self.tokens += int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))
        c = data.get("cost_usd")
        self.cost = None if (c is None and u) or self.cost is None else self.cost + (c or 0.0)

    def emit(self, ev: Event) -> None:
        with self._lock:
            d = ev.data
            line: str | None = None
            if ev.kind == "turn" and ev.phase == "start" and ev.depth == 0:
                self.turn = d.get("turn", self.turn)
            elif ev.kind == "turn" and ev.phase == "end":
                self._add_usage(d)
                if ev.depth == 0:
                    u = d.get("usage") or {}
                    line = (f"turn {self.turn}: {d.get('blocks', 0)} code block(s), "
                            f"{u.get('input_tokens', 0):,} in / {u.get('output_tokens', 0):,} out"
                            + (f"  error: {d['error']}" if d.get("error") else ""))
            elif ev.kind == "subcall" and ev.phase == "start":
                self.inflight += 1
            elif ev.kind == "subcall" and ev.phase == "end":
                self.inflight = max(0, self.inflight - 1)
                self.done += 1
                self.failed += bool(d.get("error"))
                self._add_usage(d)
            elif ev.kind == "child" and ev.phase == "start":
                self.children += 1
            elif ev.kind == "cell" and ev.phase == "end" and ev.depth == 0:
                if d.get("timed_out") or d.get("restarted"):
                    line = "  cell stopped: sandbox restarted"
            elif ev.kind == "final" and ev.depth == 0:
                self.last_answer = d
            if line:
                self.console.print(Text(line, style="dim"))
            if self._live:
                self._live.update(self._render())

    def _render(self) -> Text:
        lim = self.budget

        def of(name: str, fmt: str = "{:,}") -> str:
            v = lim.get(name)
            return "" if v is None else " / " + fmt.format(v)
        cost = _money(self.cost) + of("max_cost_usd", "${:.2f}")
        return Text(
            f"turn {self.turn}{of('max_iterations')}  sub-calls {self.done}{of('max_subcalls')}"
            f" done, {self.inflight} running"
            + (f", {self.failed} failed" if self.failed else "")
            + (f"  children {self.children}" if self.children else "")
            + f"  tokens {self.tokens:,}{of('max_tokens')}  {cost}"
            + f"  {time.monotonic() - self.t0:.1f}s{of('max_seconds', '{:g}s')}",
            style="cyan")

    def summary(self) -> str:
        return self._render().plain

    def close(self) -> None:
        if self._live:
            self._live.stop()
            self._live = None


class JsonLinesView:
    """Prints every event as one JSON line (for scripts)."""

    def __init__(self, stream: TextIO | None = None):
        from recursa.trace import Redactor
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()
        self._redact = Redactor()     # stderr is often captured in logs: no secrets there either

    def emit(self, ev: Event) -> None:
        with self._lock:
            self.stream.write(self._redact(ev.model_dump_json()) + "\n")
            self.stream.flush()

    def close(self) -> None:
        pass
