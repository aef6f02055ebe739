"""`recursa bench run | report | list` (picked up by recursa.cli through `register`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

err = Console(stderr=True, highlight=False, soft_wrap=True)


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
    b = sub.add_parser("bench", help="run the evaluation suite and report on it")
    bs = b.add_subparsers(dest="bench_cmd", required=True)

    r = bs.add_parser("run", help="run methods over task instances; one JSONL row each")
    r.add_argument("--task", required=True, help="comma-separated task names (see bench list)")
    r.add_argument("--lengths", default="8k",
                   help="comma-separated input lengths in tokens: 2048, 8k (=8192), 1m (=2^20)")
    r.add_argument("--length", dest="lengths", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
    r.add_argument("--method", default="rlm,direct",
                   help="comma-separated: rlm, rlm-d0, rlm-d2, direct, direct-trunc, "
                        "compaction, codeact-bm25; rlm-noex / codeact-bm25-noex: without the "
                        "system prompt's worked example (the ablation, on --split dev)")
    r.add_argument("-n", type=int, default=10, help="instances (seeds) per task and length")
    r.add_argument("--seed", type=int, default=0, help="first seed")
    r.add_argument("--seed-start", dest="seed", type=int, help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)                           # old name
    r.add_argument("--out", required=True, help="results directory (rows.jsonl, traces/)")
    r.add_argument("--parallel", dest="concurrency", type=int, default=4,
                   help="instances run at once (default 4)")
    from recursa.frontend.options import RLMOptions
    RLMOptions.add_to(r, skip_aliases=("--concurrency",))
    # old spelling of --parallel (here --concurrency always meant instances)
    r.add_argument("--concurrency", dest="concurrency", type=int, help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)
    r.add_argument("--depth", type=int, default=1, help="rlm recursion depth (rlm-dN overrides)")
    r.add_argument("--truncate", action="store_true",
                   help="direct: cut an input that does not fit the window (else: a failure)")
    r.add_argument("--window", type=int,
                   help="the model window in tokens, the same for every method: a local model "
                        "runs with this n_ctx (unless --n-ctx says otherwise) and direct refuses "
                        "inputs beyond it; default: the client's own (a local model's n_ctx)")
    r.add_argument("--split", choices=["dev", "test"], default="test",
                   help="held-out families: dev (for tuning prompts, examples, tips) or test "
                        "(the split published tables report; default)")
    r.add_argument("--baselines", default="grep,regex,constant,lexicon,embed,classifier",
                   help="no-model baselines run beside the methods on every instance "
                        "(comma-separated; default all: grep,regex,constant everywhere, "
                        "lexicon,embed,classifier on the real-label families)")
    r.add_argument("--no-baselines", action="store_true", help="run no baselines")
    r.add_argument("--sealed", metavar="LOG",
                   help="a sealed test split (e.g. docs/bench/sealed-seeds.json): refuse test "
                        "seeds not drawn in LOG and cells already run on them; log this run")
    r.add_argument("--chunk-tokens", type=int, default=2000, help="compaction window")
    r.add_argument("--passage-tokens", type=int, default=200, help="codeact-bm25 passage size")
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

    sd = bs.add_parser("seeds", help="the sealed test split's seeds log")
    sds = sd.add_subparsers(dest="seeds_cmd", required=True)
    dr = sds.add_parser("draw", help="draw a fresh block of test seeds and log it")
    dr.add_argument("--task", required=True, help="comma-separated task names")
    dr.add_argument("--lengths", required=True, help="comma-separated lengths (2048, 8k, ...)")
    dr.add_argument("-n", type=int, required=True, help="seeds in the block")
    dr.add_argument("--log", default="docs/bench/sealed-seeds.json", help="the seeds log")
    dr.add_argument("--note", default="", help="why (e.g. 'after the planner change X')")
    dr.set_defaults(fn=cmd_seeds_draw)


def cmd_run(a: argparse.Namespace) -> int:
    from recursa.base.types import RecursaError
    from recursa.core.preflight import check_options
    from recursa.frontend.failures import failure_reasons
    from recursa.frontend.lengths import parse_length
    from recursa.frontend.options import RLMOptions

    from .executors import executor_from_args
    from .runner import make_specs, run_bench

    try:
        opts = RLMOptions.from_args(a).with_default_model(
            say=lambda m: err.print(f"[yellow]{m}[/]"))
        lengths = [parse_length(x) for x in _csv(a.lengths)]
        configs, baselines = method_configs(a, opts)
        seeds = range(a.seed, a.seed + a.n)
        trace_dir = None if a.no_traces else str(_out(a.out) / "traces")
        specs = make_specs(_csv(a.task), lengths, seeds, configs, trace_dir, split=a.split,
                           baselines=baselines)
        # once, before any instance: a run that cannot work fails here, having spent nothing
        check_options(opts, say=lambda m: err.print(f"[dim]{m}[/]"))
        if a.sealed:
            _seal(a, specs)
    except (RecursaError, ValueError, KeyError, TypeError, OSError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    failures: list[dict[str, Any]] = []

    def keep_failure(row: dict[str, Any]) -> None:
        if row.get("status") == "error":
            failures.append(row)

    s = run_bench(specs, a.out, executor=executor_from_args(a),
                  retry_errors=a.retry_errors, progress=not a.no_progress, on_row=keep_failure)
    err.print(f"{s['ran']} run, {s['skipped']} already done, {s['errors']} errors; "
              f"rows in {_out(a.out) / 'rows.jsonl'}")
    if failures:
        err.print(f"[red]{len(failures)} of {s['ran']} rows failed[/] (rerun with --retry-errors "
                  "to redo them):")
        for why, n in failure_reasons(failures):
            err.print(f"  {n} x {why}")
        return 1
    return 0


def _seal(a: argparse.Namespace, specs: list[dict[str, Any]]) -> None:
    from .runner import code_version
    from .sealed import check_run, record_run
    if a.split != "test":
        raise ValueError("--sealed is for the test split (the dev split is for tuning)")
    commit = code_version()
    check_run(a.sealed, specs, str(a.out), commit)
    record_run(a.sealed, specs, str(a.out), commit)
    err.print(f"[dim]sealed: logged in {a.sealed} at {commit}[/]")


def cmd_seeds_draw(a: argparse.Namespace) -> int:
    from recursa.frontend.lengths import parse_length

    from .runner import code_version
    from .sealed import SealedError, draw_seeds
    from .tasks import get_task
    try:
        tasks = _csv(a.task)
        for t in tasks:
            get_task(t)
        lengths = [parse_length(x) for x in _csv(a.lengths)]
        e = draw_seeds(a.log, tasks, lengths, a.n, code_version(), a.note)
    except (SealedError, KeyError, ValueError, OSError) as ex:
        err.print(f"[red]error:[/] {ex}")
        return 2
    print(f"test seeds {e['seed']}-{e['seed'] + e['n'] - 1} drawn at {e['commit']} for "
          f"{', '.join(tasks)}; run them once with: recursa bench run --split test "
          f"--seed {e['seed']} -n {e['n']} --sealed {a.log} ...")
    return 0


def method_configs(a: argparse.Namespace, opts: Any) -> tuple[list[Any], list[str]]:
    """The MethodConfigs `bench run` asked for, and the baselines to run beside them. One
    window for every method: `--window` loads a local model with that n_ctx (unless
    --n-ctx says otherwise) and is the window `direct` checks inputs against."""
    from .baselines import BASELINES
    from .methods import MethodConfig, parse_method, split_worked_example
    client_options = dict(a.client_option)
    client_options.update(opts.client_options())
    window = a.window or client_options.get("n_ctx")
    if a.window and "n_ctx" not in client_options and any(
            (m or "").startswith("local:") for m in (opts.model, opts.sub_model)):
        client_options["n_ctx"] = a.window     # the local model really runs with it
    configs = []
    baselines = [] if a.no_baselines else _csv(a.baselines)
    for full_label in _csv(a.method):
        label, worked_example = split_worked_example(full_label)   # rlm-noex: the ablation
        name, depth, truncate = parse_method(label, a.depth, a.truncate)
        if name in BASELINES:        # asked for as a method: still a model-free baseline
            baselines += [name] if name not in baselines else []
            continue
        configs.append(MethodConfig(
            method=name, depth=depth, truncate=truncate, model=opts.model or "",
            sub_model=opts.sub_model, base_url=opts.base_url, sub_base_url=opts.sub_base_url,
            api_key_env=opts.api_key_env, sub_api_key_env=opts.sub_api_key_env,
            prices=opts.price_table(), sandbox=opts.sandbox, limits=opts.limits(),
            max_output_chars=opts.max_output_chars,
            subcall_concurrency=opts.subcall_concurrency, client_options=client_options,
            model_options=opts.model_options(), window_tokens=window,
            chunk_tokens=a.chunk_tokens, passage_tokens=a.passage_tokens, tips=a.tips,
            cache=opts.cache, worked_example=worked_example,
            # a bench method names its mode ("rlm" is code mode, "rlm-plan" or "rlm-auto"
            # the others): the library's default, auto, would make a row's method depend on
            # the model
            strategy="code" if opts.strategy == "auto" else opts.strategy))
    return configs, baselines


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
    from .baselines import BASELINES
    for m in METHODS:
        print(f"method  {m}")
    for b in BASELINES:
        print(f"baseline {b} (no model; run beside every method unless --no-baselines)")
    print("method  rlm-dN (depth N; rlm-d0: no sub-calls), direct-trunc")
    return 0
