"""The `recursa` command line: run (and the commands other modules register).

Output contracts of `recursa run` (docs/cli.md): the answer (or, with --json, the Result as
JSON) is the only thing on stdout; progress, the summary and errors go to stderr; with
--events jsonl every stderr line is JSON; the exit status says how the run ended.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

# `--version` and `--help` import nothing they do not use (not even typing, logging, pathlib or
# the options): mypy reads this constant as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from recursa.frontend.console import Notices

# exit statuses of `recursa run` (one table in docs/cli.md)
EXIT_FINAL = 0        # the model confirmed its answer
EXIT_ERROR = 1        # the run failed (the partial answer is still printed)
EXIT_USAGE = 2        # bad options or a failed preflight: nothing was spent
EXIT_EXTRACTED = 3    # iterations ran out; the answer was extracted, not confirmed
EXIT_LIMIT = 4        # a hard limit (tokens, cost, sub-calls, time) stopped the run
EXIT_INTERRUPTED = 130
EXIT_CODES = {"final": EXIT_FINAL, "error": EXIT_ERROR, "extracted": EXIT_EXTRACTED,
              "limit": EXIT_LIMIT}


NO_CONTEXT = ("no context to answer over: give --context FILE or DIR (repeat it for several), "
              "or pipe the text in and pass --context -")


def cmd_run(a: argparse.Namespace) -> int:
    from recursa.frontend.console import Notices
    notes = Notices(jsonl=a.events == "jsonl", quiet=a.quiet)
    try:
        return _run(a, notes)
    finally:
        notes.close()


def _run(a: argparse.Namespace, notes: Notices) -> int:
    from pathlib import Path

    from recursa.base.types import RecursaError
    from recursa.frontend.console import escape, stderr_console
    from recursa.frontend.options import OptionError, RLMOptions, plain_error, query_and_cache
    from recursa.frontend.schema import read_schema

    view: Any = None
    try:
        trace = Path(a.trace) if a.trace else None
        if trace is not None and trace.exists() and trace.stat().st_size and not a.append:
            raise OptionError(f"--trace {trace}: the file exists; pass --append to add this "
                              "run to it (view picks a run with --run), or choose a new file")
        query, a.cache = query_and_cache(a.query, a.cache)
        if query is None:
            raise OptionError("no QUERY given: recursa run QUESTION --context FILE")
        opts = RLMOptions.from_args(a).with_default_model(say=notes.warn)
        from recursa.frontend.contexts import read_contexts
        context = read_contexts(a.context, say=notes.info)
        if context is None:
            raise OptionError(NO_CONTEXT)
        output = read_schema(a.schema)
        from recursa.core.preflight import check_options
        check_options(opts, say=notes.info)
        if a.events == "jsonl":
            from recursa.obs.jsonl_view import JsonLinesView
            view = JsonLinesView()
        elif not a.quiet:
            from recursa.obs.console import ConsoleView
            view = ConsoleView(stderr_console(), budget=opts.limits())
        last = LastAnswer()
        rlm = opts.build(trace_path=trace, trace_dir=None if trace else a.trace_dir,
                         sinks=[view, last] if view else [last], preflight=False,
                         sources=a.sources, mcp_servers=a.mcp)
    except (RecursaError, ValueError, TypeError, OSError) as e:
        notes.error(plain_error(e))
        return EXIT_USAGE
    import asyncio
    try:
        res = asyncio.run(until_signal(rlm.acompletion(query, context, output=output)))
    except KeyboardInterrupt:
        return _interrupted(view, last, rlm, notes, EXIT_INTERRUPTED)
    except Stopped as e:
        return _interrupted(view, last, rlm, notes, 128 + e.signum, f"stopped by {e.name}")
    except (RecursaError, ValueError) as e:
        notes.error(plain_error(e))
        return EXIT_USAGE
    finally:
        if view:
            view.close()
    if a.json:
        print(answer_for_stdout(res.model_dump_json(indent=1), raw=a.raw, as_json=True))
    elif output is not None and res.parsed is not None:
        parsed = json.dumps(res.parsed, ensure_ascii=False)
        print(answer_for_stdout(parsed, raw=a.raw, as_json=True))
    else:
        print(answer_for_stdout(res.answer, raw=a.raw))
    from recursa.core import sources
    if a.sources and not a.json:     # the quotes are model-written too
        print(answer_for_stdout("\n" + sources.render(res.sources), raw=a.raw))
    if sources.warning(res.sources):
        notes.warn(f"warning: {sources.warning(res.sources)}")
    if not a.quiet and a.events != "jsonl":
        from recursa.obs.console import money  # as the live view said it
        tokens = sum(u.usage.total_tokens for u in res.usage.values())
        stderr_console().print(f"[dim]status {res.status}  turns {res.turns}  sub-calls {res.subcalls}  "
                  f"tokens {tokens:,}  {money(res.cost_usd)}  {res.elapsed_s:.1f}s"
                  + (f"  route {res.route}" if res.route == "direct" or a.route == "auto" else "")
                  + (f"  trace {escape(res.trace_path)}" if res.trace_path else "") + "[/]")
        if res.status == "limit":
            from recursa.obs.terminal import inert  # its error may quote a model's text
            stderr_console().print(f"[yellow]{escape(inert(limit_line(res)))}[/]")
        if res.cost_usd is None:
            stderr_console().print("[dim]cost ?: a model has no known price; give one with "
                                   "--price IN/OUT (USD per 1M tokens)[/]")
    if res.status == "error":
        notes.error(f"run failed: {res.error}")
    if output is not None and res.parsed is None:
        notes.error(f"the answer does not match --schema: {res.output_error or 'no answer'}")
        return EXIT_ERROR
    return EXIT_CODES.get(res.status, EXIT_ERROR)


def answer_for_stdout(answer: str, *, raw: bool = False, as_json: bool = False) -> str:
    """The answer (its sources, or `as_json`: JSON text) as `run` prints it: to a terminal, with
    control characters made inert (a model's escape sequences must not act on it; JSON keeps
    its value, as `\\u` escapes); `--raw`, or a pipe, gets it as it is."""
    if raw or not sys.stdout.isatty():
        return answer
    from recursa.obs.terminal import inert, inert_json
    return inert_json(answer) if as_json else inert(answer)


def limit_line(res: Any) -> str:
    """What a run stopped by a limit says: which limit, and what its answer rests on."""
    if res.partial:
        return f"stopped at limit {res.limit}; partial: the answer rests on {res.partial}"
    if res.error:
        return f"stopped at limit {res.limit}: {res.error}"
    if res.answer:
        return f"stopped at limit {res.limit}; answer extracted at the end"
    return f"stopped at limit {res.limit}; no answer"


class LastAnswer:
    """A sink that keeps the top-level run's `final` event: what a run stopped by a signal
    answered (the run writes it, and its trace's end, while it is cancelled)."""

    def __init__(self) -> None:
        self.final: dict[str, Any] = {}

    def emit(self, ev: Any) -> None:
        if ev.kind == "final" and ev.depth == 0:
            self.final = dict(ev.data)

    def close(self) -> None:
        pass


class Stopped(Exception):
    """SIGTERM or SIGHUP (a closed terminal) stopped the run."""

    def __init__(self, signum: int):
        import signal
        self.signum, self.name = signum, signal.Signals(signum).name
        super().__init__(self.name)


async def until_signal(work: Any) -> Any:
    """Await `work`; SIGTERM and SIGHUP cancel it like Ctrl-C does, so the run still ends its
    trace and keeps its partial answer, then raise Stopped. Only the command line does this:
    a library import never installs signal handlers."""
    import asyncio
    import signal
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    got: list[int] = []

    def stop(signum: int) -> None:
        got.append(signum)
        task.cancel()
    sigs = [s for s in (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, s.name)]
    for sig in sigs:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            raise Stopped(got[0]) from None
        raise
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


def _interrupted(view: Any, last: LastAnswer, rlm: Any, notes: Notices, status: int,
                 why: str = "interrupted") -> int:
    from recursa.obs.console import ConsoleView
    if view is not None:
        view.close()
    try:     # a closed terminal: what cannot be printed is still in the trace
        notes.warn(why + (": " + view.summary() if isinstance(view, ConsoleView) else ""))
        answer = last.final.get("answer") or ""
        if answer:
            print(answer_for_stdout(answer), flush=True)
            partial = last.final.get("partial")
            notes.warn("(partial answer above" + (f": it rests on {partial})" if partial
                                                  else ")"))
        where = rlm.trace_path or (rlm.trace_dir and
                                   f"{rlm.trace_dir}/run-*.jsonl (the newest)")
        notes.info(f"trace: {where or '(none: pass --trace)'}")
    except OSError:
        pass
    return status


class _Version(argparse.Action):
    """--version: the running code's `recursa.__version__` (pyproject.toml reads it from there;
    asking the installed metadata would scan every distribution in the venv, ~0.1 s)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any):
        super().__init__(option_strings, dest, nargs=0, help="print recursa's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from recursa import __version__
        print(f"recursa {__version__}")
        parser.exit()


# Every sub-command: name -> (the module whose `register(subparsers)` adds it, its help line).
# `recursa --help` is built from this table alone, and a command line that names a command
# imports that command's module only (the others cost up to ~0.2 s to import). To add a
# command: a row here, and in its module a `register(sub)` that calls
# `sub.add_parser(NAME, help=<the same line>)` and `set_defaults(fn=...)`; fn(args) returns the
# exit status. Optional defaults: `uses_http=False` (a command that never speaks HTTP: httpx is
# not imported for it), `preload=(module, ...)` (what fn imports anyway: imported up front
# with the garbage collector paused, see recursa.frontend.lean_imports).
# tests/test_cli.py checks the table against the modules.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("recursa.cli", "answer a question over a file, a directory or stdin"),
    "models": ("recursa.models_cli", "list models and providers, fetch a local model, or "
               "set the default model"),
    "aliases": ("recursa.models_cli", "short names for model specs (recursa aliases set "
                "fast openai:gpt-5-mini)"),
    "keys": ("recursa.models_cli", "store API keys in your settings file (never shown)"),
    "runtime": ("recursa.models.runtime_cli", "fetch or build, then check, the local llama.cpp runtime"),
    "bench": ("recursa.bench.cli", "run the evaluation suite and report on it"),
    "view": ("recursa.obs.viewer.cli", "open a run's trace as one self-contained HTML page"),
    "serve": ("recursa.server.cli", "serve an RLM behind an OpenAI-compatible API"),
    "mcp": ("recursa.server.cli", "run an MCP server (stdio) with an rlm_answer tool"),
    "ablate": ("recursa.envs.cli", "run environment variants side by side and report "
               "reward, tokens, sub-calls and time"),
    "export-sft": ("recursa.envs.cli", "turn traces of scored runs into chat-format "
                   "fine-tuning data (JSONL)"),
    "chat": ("recursa.chat", "ask several questions about one context, in one session"),
    "batch": ("recursa.batch.cli", "one question over many documents (or many over one), "
              "resumable"),
}


def register(sub: Any) -> None:
    """The built-in command, `run`."""
    r = sub.add_parser("run", help=COMMANDS["run"][1],
                       description="Answer QUERY over --context. stdout gets the answer only "
                       "(--json: the Result as JSON); stderr the live view and the summary. "
                       "Exit status: 0 final, 1 error, 2 bad options or failed preflight, "
                       "3 extracted, 4 limit, 130 interrupted.")
    r.add_argument("query", nargs="?", metavar="QUERY", help="the question")
    r.add_argument("--context", "-c", action="append", metavar="PATH",
                   help="a file, a directory, - for stdin, or a pipe such as <(cmd); repeat "
                   "it for several, which load as one context: a dict {name: contents}, each "
                   "file under its name")
    r.add_argument("--trace", help="write the trace to this JSONL file (refuses an existing "
                   "one unless --append)")
    r.add_argument("--append", action="store_true",
                   help="with --trace: add this run to an existing trace file")
    r.add_argument("--trace-dir", help="write one trace file per run into this directory")
    r.add_argument("--quiet", "-q", action="store_true",
                   help="print only the answer (errors still go to stderr)")
    r.add_argument("--events", choices=["jsonl"],
                   help="print every event as one JSON line on stderr (and nothing else there)")
    r.add_argument("--schema", metavar="FILE",
                   help="JSON schema the answer must match; stdout is then the validated JSON")
    r.add_argument("--json", action="store_true",
                   help="print the full Result as JSON on stdout instead of the answer")
    r.add_argument("--raw", action="store_true",
                   help="print the answer's characters as they are, control characters "
                   "included (by default they are shown as \\xNN on a terminal; the same for "
                   "--sources, and --json / --schema escape them as \\u00NN)")
    r.add_argument("--sources", action="store_true",
                   help="ask the model for the passages its answer rests on, check them "
                   "against the context and print them after the answer")
    r.add_argument("--mcp", metavar="CONFIG",
                   help="a JSON file of MCP servers ({\"mcpServers\": {NAME: {\"command\", "
                   "\"args\", \"env\", \"allow\": [TOOL, ...]}}}): each allowed tool becomes "
                   "a function mcp_NAME_TOOL(...) in the REPL, called by recursa, never by the "
                   "sandbox (docs/tools.md)")
    from recursa.frontend.options import RLMOptions
    RLMOptions.add_to(r)
    r.set_defaults(fn=cmd_run, preload=("recursa.core.rlm", "recursa.core.preflight"),
                   command_parser=r)   # its usage line for main's errors


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: every command in full, except that given an `argv`, only the
    command it names (if any) is built in full and the others are listed by name and help line
    (COMMANDS), without importing their modules. `build_parser()` builds them all."""
    p = argparse.ArgumentParser(prog="recursa", description="Recursive Language Models")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="cmd", required=True)
    if argv is None:
        wanted = {module for module, _ in COMMANDS.values()}
    else:
        first = next((a for a in argv if not a.startswith("-")), None)
        wanted = {COMMANDS[first][0]} if first in COMMANDS else set()
    done: set[str] = set()
    for name, (module, help_line) in COMMANDS.items():
        if module in wanted and module not in done:   # all of its commands, here in the list
            done.add(module)
            try:
                _command_module(module).register(sub)
            except ModuleNotFoundError as e:   # an optional part left out of this install
                if not (e.name and module.startswith(e.name)):
                    raise
                if argv is not None:
                    p.error(f"the {name!r} command is not installed here (no module {module})")
        if name not in sub.choices:
            sub.add_parser(name, help=help_line, add_help=False)   # listed, never parsed
    return p


def _command_module(name: str) -> Any:
    import importlib
    if name == "recursa.cli":      # this module, also when it runs as `python -m recursa.cli`
        return sys.modules[__name__]
    return importlib.import_module(name)


def context_hint(args: argparse.Namespace, extras: list[str]) -> str | None:
    """`--context a.txt b.txt "Q?"` (as `llm -f` or a shell glob would have it): argparse takes
    b.txt as the question and refuses "Q?". When --context was given and a leftover argument
    (or the question it swallowed) is an existing path, say how to give several."""
    contexts = getattr(args, "context", None)
    if not isinstance(contexts, list) or not contexts:
        return None
    query = getattr(args, "query", None)
    strays = [x for x in ([query] if isinstance(query, str) else []) + extras
              if os.path.exists(x)]
    if not strays:
        return None
    flags = " ".join(f"--context {shlex.quote(c)}" for c in [*contexts, *strays])
    return f"--context takes one path; repeat it: {flags}"


def main(argv: list[str] | None = None) -> int:
    entry = argv is None    # the process's entry point, which owns its imports (not a test's call)
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, extras = parser.parse_known_args(argv)
    if extras:   # what parse_args would refuse, with a hint for the commonest slip
        hint = context_hint(args, extras)
        where = getattr(args, "command_parser", None) or parser
        where.error(hint or f"unrecognized arguments: {' '.join(extras)}")
    if entry:
        from recursa.frontend.lean_imports import command_imports
        command_imports(http=getattr(args, "uses_http", True),
                        modules=getattr(args, "preload", ()))
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
