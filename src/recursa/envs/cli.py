"""`recursa ablate` and `recursa export-sft` (registered by recursa.cli automatically)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

err = Console(stderr=True, highlight=False)


def register(sub: Any) -> None:
    from recursa.envs.base import ENVS, VARIANTS

    a = sub.add_parser("ablate", help="run environment variants side by side and report "
                       "reward, tokens, sub-calls and time")
    a.add_argument("--env", required=True, choices=sorted(ENVS))
    a.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS)}")
    a.add_argument("-n", type=int, default=10, help="rollouts per variant (same seeds for all)")
    a.add_argument("--seed", type=int, default=0, help="first seed")
    a.add_argument("--length", type=int, help="context length in tokens (env default if unset)")
    a.add_argument("--model", help="root model spec (default: as `recursa run`)")
    a.add_argument("--sub-model", help="sub-model spec (default: the root model)")
    a.add_argument("--sandbox", default="local", choices=["local", "inprocess"])
    a.add_argument("--concurrency", type=int, default=4,
                   help="rollouts in parallel (local executor)")
    a.add_argument("--max-iterations", type=int, default=10)
    a.add_argument("--max-subcalls", type=int)
    a.add_argument("--max-seconds", type=float, help="wall-time limit per rollout")
    a.add_argument("--turn-tokens", type=int, help="max_tokens of each root model reply")
    a.add_argument("--sub-tokens", type=int, help="max_tokens of each sub-model reply")
    a.add_argument("--temperature", type=float)
    a.add_argument("--out", default="ablation", help="directory for report.md, ablation.svg, "
                   "results.jsonl and traces/; a rerun skips rollouts already in results.jsonl")
    a.add_argument("--retry-errors", action="store_true", help="redo rollouts with status error")
    from recursa.bench.executors import add_executor_options
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
        from recursa.bench.executors import RayExecutor
        return RayExecutor(address=a.address, env_vars=a.ray_env, fn=run_rollout_spec,
                           on_error=failed_rollout)
    return LocalRolloutExecutor(a.concurrency)


def cmd_ablate(a: argparse.Namespace) -> int:
    from recursa.cli import resolve_model
    from recursa.envs.ablate import summarize, table, write_report
    from recursa.envs.base import get_env
    from recursa.envs.rollout import read_results, run_ablation

    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    try:
        env = get_env(a.env)
        model = resolve_model(a)
    except (KeyError, ValueError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    out = Path(a.out)
    results = out / "results.jsonl"
    root_opts = {k: v for k, v in (("max_tokens", a.turn_tokens),
                                   ("temperature", a.temperature)) if v is not None}
    sub_opts = {k: v for k, v in (("max_tokens", a.sub_tokens),
                                  ("temperature", a.temperature)) if v is not None}
    limits = {k: v for k, v in (("max_iterations", a.max_iterations),
                                ("max_subcalls", a.max_subcalls),
                                ("max_seconds", a.max_seconds)) if v is not None}
    done: list[Any] = []

    def progress(ro: Any) -> None:
        done.append(ro)
        err.print(f"[dim]{len(done)} new  {ro.variant:8s} seed {ro.seed}  "
                  f"reward {ro.reward:.2f}  {ro.status}  {ro.elapsed_s:.1f}s[/]")

    try:
        rollouts = run_ablation(
            env, variants, a.n, model=model, executor=rollout_executor(a), seed0=a.seed,
            results_path=results, retry_errors=a.retry_errors, on_done=progress,
            sub_model=a.sub_model, length_tokens=a.length, trace_dir=out / "traces",
            root_options=root_opts or None, sub_options=sub_opts or None, sandbox=a.sandbox,
            **limits)
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
    return 0


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
