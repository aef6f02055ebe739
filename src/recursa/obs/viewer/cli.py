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
    v.add_argument("--run", metavar="ID|N", help="which run, when several were appended to "
                   "one file: its id, or its number (1 = the first, -1 = the last, the default)")
    v.add_argument("--runs", action="store_true",
                   help="list the runs in the file (number, id, status, query) and exit")
    v.add_argument("--live", action="store_true",
                   help="follow the run as it is written (serves on 127.0.0.1 until Ctrl-C)")
    v.add_argument("--port", type=int, default=0, help="port for --live (default: any free one)")
    v.set_defaults(fn=cmd_view)


def cmd_view(a: argparse.Namespace) -> int:
    from recursa.obs.trace import load_runs
    from recursa.obs.viewer import write_html

    trace = Path(a.trace)
    if a.live:
        return _live(trace, a)
    if not trace.exists():
        print(f"error: {trace}: no such file", file=sys.stderr)
        return 2
    try:
        runs = load_runs(trace)
        if not runs:
            raise ValueError(f"{trace}: no recursa events in this file")
        if a.runs:
            for i, r in enumerate(runs, 1):
                print(_describe(i, r))
            return 0
        run = pick_run(runs, a.run)
        out = write_html(trace, a.output, run_id=run.run_id)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = run.totals
    cost = "cost unknown" if t.cost_usd is None else f"${t.cost_usd:.4f}"
    state = run.status or ("unfinished" if not run.finished else "ended")
    print(f"{out}  ({run.events:,} events, {state}, {t.tokens:,} tokens, {cost}"
          + (", last line torn" if run.torn else "") + ")", file=sys.stderr)
    if len(runs) > 1 and a.run is None:
        print(f"{trace} holds {len(runs)} runs; this is the last. Pick another with --run N "
              "or --run ID:", file=sys.stderr)
        for i, r in enumerate(runs, 1):
            print("  " + _describe(i, r), file=sys.stderr)
    if a.open:
        webbrowser.open(out.resolve().as_uri())
    return 0


def pick_run(runs: list[Any], which: str | None) -> Any:
    """The run `which` names: an id, or a number (1-based; negative counts from the end)."""
    if which is None:
        return runs[-1]
    for r in runs:
        if r.run_id == which:
            return r
    try:
        n = int(which)
    except ValueError:
        n = 0
    if n and -len(runs) <= n <= len(runs):
        return runs[n - 1 if n > 0 else n]
    raise ValueError(f"no run {which!r}: the file holds {len(runs)} (numbers 1-{len(runs)}; "
                     f"ids {', '.join(r.run_id for r in runs)})")


def _describe(i: int, run: Any) -> str:
    query = " ".join((run.query or "").split())
    query = query if len(query) <= 60 else query[:57] + "..."
    return f"{i:3d}  {run.run_id}  {run.status or 'unfinished':9s}  {query}"


def _live(trace: Path, a: argparse.Namespace) -> int:
    from recursa.obs.viewer.live import LiveServer

    try:
        server = LiveServer(trace, port=a.port)
    except OSError as e:
        print(f"error: cannot listen on 127.0.0.1:{a.port}: {e}", file=sys.stderr)
        return 2
    # the URL carries the key every request needs (live.py): only who sees it can look
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
