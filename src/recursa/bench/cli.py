"""`recursa bench run | report | list` (picked up by recursa.cli through `register`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

err = Console(stderr=True, highlight=False)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _kv(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def register(sub: Any) -> None:
    from recursa.cli import add_model_options

    b = sub.add_parser("bench", help="run the evaluation suite and report on it")
    bs = b.add_subparsers(dest="bench_cmd", required=True)

    r = bs.add_parser("run", help="run methods over task instances; one JSONL row each")
    r.add_argument("--task", required=True, help="comma-separated task names (see bench list)")
    r.add_argument("--lengths", default="8k",
                   help="comma-separated input lengths in tokens: 2048, 8k (=8192), 1m (=2^20)")
    r.add_argument("--method", default="rlm,direct",
                   help="comma-separated: rlm, rlm-d0, rlm-d2, direct, direct-trunc, "
                        "compaction, codeact-bm25")
    r.add_argument("-n", type=int, default=10, help="instances (seeds) per task and length")
    r.add_argument("--seed-start", type=int, default=0)
    r.add_argument("--out", required=True, help="results directory (rows.jsonl, traces/)")
    add_model_options(r)
    r.set_defaults(concurrency=4)   # here: instances in parallel (not sub-calls per run)
    r.add_argument("--subcall-concurrency", type=int, default=8,
                   help="parallel sub-calls within one run")
    r.add_argument("--depth", type=int, default=1, help="rlm recursion depth (rlm-dN overrides)")
    r.add_argument("--truncate", action="store_true",
                   help="direct: cut an input that does not fit the window (else: a failure)")
    r.add_argument("--window", type=int, help="root model window in tokens (direct); default: "
                                              "the client's own (a local model's n_ctx)")
    r.add_argument("--n-ctx", type=int, help="local models: context size to load")
    r.add_argument("--chunk-tokens", type=int, default=2000, help="compaction window")
    r.add_argument("--passage-tokens", type=int, default=200, help="codeact-bm25 passage size")
    r.add_argument("--max-answer-tokens", type=int,
                   help="output cap of every model call (max_tokens)")
    r.add_argument("--temperature", type=float)
    r.add_argument("--client-option", type=_kv, action="append", default=[],
                   metavar="KEY=VALUE", help="extra option for local/replay clients (JSON value)")
    r.add_argument("--tips", help="tips block for the RLM's system prompt")
    r.add_argument("--retry-errors", action="store_true", help="redo rows with status error")
    r.add_argument("--no-traces", action="store_true", help="write no per-instance traces")
    r.add_argument("--no-progress", action="store_true")
    from .executors import add_executor_options
    add_executor_options(r)     # --executor local|ray (recursa.bench.executors)
    r.set_defaults(fn=cmd_run)

    p = bs.add_parser("report", help="tables (mean score, 95%% CI, cost, tokens, time) + plots")
    p.add_argument("results", help="results directory or rows file")
    p.add_argument("--out", help="where to write plots and results.md (default: the results dir)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    p.set_defaults(fn=cmd_report)

    ls = bs.add_parser("list", help="task families and methods")
    ls.set_defaults(fn=cmd_list)


def cmd_run(a: argparse.Namespace) -> int:
    from recursa.cli import _limits, resolve_model

    from .executors import executor_from_args
    from .methods import MethodConfig, parse_method
    from .runner import make_specs, parse_length, run_bench

    try:
        model = resolve_model(a)
        lengths = [parse_length(x) for x in _csv(a.lengths)]
        client_options = dict(a.client_option)
        if a.n_ctx:
            client_options["n_ctx"] = a.n_ctx
        model_options: dict[str, Any] = {}
        if a.max_answer_tokens:
            model_options["max_tokens"] = a.max_answer_tokens
        if a.temperature is not None:
            model_options["temperature"] = a.temperature
        configs = []
        for label in _csv(a.method):
            name, depth, truncate = parse_method(label, a.depth, a.truncate)
            configs.append(MethodConfig(
                method=name, depth=depth, truncate=truncate, model=model,
                sub_model=a.sub_model, base_url=a.base_url, sub_base_url=a.sub_base_url,
                sandbox=a.sandbox, limits=_limits(a), max_output_chars=a.max_output_chars,
                subcall_concurrency=a.subcall_concurrency, client_options=client_options,
                model_options=model_options, window_tokens=a.window,
                chunk_tokens=a.chunk_tokens, passage_tokens=a.passage_tokens, tips=a.tips))
        seeds = range(a.seed_start, a.seed_start + a.n)
        trace_dir = None if a.no_traces else str(_out(a.out) / "traces")
        specs = make_specs(_csv(a.task), lengths, seeds, configs, trace_dir)
    except (ValueError, KeyError, TypeError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    s = run_bench(specs, a.out, executor=executor_from_args(a),
                  retry_errors=a.retry_errors, progress=not a.no_progress)
    err.print(f"{s['ran']} run, {s['skipped']} already done, {s['errors']} errors; "
              f"rows in {_out(a.out) / 'rows.jsonl'}")
    return 0


def _out(path: str) -> Any:
    from pathlib import Path
    return Path(path)


def cmd_report(a: argparse.Namespace) -> int:
    from .report import report
    try:
        import sys
        # piped output (a file, CI log) gets a wide table instead of wrapped 80-column cells
        width = None if sys.stdout.isatty() else 150
        report(a.results, out_dir=a.out, plots=not a.no_plots, resamples=a.resamples,
               console=Console(highlight=False, width=width))
    except (FileNotFoundError, ValueError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    return 0


def cmd_list(a: argparse.Namespace) -> int:
    from .methods import METHODS
    from .tasks import TASKS
    for t in TASKS.values():
        print(f"task    {t.name:14s} {t.complexity:10s} {t.description}")
    for m in METHODS:
        print(f"method  {m}")
    print("method  rlm-dN (depth N; rlm-d0: no sub-calls), direct-trunc")
    return 0
