"""Rich display in Jupyter: a Result, a trace and a running RLM.

- `Result` and `recursa.obs.trace.Run` have `_repr_html_`: the answer, how the run ended and its
  spend, with the run's viewer (recursa.obs.viewer) inline when its events are known.
- In a Jupyter kernel every `RLM.completion` shows one progress line while it runs (turns,
  sub-calls, tokens, cost, time), updated in place through an IPython display handle, ending
  with how the run ended; the `Result` then shows the viewer (its events are kept here for the
  last 16 runs, so no trace file is needed). `show_progress(False)` turns it off.

The viewer page goes into an `<iframe sandbox="allow-scripts" srcdoc=...>`: it keeps its own
Content-Security-Policy and, without `allow-same-origin`, model-written text inside the trace
cannot reach the notebook's page, cookies or kernel. Nothing here imports IPython unless a
kernel is already running.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recursa.base import types as _types
from recursa.base.types import Event
from recursa.obs.progress import MapProgress

if TYPE_CHECKING:
    from recursa.base.types import Result
    from recursa.obs.trace import Run

__all__ = ["NotebookProgress", "in_notebook", "result_html", "run_html", "show_progress",
           "viewer_iframe"]

_KEPT_RUNS = 16            # events of the last runs shown live, for their Results' display
_MAX_KEPT_EVENTS = 20_000  # a run with more is shown without its inline viewer
_UPDATE_EVERY_S = 0.25     # progress line refresh; the final update is always sent
_runs: OrderedDict[str, list[Event]] = OrderedDict()
_runs_lock = threading.Lock()
_enabled = True

_CSS = ("font-family:system-ui,sans-serif;font-size:13px;line-height:1.45;"
        "border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;margin:2px 0")
_STATUS_COLOUR = {"final": "#1a7f37", "extracted": "#9a6700", "limit": "#bc4c00",
                  "error": "#cf222e", "running": "#0969da"}


def show_progress(enabled: bool = True) -> None:
    """Turn the live progress line of runs started in a Jupyter kernel on or off."""
    global _enabled
    _enabled = bool(enabled)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), never imports IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def auto_sinks() -> list[NotebookProgress]:
    """The progress sink RLM adds to a run started in a Jupyter kernel (none elsewhere)."""
    return [NotebookProgress()] if _enabled and in_notebook() else []


# ------------------------------------------------------------------ html pieces
def _escape(text: str, quote: bool = True) -> str:
    # html loads here, not with this module: every run loads this module and only a notebook
    # draws (html.entities is ~2 ms of a run's start-up)
    import html
    return html.escape(text, quote)


def _fmt_tokens(n: int) -> str:
    return f"{n:,}"


def _fmt_cost(c: float | None) -> str:
    return "unknown" if c is None else f"${c:.4f}"


def _badge(status: str) -> str:
    colour = _STATUS_COLOUR.get(status, "#57606a")
    return (f'<span style="background:{colour};color:#fff;border-radius:10px;'
            f'padding:1px 8px;font-size:12px">{_escape(status)}</span>')


def _facts(pairs: list[tuple[str, str]]) -> str:
    return " · ".join(f"{_escape(k)} <b>{_escape(v)}</b>" for k, v in pairs)


def viewer_iframe(events: list[Event] | list[dict[str, Any]], *, title: str = "recursa run",
                  height: int = 520) -> str:
    """The trace viewer for these events as an isolated inline frame."""
    from recursa.obs.viewer import render_html
    page = render_html(events, title=title)
    return (f'<iframe class="recursa-viewer" sandbox="allow-scripts" '
            f'style="width:100%;height:{int(height)}px;border:1px solid #d0d7de;'
            f'border-radius:6px;resize:vertical" srcdoc="{_escape(page, quote=True)}">'
            f"</iframe>")


def _viewer_block(events: list[Event] | None, title: str, open_: bool = False) -> str:
    if not events:
        return ""
    return (f"<details{' open' if open_ else ''}><summary>trace viewer "
            f"({len(events):,} events)</summary>{viewer_iframe(events, title=title)}</details>")


def result_html(res: Result) -> str:
    """A Result as HTML: the answer, the status, the spend, and the run's viewer when its events
    are at hand (shown live in this kernel, or in the Result's trace file)."""
    tokens = sum(u.usage.total_tokens for u in res.usage.values())
    facts = [("turns", str(res.turns)), ("sub-calls", str(res.subcalls)),
             ("tokens", _fmt_tokens(tokens)), ("cost", _fmt_cost(res.cost_usd)),
             ("time", f"{res.elapsed_s:.1f} s")]
    if res.limit:
        facts.append(("limit", res.limit))
    if res.cache_hits:
        facts.append(("cached", str(res.cache_hits)))
    extra = ""
    if res.error:
        extra += f'<div style="color:#cf222e">error: {_escape(res.error)}</div>'
    if res.output_error:
        extra += f'<div style="color:#9a6700">output: {_escape(res.output_error)}</div>'
    if res.trace_path:
        extra += f'<div style="color:#57606a">trace: <code>{_escape(res.trace_path)}</code></div>'
    events = _events_of(res.run_id, res.trace_path)
    answer = _escape(res.answer) if res.answer else "<i>(no answer)</i>"
    return (f'<div class="recursa-result" style="{_CSS}">'
            f"<div>{_badge(res.status)} <span style=\"color:#57606a\">"
            f"{_facts(facts)}</span></div>"
            f'<pre style="white-space:pre-wrap;margin:6px 0">{answer}</pre>{extra}'
            f"{_viewer_block(events, 'recursa run')}</div>")


def run_html(run: Run) -> str:
    """A run read back from its trace (`recursa.obs.trace.load`) as HTML, with its viewer."""
    t = run.totals
    facts = [("turns", str(t.turns)), ("sub-calls", str(t.subcalls)),
             ("children", str(t.children)), ("tokens", _fmt_tokens(t.tokens)),
             ("cost", _fmt_cost(t.cost_usd))]
    if run.start is not None and run.end is not None:
        facts.append(("time", f"{run.end - run.start:.1f} s"))
    status = run.status or ("running" if not run.finished else "unknown")
    query = _escape((run.query or "").strip()[:300])
    answer = _escape(run.answer) if run.answer else "<i>(no answer)</i>"
    events = _events_of(run.run_id, run.path)
    return (f'<div class="recursa-run" style="{_CSS}">'
            f"<div>{_badge(status)} <code>{_escape(run.model or '')}</code> "
            f"<span style=\"color:#57606a\">{_facts(facts)}</span></div>"
            f"<div><b>query</b> {query}</div>"
            f'<pre style="white-space:pre-wrap;margin:6px 0">{answer}</pre>'
            f"{_viewer_block(events, (run.query or 'recursa run')[:80])}</div>")


def _events_of(run_id: str, trace_path: str | None) -> list[Event] | None:
    with _runs_lock:
        kept = _runs.get(run_id)
        if kept is not None:
            return list(kept)
    if trace_path and Path(trace_path).is_file():
        from recursa.obs.trace import read_trace
        try:
            events = [e for e in read_trace(trace_path).events if e.run_id == run_id]
        except (OSError, ValueError):
            return None
        return events if len(events) <= _MAX_KEPT_EVENTS else None
    return None


# ------------------------------------------------------------------ live progress
class NotebookProgress:
    """A trace sink that shows a run's progress in the running notebook cell.

    One display handle per top-level run, updated in place at most every 0.25 s and once at
    the run's end. Keeps the events of the last runs so their `Result` can show the viewer
    without a trace file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._state: dict[str, dict[str, Any]] = {}

    def emit(self, event: Event) -> None:
        if event.phase == "delta":
            return
        try:
            self._emit(event)
        except Exception:      # a display problem never fails the run
            pass

    def _emit(self, ev: Event) -> None:
        with self._lock:
            st = self._state.setdefault(ev.run_id, {
                "t0": ev.t, "turns": 0, "subcalls": 0, "children": 0, "tokens": 0,
                "cost": 0.0, "sent": 0.0, "query": "", "status": "running"})
            with _runs_lock:
                kept = _runs.setdefault(ev.run_id, [])
                _runs.move_to_end(ev.run_id)
                while len(_runs) > _KEPT_RUNS:
                    _runs.popitem(last=False)
            if len(kept) < _MAX_KEPT_EVENTS:
                kept.append(ev)
            d = ev.data
            if ev.kind == "run" and ev.phase == "start" and ev.depth == 0:
                st["query"] = str(d.get("query") or "")
            elif ev.kind == "turn" and ev.phase == "start" and ev.depth == 0 and "turn" in d:
                st["turns"] += 1
            elif ev.kind == "subcall" and ev.phase == "start":
                st["subcalls"] += 1
            elif ev.kind == "child" and ev.phase == "start":
                st["children"] += 1
            elif ev.kind == "combinator":
                st.setdefault("maps", MapProgress()).feed(ev)
            # a turn's usage arrives in its update (as soon as the model answered) or, for a
            # turn without one (the last-answer turn), in its end; a sub-call's in its end
            counted = st.setdefault("counted", set())
            if ev.phase in ("update", "end") and ev.kind in ("turn", "subcall") \
                    and isinstance(d.get("usage"), dict) and ev.id not in counted:
                counted.add(ev.id)
                u = d["usage"]
                st["tokens"] += int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))
                c = d.get("cost_usd")
                st["cost"] = None if c is None or st["cost"] is None else st["cost"] + c
            done = ev.kind == "run" and ev.phase == "end" and ev.depth == 0
            if done:
                st["status"] = str(d.get("status") or "ended")
            now = time.monotonic()
            if not done and now - st["sent"] < _UPDATE_EVERY_S:
                return
            st["sent"] = now
            page = self._html(ev, st, done)
        self._show(ev.run_id, page)
        if done:
            with self._lock:
                self._state.pop(ev.run_id, None)

    def _html(self, ev: Event, st: dict[str, Any], done: bool) -> str:
        facts = [("turn" if not done else "turns", str(st["turns"])),
                 ("sub-calls", str(st["subcalls"])), ("tokens", _fmt_tokens(st["tokens"])),
                 ("cost", _fmt_cost(st["cost"])), ("time", f"{ev.t - st['t0']:.1f} s")]
        if st["children"]:
            facts.insert(2, ("child RLMs", str(st["children"])))
        mapping = st["maps"].line() if "maps" in st and not done else ""
        if mapping:
            facts.append(("map", mapping))
        query = _escape(st["query"].strip().splitlines()[0][:120]) if st["query"] else ""
        return (f'<div class="recursa-progress" style="{_CSS}">{_badge(st["status"])} '
                f'<span style="color:#57606a">{_facts(facts)}</span>'
                f"{f' — <i>{query}</i>' if query else ''}</div>")

    def _show(self, run_id: str, page: str) -> None:
        from IPython.display import HTML, display
        handle = self._handles.get(run_id)
        if handle is None:
            self._handles[run_id] = display(HTML(page), display_id=True)
        else:
            handle.update(HTML(page))

    def close(self) -> None:
        self._handles.clear()


_types.html_view = result_html     # Result._repr_html_ draws with this (see recursa.base.types)
