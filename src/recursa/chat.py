"""`recursa chat --context PATH`: questions about one context in a terminal, in one session.

Every question runs in the same sandbox (recursa.core.session): variables and earlier answers carry
over. Ctrl-C cancels the question being answered, not the chat; Ctrl-D or /quit leaves.
Commands: /cost (spend so far), /trace (the trace file), /history, /help, /quit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recursa.obs.terminal import inert

HELP = ("/cost     spend of each question and of the session\n"
        "/trace    the trace file (one run per question)\n"
        "/history  the questions asked so far\n"
        "/quit     leave (also Ctrl-D); Ctrl-C cancels the question being answered")


def register(sub: Any) -> None:
    p = sub.add_parser("chat", help="ask several questions about one context, in one session",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", "-c", required=True, action="append", metavar="PATH",
                   help="file, directory or pipe such as <(cmd) to talk about; repeat it for "
                   "several, which load as one context {name: contents}")
    from recursa.frontend.options import RLMOptions
    RLMOptions.add_to(p, exclude=("route", "route_threshold"))   # sessions are never routed
    p.add_argument("--budget-per", choices=["question", "session"], default="question",
                   help="whether --max-cost, --max-tokens, --max-subcalls and --max-seconds cap "
                        "each question (default) or all of them together")
    p.add_argument("--idle-timeout", type=float, default=3600.0, metavar="S",
                   help="close the session (and its sandbox) after S seconds without a "
                        "question (default 3600)")
    p.add_argument("--trace", help="write the trace here (default: a file in the recursa cache "
                                   "directory; /trace shows it)")
    p.set_defaults(fn=cmd_chat, command_parser=p)   # its usage line for main's errors


def default_trace_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "recursa" / "chat"


def cmd_chat(a: argparse.Namespace) -> int:
    from recursa.base.types import RecursaError
    from recursa.core.session import SESSION_LIMITS
    from recursa.frontend.options import RLMOptions, plain_error

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    try:
        from recursa.frontend.contexts import read_contexts
        # before any model is fetched or checked; stdin is where the questions come from
        context = read_contexts(a.context, stdin=False,
                                say=lambda m: err.print(f"[dim]{escape(m)}[/]"))
        opts = RLMOptions.from_args(a).with_default_model(
            say=lambda m: err.print(f"[yellow]{escape(m)}[/]"))
        from recursa.core.preflight import check_options
        check_options(opts, say=lambda m: err.print(f"[dim]{escape(m)}[/]"))
        config = opts.config()
        limits = opts.limits()
        session_limits = {k: limits.pop(k) for k in SESSION_LIMITS
                          if a.budget_per == "session" and k in limits}
        from recursa.core.rlm import RLM
        rlm = RLM(config=config.replace(**dict.fromkeys(session_limits)), preflight=False)
        session = rlm.session(context, idle_timeout=a.idle_timeout, **session_limits)
        session.trace_path = Path(a.trace) if a.trace else \
            default_trace_dir() / f"session-{session.id}.jsonl"
        about = ", ".join(a.context)
        err.print(f"[dim]loading {escape(about)} ...[/]")
        session.start()
    except (RecursaError, ValueError, TypeError, OSError) as e:
        err.print(f"[red]error:[/] {escape(plain_error(e))}")
        return 2
    err.print(f"[bold]recursa chat[/] with {escape(str(opts.model))} about "
              f"{escape(about)}: ask a question; /help lists the commands, Ctrl-D leaves.")
    with _history(), contextlib.closing(session):
        return _repl(session, out, err, limits)


@contextlib.contextmanager
def _history() -> Any:
    """Line editing and a history file, when a person is typing."""
    if not sys.stdin.isatty():
        yield
        return
    try:
        import readline
    except ImportError:       # not on every platform
        yield
        return
    path = default_trace_dir().parent / "chat_history"
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            from recursa.base.privatefiles import touch_private
            touch_private(path)       # the questions asked: owner-only, as the traces
            readline.set_history_length(1000)
            readline.write_history_file(path)


def _repl(session: Any, out: Console, err: Console, limits: dict[str, Any]) -> int:
    from recursa.base.types import RecursaError
    from recursa.obs.console import ConsoleView, money

    prompt = "\n? " if sys.stdin.isatty() else ""
    while True:
        try:
            line = input(prompt).strip()
        except EOFError:
            break
        except KeyboardInterrupt:   # at the prompt: a fresh line, as in a shell
            err.print("\n[dim](Ctrl-D or /quit to leave)[/]")
            continue
        if not line:
            continue
        if line.startswith("/"):
            if _command(line, session, out, err):
                break
            continue
        view = ConsoleView(err, budget={**limits, **session.limits})
        try:
            res = session.completion(line, on_event=view.emit)
        except KeyboardInterrupt:
            view.close()
            err.print(f"[yellow]cancelled[/]; the session goes on. {escape(session.summary())}")
            continue
        except RecursaError as e:
            view.close()
            err.print(f"[red]error:[/] {escape(inert(str(e)))}")
            if session.closed:
                return 1
            continue
        finally:
            view.close()
        out.print(escape(inert(res.answer)) if res.answer else "[dim](no answer)[/]")
        tokens = sum(u.usage.total_tokens for u in res.usage.values())
        note = f"  stopped at {res.limit}" if res.limit else \
            f"  error: {res.error}" if res.status == "error" else ""
        err.print(f"[dim]{res.status}  turns {res.turns}  sub-calls {res.subcalls}  tokens "
                  f"{tokens:,}  {money(res.cost_usd)}  {res.elapsed_s:.1f}s"
                  f"{escape(inert(note))}[/]")
    err.print(f"[dim]{escape(session.summary())}[/]")
    return 0


def _command(line: str, session: Any, out: Console, err: Console) -> bool:
    """Run a /command; True to leave."""
    cmd = line.split()[0].lower()
    if cmd in ("/quit", "/exit", "/q"):
        return True
    if cmd == "/cost":
        table = Table("#", "status", "cost", "question", box=None)
        for i, t in enumerate(session.history, 1):
            cost = "unknown" if t.cost_usd is None else f"${t.cost_usd:.4f}"
            table.add_row(str(i), t.status, cost, escape(t.query[:60]))
        if session.history:
            out.print(table)
        out.print(escape(session.summary()))
    elif cmd == "/trace":
        out.print(escape(str(session.trace_path or "(no trace)")))
    elif cmd == "/history":
        for i, t in enumerate(session.history, 1):
            out.print(f"{i}. {escape(t.query)}\n   -> {escape(inert(t.answer[:200]))}")
    elif cmd == "/help":
        out.print(HELP)
    else:
        err.print(f"[yellow]unknown command {escape(cmd)}[/]\n{HELP}")
    return False
