"""The `recursa` command line: run | models (and the commands other modules register)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, highlight=False)


def _limits(a: argparse.Namespace) -> dict[str, Any]:
    pairs = {"max_iterations": a.max_iterations, "max_depth": a.max_depth,
             "max_subcalls": a.max_subcalls, "max_tokens": a.max_tokens,
             "max_cost_usd": a.max_cost, "max_seconds": a.max_seconds,
             "cell_timeout": a.cell_timeout}
    return {k: v for k, v in pairs.items() if v is not None}


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Model, endpoint and limit options shared by `run`, `serve` and `bench`."""
    p.add_argument("--model", help="root model spec, e.g. openai:gpt-5 or local:qwen2.5-coder-0.5b")
    p.add_argument("--sub-model", help="model for sub-calls (default: the root model)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint for the model")
    p.add_argument("--sub-base-url", help="endpoint for the sub-model")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="environment variable holding the key for --base-url (keys are never "
                        "taken on the command line, where `ps` would show them)")
    p.add_argument("--sandbox", default="local",
                   choices=["local", "inprocess", "docker", "modal", "e2b", "daytona"],
                   help="where model-written code runs (default: isolated local worker)")
    p.add_argument("--max-iterations", type=int)
    p.add_argument("--max-depth", type=int)
    p.add_argument("--max-subcalls", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--max-cost", type=float, help="USD across the whole recursion tree")
    p.add_argument("--max-seconds", type=float)
    p.add_argument("--cell-timeout", type=float)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-output-chars", type=int, default=8192)


def resolve_model(a: argparse.Namespace) -> str:
    if a.model:
        return a.model
    from recursa.models import default_model_spec
    spec, reason = default_model_spec(os.environ)
    err.print(f"[yellow]no --model given: using {spec} ({escape(reason)})[/]")
    return spec


def read_context(arg: str | None) -> Any:
    if arg is None:
        return None
    if arg == "-":
        data = sys.stdin.buffer.read()
        return data
    return Path(arg)


def cmd_run(a: argparse.Namespace) -> int:
    from recursa.console import ConsoleView, JsonLinesView
    from recursa.rlm import RLM
    from recursa.types import RecursaError

    try:
        context = read_context(a.context)
        model = resolve_model(a)
        limits = _limits(a)
        view: Any
        if a.events == "jsonl":
            view = JsonLinesView()
        elif a.quiet:
            view = None
        else:
            view = ConsoleView(err, budget=limits)
        api_key = None
        if a.api_key_env:
            api_key = os.environ.get(a.api_key_env)
            if not api_key:
                raise ValueError(f"--api-key-env {a.api_key_env}: that variable is not set")
        for spec in {model, a.sub_model} - {None}:
            if spec.startswith("local:"):
                from recursa.models.runtime_cli import prepare_local
                prepare_local(spec)
        rlm = RLM(model=model, sub_model=a.sub_model, base_url=a.base_url, api_key=api_key,
                  sub_base_url=a.sub_base_url, sandbox=a.sandbox, concurrency=a.concurrency,
                  max_output_chars=a.max_output_chars, trace_path=a.trace,
                  trace_dir=None if a.trace else a.trace_dir,
                  sinks=[view] if view else None, **limits)
    except (RecursaError, ValueError, TypeError, OSError) as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 2
    try:
        res = asyncio.run(rlm.acompletion(a.query, context))
    except KeyboardInterrupt:
        if isinstance(view, ConsoleView):
            view.close()
            last = view.last_answer or {}
            err.print("[yellow]interrupted[/]: " + view.summary())
            if last.get("answer"):
                print(last["answer"])
                err.print("[yellow](partial answer above)[/]")
        where = rlm.trace_path or (rlm.trace_dir and f"{rlm.trace_dir}/run-*.jsonl (the newest)")
        err.print(f"trace: {escape(str(where or '(none: pass --trace)'))}")
        return 130
    except (RecursaError, ValueError) as e:
        if view:
            view.close()
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 2
    finally:
        if view:
            view.close()
    print(res.answer)
    if a.json:
        err.print_json(res.model_dump_json())
    cost = "unknown" if res.cost_usd is None else f"${res.cost_usd:.4f}"
    tokens = sum(u.usage.total_tokens for u in res.usage.values())
    err.print(f"[dim]status {res.status}  turns {res.turns}  sub-calls {res.subcalls}  "
              f"tokens {tokens:,}  cost {cost}  {res.elapsed_s:.1f}s"
              + (f"  trace {escape(res.trace_path)}" if res.trace_path else "") + "[/]")
    if res.status == "error":
        err.print(f"[red]run failed:[/] {escape(str(res.error))}")
        return 1
    if res.status == "limit":
        err.print(f"[yellow]stopped at limit {res.limit}; answer extracted at the end[/]")
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from recursa.models import fetch as fetch_mod
    if a.action == "list":
        for name, entry in fetch_mod.REGISTRY.items():
            path = fetch_mod.model_path(name)
            state = "fetched" if path.exists() else "not fetched"
            print(f"{name:24s} {state:12s} {getattr(entry, 'description', '')}")
        return 0
    if not a.name:
        err.print("[red]error:[/] name the model to fetch: " + ", ".join(fetch_mod.REGISTRY))
        return 2
    try:
        path = fetch_mod.fetch_model(a.name, progress=lambda m: err.print(f"[dim]{m}[/]"))
    except Exception as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recursa", description="Recursive Language Models")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="answer a question over a file, a directory or stdin")
    r.add_argument("query")
    r.add_argument("--context", "-c", help="file, directory, or - for stdin")
    add_model_options(r)
    r.add_argument("--trace", help="write the trace to this JSONL file")
    r.add_argument("--trace-dir", help="write one trace file per run into this directory")
    r.add_argument("--quiet", "-q", action="store_true", help="no live view")
    r.add_argument("--events", choices=["jsonl"], help="print every event on stderr")
    r.add_argument("--json", action="store_true", help="print the full Result as JSON on stderr")
    r.set_defaults(fn=cmd_run)

    m = sub.add_parser("models", help="list or fetch local models")
    m.add_argument("action", choices=["list", "fetch"])
    m.add_argument("name", nargs="?")
    m.set_defaults(fn=cmd_models)

    for register in _extensions():
        register(sub)
    return p


def _extensions() -> list[Any]:
    """Sub-commands defined by optional modules (bench, view, serve, ...)."""
    import importlib
    import importlib.util
    out = []
    for mod in ("recursa.models.runtime_cli", "recursa.bench.cli", "recursa.viewer.cli",
                "recursa.server.cli", "recursa.envs.cli", "recursa.chat"):
        try:
            present = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:   # the parent package is absent
            present = False
        if present:
            out.append(importlib.import_module(mod).register)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

