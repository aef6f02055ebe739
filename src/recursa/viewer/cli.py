"""`recursa view run.jsonl [-o run.html] [--open] [--live]` (registered by recursa.cli)."""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    v = subparsers.add_parser("view", help="open a run's trace as one self-contained HTML page")
    v.add_argument("trace", help="trace file (JSONL) written by a run")
    v.add_argument("-o", "--output", help="HTML file to write (default: the trace's name .html)")
    v.add_argument("--open", action="store_true", help="open the page in a browser")
    v.add_argument("--run", help="run id, when several runs were appended to one file")
    v.add_argument("--live", action="store_true",
                   help="follow the run as it is written (serves on 127.0.0.1 until Ctrl-C)")
    v.add_argument("--port", type=int, default=0, help="port for --live (default: any free one)")
    v.set_defaults(fn=cmd_view)


def cmd_view(a: argparse.Namespace) -> int:
    from recursa.trace import load
    from recursa.viewer import write_html

    trace = Path(a.trace)
    if a.live:
        return _live(trace, a)
    if not trace.exists():
        print(f"error: {trace}: no such file", file=sys.stderr)
        return 2
    try:
        out = write_html(trace, a.output, run_id=a.run)
        run = load(trace, a.run)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = run.totals
    cost = "cost unknown" if t.cost_usd is None else f"${t.cost_usd:.4f}"
    state = run.status or ("unfinished" if not run.finished else "ended")
    print(f"{out}  ({run.events:,} events, {state}, {t.tokens:,} tokens, {cost}"
          + (", last line torn" if run.torn else "") + ")", file=sys.stderr)
    if a.open:
        webbrowser.open(out.resolve().as_uri())
    return 0


def _live(trace: Path, a: argparse.Namespace) -> int:
    from recursa.viewer.live import LiveServer

    try:
        server = LiveServer(trace, port=a.port)
    except OSError as e:
        print(f"error: cannot listen on 127.0.0.1:{a.port}: {e}", file=sys.stderr)
        return 2
    print(f"following {trace} at {server.url}  (Ctrl-C to stop)", file=sys.stderr)
    if a.open:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0
