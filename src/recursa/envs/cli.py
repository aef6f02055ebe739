"""`recursa ablate` and `recursa export-sft` (registered by recursa.cli automatically)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

err = Console(stderr=True, highlight=False, soft_wrap=True)


def register(sub: Any) -> None:
    from recursa.envs.base import ENVS, VARIANTS

    a = sub.add_parser("ablate", help="run environment variants side by side and report "
                       "reward, tokens, sub-calls and time")
    a.add_argument("--env", required=True, choices=sorted(ENVS))
    a.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)}")
    a.add_argument("-n", type=int, default=10, help="rollouts per variant (same seeds for all)")
    a.add_argument("--seed", type=int, default=0, help="first seed")
    a.add_argument("--seed-start", dest="seed", type=int, help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)                      # bench run's old name
    a.add_argument("--lengths", help="context length in tokens, e.g. 4000 or 8k (one value; "
                   "default: the environment's)")
    a.add_argument("--length", dest="lengths", help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)                      # old name
    a.add_argument("--parallel", dest="concurrency", type=int, default=4,
                   help="rollouts run at once (local executor; default 4)")
    from recursa.frontend.options import RLMOptions
    RLMOptions.add_to(a, skip_aliases=("--concurrency",))
    a.add_argument("--concurrency", dest="concurrency", type=int, help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)   # old spelling of --parallel
    a.add_argument("--turn-tokens", type=int, help="max_tokens of each root model reply "
                   "(default: --max-answer-tokens)")
    a.add_argument("--sub-tokens", type=int, help="max_tokens of each sub-model reply "
                   "(default: --max-answer-tokens)")
    a.add_argument("--out", default="ablation", help="directory for report.md, ablation.svg, "
                   "results.jsonl and traces/; a rerun skips rollouts already in results.jsonl")
    a.add_argument("--retry-errors", action="store_true", help="redo rollouts with status error")
    from recursa.core.batch.executors import add_executor_options
    add_executor_options(a)     # --executor local|ray, --address, --ray-env (as bench run)
    a.set_defaults(fn=cmd_ablate)

    e = sub.add_parser("export-sft", help="turn traces of scored runs into chat-format "
                       "fine-tuning data (JSONL)")
    e.add_argument("traces", nargs="+", help="trace files or directories of them")
    e.add_argument("--out", required=True, help="output JSONL file")
    e.add_argument("--min-reward", type=float, default=1.0,
                   help="keep runs whose recorded reward is at least this (default 1.0)")
    e.add_argument("--strip-tips", action="store_true", help="remove <tips>...</tips>")
    e.add_argument("--subcalls", action="store_true",
                   help="also export each sub-model call as its own example")
    e.add_argument("--include-unscored", action="store_true",
                   help="keep runs that have no recorded reward")
    e.add_argument("--meta", action="store_true",
                   help="add a `meta` field (run id, reward, env, variant) to each line")
    e.set_defaults(fn=cmd_export_sft)


def rollout_executor(a: argparse.Namespace) -> Any:
    """The executor `--executor` asked for: the local event loop (--concurrency at a time) or
    one Ray task per rollout."""
    from recursa.envs.rollout import LocalRolloutExecutor, failed_rollout, run_rollout_spec
    if a.executor == "ray":
        from recursa.core.batch.executors import RayExecutor
        return RayExecutor(address=a.address, env_vars=a.ray_env, fn=run_rollout_spec,
                           on_error=failed_rollout)
    return LocalRolloutExecutor(a.concurrency)


def cmd_ablate(a: argparse.Namespace) -> int:
    from recursa.base.types import RecursaError
    from recursa.core.preflight import check_options
    from recursa.envs.ablate import summarize, table, write_report
    from recursa.envs.base import get_env
    from recursa.envs.rollout import read_results, run_ablation
    from recursa.frontend.options import RLMOptions

    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    try:
        env = get_env(a.env)
        opts = RLMOptions.from_args(a).with_default_model(
            say=lambda m: err.print(f"[yellow]{m}[/]"))
        length = _one_length(a.lengths)
        check_options(opts, say=lambda m: err.print(f"[dim]{m}[/]"))
    except (RecursaError, KeyError, ValueError, OSError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    assert opts.model is not None   # with_default_model filled it in
    out = Path(a.out)
    results = out / "results.jsonl"
    reply = opts.model_options()
    root_opts = {**reply, **({"max_tokens": a.turn_tokens} if a.turn_tokens else {})}
    sub_opts = {**reply, **({"max_tokens": a.sub_tokens} if a.sub_tokens else {})}
    done: list[Any] = []

    def progress(ro: Any) -> None:
        done.append(ro)
        err.print(f"[dim]{len(done)} new  {ro.variant:8s} seed {ro.seed}  "
                  f"reward {ro.reward:.2f}  {ro.status}  {ro.elapsed_s:.1f}s[/]")

    try:
        rollouts = run_ablation(
            env, variants, a.n, model=opts.model, executor=rollout_executor(a), seed0=a.seed,
            results_path=results, retry_errors=a.retry_errors, on_done=progress,
            sub_model=opts.sub_model, length_tokens=length, trace_dir=out / "traces",
            root_options=root_opts or None, sub_options=sub_opts or None, sandbox=opts.sandbox,
            rlm_options=opts.to_dict(), **opts.limits())
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted[/]: {len(done)} new rollouts in {results}; "
                  "rerun the command to resume")
        rollouts = [r for r in (read_results(results) if results.exists() else [])
                    if r.env == env.name and r.variant in variants]
    except ValueError as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    else:
        err.print(f"{len(done)} run, {len(rollouts) - len(done)} already in {results}")
    command = "recursa " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    report = write_report(rollouts, out, env=env.name, command=command, variants=variants)
    print(table(summarize(rollouts, variants)))
    err.print(f"report: {report}  chart: {out / 'ablation.svg'}")
    failed = [r for r in done if r.status == "error"]
    if failed:
        from recursa.frontend.failures import failure_reasons
        err.print(f"[red]{len(failed)} of {len(done)} rollouts failed[/] (rerun with "
                  "--retry-errors to redo them):")
        for why, n in failure_reasons([{"error": r.error} for r in failed]):
            err.print(f"  {n} x {why}")
        return 1
    return 0


def _one_length(text: str | None) -> int | None:
    if not text:
        return None
    from recursa.frontend.lengths import parse_length
    parts = [x for x in text.split(",") if x.strip()]
    if len(parts) != 1:
        raise ValueError(f"--lengths {text}: ablate takes one length (run it once per length)")
    return parse_length(parts[0])


def cmd_export_sft(a: argparse.Namespace) -> int:
    from recursa.envs.sft import export_sft
    try:
        stats = export_sft(a.traces, a.out, min_reward=a.min_reward, strip=a.strip_tips,
                           subcalls=a.subcalls, include_unscored=a.include_unscored,
                           meta=a.meta)
    except (OSError, ValueError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    err.print(f"runs read {stats.runs}  kept {stats.kept_runs}  examples {stats.examples} "
              f"(root {stats.root_examples}, sub {stats.sub_examples})  duplicates dropped "
              f"{stats.duplicates}  skipped: low reward {stats.low_reward}, unscored "
              f"{stats.unscored}, unusable {stats.unusable}")
    print(a.out)
    return 0
