"""Live, compact terminal view of a run (rich, on stderr). The JSON-lines printer for scripts is
recursa.obs.jsonl_view, which does not import rich."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from recursa.base.types import Event
from recursa.obs.progress import MapProgress
from recursa.obs.streaming import StreamedText
from recursa.obs.terminal import inert

WRITING_LINES = 8       # lines of the reply being written that the live view shows
HEARTBEAT_S = 5.0       # not a terminal: a status line at least this often while a run works


def money(v: float | None) -> str:
    """A run's spend as the live view and the end line both show it: "cost ?" when a model
    has no known price (never $0.0000, which would read as free)."""
    return "cost ?" if v is None else f"cost ${v:.4f}"


class ConsoleView:
    """A TraceSink that shows the current turn, sub-calls in flight and done, a map's progress
    (done / total, rate, time left), tokens and spend, and (on a terminal) the last lines of
    the root's reply while the model writes it. Where stderr is not a terminal (a log, CI, a
    pipe) it prints the status line every `heartbeat_s` seconds while nothing else was printed,
    so a long map is never minutes of silence."""

    def __init__(self, console: Console | None = None, *, budget: dict[str, Any] | None = None,
                 live: bool = True, heartbeat_s: float | None = HEARTBEAT_S):
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
        self.started = False    # the cost shows from the run's start, which says if it is priced
        self.children = 0
        self.t0 = time.monotonic()
        self.last_answer: dict[str, Any] | None = None
        self.writing = StreamedText()       # the root's reply so far, from delta events
        self.maps = MapProgress()
        self._live = Live(self._render(), console=self.console, refresh_per_second=8,
                          transient=True) if live and self.console.is_terminal else None
        if self._live:
            self._live.start()
        self._printed = time.monotonic()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if self._live is None and heartbeat_s:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,),
                                          name="recursa-console-heartbeat", daemon=True)
            self._beat.start()

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(min(1.0, every)):
            with self._lock:
                if time.monotonic() - self._printed >= every:
                    self._say(self._status().plain)

    @property
    def wants_deltas(self) -> bool:
        """Only a live display can show a reply as it is written."""
        return self._live is not None

    def _add_usage(self, data: dict[str, Any]) -> None:
        u = data.get("usage") or {}
        self.tokens += int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))
        c = data.get("cost_usd")
        self.cost = None if (c is None and u) or self.cost is None else self.cost + (c or 0.0)

    def emit(self, ev: Event) -> None:
        with self._lock:
            d = ev.data
            line: str | None = None
            self.started = True
            if ev.kind == "run" and ev.phase == "start" and ev.depth == 0:
                if d.get("priced") is False:     # an unpriced root: its cost is unknown
                    self.cost = None
            elif ev.kind == "turn" and ev.phase == "start" and ev.depth == 0:
                self.turn = d.get("turn", self.turn)
                self.writing.clear()
            elif ev.kind == "turn" and ev.phase == "delta":
                if ev.depth == 0:
                    self.writing.add(str(d.get("text", "")), int(d.get("offset", 0)))
            elif ev.kind == "turn" and ev.phase == "end":
                if ev.depth == 0:
                    self.writing.clear()
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
                    line = "  cell stopped: " + _why_stopped(d)
            elif ev.kind == "plan" and ev.phase == "point" and d.get("bound"):
                b = d["bound"]
                cost = "" if b.get("cost_usd") is None else f", ${b['cost_usd']:.4f}"
                line = (f"plan {d.get('plan_kind')}: at most {b.get('calls', 0):,} sub-calls, "
                        f"{b.get('tokens', 0):,} tokens{cost}")
            elif ev.kind == "run" and ev.phase == "point" and ev.depth == 0 \
                    and d.get("strategy"):
                line = f"mode: {d['strategy']} ({d.get('strategy_reason', '')})"
            elif ev.kind == "final" and ev.depth == 0:
                self.last_answer = d
            elif ev.kind == "combinator":
                self.maps.feed(ev)
                if ev.phase == "end" and d.get("partial"):
                    p = d["partial"]
                    line = (f"  {d.get('op', 'map')} stopped by {p.get('limit')}: "
                            f"{p.get('done')} of {p.get('total')} done")
            if line:
                self._say(line)
            if self._live:
                self._live.update(self._render())

    def _say(self, line: str) -> None:
        self.console.print(Text(inert(line), style="dim"))
        self._printed = time.monotonic()

    def _render(self) -> Text | Group:
        status = self._status()
        tail = self.writing.tail(WRITING_LINES, max(20, self.console.width - 4))
        if not tail:
            return status
        return Group(status, Text(inert(tail), style="dim"))

    def render_plain(self) -> str:
        """What the live region shows now, as plain text."""
        with self.console.capture() as cap:
            self.console.print(self._render())
        return cap.get()

    def _status(self) -> Text:
        lim = self.budget

        def of(name: str, fmt: str = "{:,}") -> str:
            v = lim.get(name)
            return "" if v is None else " / " + fmt.format(v)
        cost = (money(self.cost) if self.started else "cost …") + of("max_cost_usd", "${:.2f}")
        mapping = self.maps.line()
        return Text(
            f"turn {self.turn}{of('max_iterations')}  sub-calls {self.done}{of('max_subcalls')}"
            f" done, {self.inflight} running"
            + (f", {self.failed} failed" if self.failed else "")
            + (f"  children {self.children}" if self.children else "")
            + f"  tokens {self.tokens:,}{of('max_tokens')}  {cost}"
            + f"  {time.monotonic() - self.t0:.1f}s{of('max_seconds', '{:g}s')}"
            + (f"  {mapping}" if mapping else ""),
            style="cyan")

    def summary(self) -> str:
        return self._status().plain

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=2.0)
            self._beat = None
        if self._live:
            self._live.stop()
            self._live = None


def _why_stopped(d: dict[str, Any]) -> str:
    """What cut a cell, in the words of the limit that did it (not "restarted": that is the
    cure, not the cause)."""
    err = str(d.get("error") or "")
    for limit in ("max_seconds", "max_tokens", "max_cost_usd", "max_subcalls"):
        if limit in err:
            return f"the time limit ({limit}) was reached" if limit == "max_seconds" else \
                f"the limit {limit} was reached"
    if d.get("timed_out"):
        return "it ran past the cell timeout; the sandbox was restarted"
    return "the sandbox was restarted"
