"""The run viewer: one self-contained HTML file per trace (`recursa view run.jsonl`).

The page embeds the run's raw events as JSON and renders them with inlined vanilla JavaScript:
no network, no CDN, nothing to install. A Content-Security-Policy forbids every fetch, so even
hostile text inside a trace (model output is untrusted) cannot make the page call home.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from recursa.base.privatefiles import write_private_text
from recursa.base.types import Event
from recursa.obs.trace import TRACE_FORMAT, load_runs, read_trace
from recursa.obs.viewer import assets

__all__ = ["render_html", "write_html", "embed_json"]

_CSP_STATIC = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_CSP_LIVE = _CSP_STATIC + "; connect-src 'self'"


def embed_json(value: Any) -> str:
    """JSON that is safe inside <script>: no `</script>`, `<!--` or line separators can end it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_html(events: list[Event] | list[dict[str, Any]], *, title: str = "recursa run",
                live: dict[str, Any] | None = None) -> str:
    """The viewer page for these events. `live` (events_url, source, offset) makes it poll."""
    data = [e.model_dump(mode="json") if isinstance(e, Event) else e for e in events]
    config: dict[str, Any] = {"format": TRACE_FORMAT, "live": bool(live)}
    if live:
        config.update(live)
    return assets.PAGE.format(csp=_CSP_LIVE if live else _CSP_STATIC, title=html.escape(title),
                              css=assets.CSS, js=assets.JS, config=embed_json(config),
                              data=embed_json(data))


def write_html(trace: str | Path, out: str | Path | None = None, *,
               run_id: str | None = None) -> Path:
    """Write the viewer page of one run of `trace` (the last run by default); returns its path."""
    trace = Path(trace)
    out = Path(out) if out else trace.with_suffix(".html")
    runs = load_runs(trace)
    if not runs:
        raise ValueError(f"{trace}: no recursa events in this file")
    run = runs[-1] if run_id is None else next((r for r in runs if r.run_id == run_id), None)
    if run is None:
        raise ValueError(f"{trace}: no run {run_id!r}")
    raw = read_trace(trace)
    events = [e for e in raw.events if e.run_id == run.run_id]
    label = (run.query or "").strip().splitlines()[0][:80] if run.query else trace.name
    page = render_html(events, title=f"recursa · {label}")
    write_private_text(out, page)     # the page holds the whole run: owner-only, as the trace
    return out
