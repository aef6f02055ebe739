"""Run many (task, length, seed, method) instances, one JSONL row each, resumably.

Two pieces, split so another executor (Ray) can slot in:

- `run_instance(spec) -> row` is a plain top-level function of a JSON-serialisable dict: it
  generates the instance, runs the method, scores it, and always returns a row (a crash inside a
  method is a row with status `error`). `arun_instance` is its async twin.
- An executor (recursa.core.batch.executors, shared with `recursa batch`) maps specs to rows and
  hands each row to `on_row` in the driver process, which appends it to the results file
  (recursa.core.batch.rowfile: flush + fsync per row). `AsyncioExecutor` runs `concurrency`
  instances at a time on one event loop; `RayExecutor` (bench.executors) one Ray task each.

Resume: rows are keyed by task/length/seed/method/model; a run skips keys already in the file.
A torn last line (the process was killed mid-write) is cut off when the file is reopened.
"""

from __future__ import annotations

import asyncio
import functools
import json
import platform
import re
import subprocess
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from recursa.base.types import Result

# the executor seam and the results file are shared with `recursa batch`; imported here under
# their old names (envs, ablation and user code import them from this module)
from recursa.core.batch.executors import AsyncioExecutor as _AsyncioExecutor
from recursa.core.batch.executors import Executor, OnRow  # noqa: F401
from recursa.core.batch.rowfile import ResultsFile
from recursa.frontend.lengths import format_length, parse_length  # noqa: F401 (bench's names)

from .methods import MethodConfig, run_method
from .tasks import get_task

ROWS_FILE = "rows.jsonl"
ANSWER_CHARS = 4000      # answers and golds are kept in rows up to this size (with their length)
SCHEMA_VERSION = 1


def row_key(task: str, length: int, seed: int, method: str, model: str,
            split: str | None = None) -> str:
    """A row's identity. Test-split rows (and rows of families without a split) keep the
    original five-part key, so results files written before the split existed still resume;
    dev rows get a sixth part."""
    key = f"{task}|{length}|{seed}|{method}|{model}"
    return key + "|dev" if split == "dev" else key


def make_specs(tasks: Iterable[str], lengths: Iterable[int], seeds: Iterable[int],
               configs: Iterable[MethodConfig], trace_dir: str | None,
               task_options: dict[str, Any] | None = None, split: str | None = None,
               baselines: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The run specs, ordered so that every method of an instance runs close together (a
    partial run then compares methods on the same instances). ``split`` (dev / test) goes to
    the held-out families; ``baselines`` (grep, regex, constant) run beside the methods on every
    instance, filed under the model "none" so every model's run shares them."""
    from .baselines import BASELINE_MODEL, BASELINES
    from .record_baselines import applies
    from .tasks import SPLIT_FAMILIES
    from .tasks.split import check_split
    specs = []
    cfgs = list(configs)
    for b in baselines:
        if b not in BASELINES:
            raise ValueError(f"unknown baseline {b!r}; known: {', '.join(BASELINES)}")
        cfgs.append(MethodConfig(method=b, model=BASELINE_MODEL))
    for task in tasks:
        # a record-labelling baseline runs only on the families whose records it can read
        task_cfgs = [c for c in cfgs if c.model != BASELINE_MODEL or applies(c.method, task)]
        get_task(task)   # fail early on an unknown name
        opts = dict(task_options or {})
        task_split: str | None = None
        if split is not None:
            task_split = check_split(split)
            if task in SPLIT_FAMILIES:
                opts["split"] = task_split
            elif task_split == "dev":
                raise ValueError(f"task {task!r} has no dev/test split (only "
                                 f"{', '.join(SPLIT_FAMILIES)} do); run it without --split dev")
            else:
                task_split = None
        for length in lengths:
            for seed in seeds:
                for cfg in task_cfgs:
                    specs.append({"task": task, "length": int(length), "seed": int(seed),
                                  "config": cfg.model_dump(), "trace_dir": trace_dir,
                                  "task_options": opts, "split": task_split,
                                  "key": row_key(task, length, seed, cfg.label, cfg.model,
                                                 task_split)})
    return specs


@functools.cache
def code_version() -> str:
    """recursa's version, plus `git describe --always --dirty` when run from a checkout, so a
    row says which code produced it (runs of one results file may span commits)."""
    from recursa.obs.trace import _library_version
    version = _library_version()
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).resolve().parent)
        if out.returncode == 0 and out.stdout.strip():
            return f"{version}+{out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return version


def _trace_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key.replace("|", "__")) + ".jsonl"


def _usage(res: Result, *roles: str) -> tuple[int, int]:
    inp = sum(res.usage[r].usage.input_tokens for r in roles if r in res.usage)
    out = sum(res.usage[r].usage.output_tokens for r in roles if r in res.usage)
    return inp, out


def _cut(value: Any) -> tuple[Any, int]:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= ANSWER_CHARS:
        return value, len(text)
    return text[:ANSWER_CHARS] + " ...[cut]", len(text)


async def arun_instance(spec: dict[str, Any]) -> dict[str, Any]:
    """Generate, run, score one instance; always returns a row."""
    started = time.time()
    t0 = time.monotonic()
    cfg = MethodConfig.model_validate(spec["config"])
    task = get_task(spec["task"])
    split = spec.get("split")
    row: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "key": spec.get("key") or row_key(
            spec["task"], spec["length"], spec["seed"], cfg.label, cfg.model, split),
        "task": spec["task"], "length": spec["length"], "seed": spec["seed"],
        "method": cfg.label, "model": cfg.model, "sub_model": cfg.sub_model or cfg.model,
        "split": split,
    }
    trace_path = None
    from .baselines import BASELINES
    if spec.get("trace_dir") and cfg.method not in BASELINES:    # a baseline has no trace
        trace_path = str(Path(spec["trace_dir"]) / _trace_name(row["key"]))
        Path(trace_path).unlink(missing_ok=True)   # a half-written trace of an earlier attempt
    res: Result | None = None
    try:
        # generation is CPU-bound pure Python (up to seconds at 1M tokens): keep the loop free
        inst = await asyncio.to_thread(task.generate, spec["seed"], spec["length"],
                                       **spec.get("task_options", {}))
        row["instance_id"] = inst.id
        row["query"] = inst.query
        res = await run_method(cfg, inst, trace_path, seed=spec["seed"])
        sc = task.score(res.answer, inst)
        score, metrics = sc.score, sc.metrics
        gold = inst.gold
    except Exception as e:   # a method or scorer bug is a failed row, never a lost run
        score, metrics, gold = 0.0, {}, row.get("gold")
        err = f"{type(e).__name__}: {e}"
        if res is None:
            res = Result(answer="", status="error", error=err)
        else:
            res.error = f"scoring failed: {err}"
        row["traceback"] = traceback.format_exc()[-2000:]
    root_in, root_out = _usage(res, "root")
    sub_in, sub_out = _usage(res, "sub", "child")
    row["answer"], row["answer_chars"] = _cut(res.answer)
    row["gold"], row["gold_chars"] = _cut(gold)
    row.update({
        "score": score, "metrics": metrics, "status": res.status, "error": res.error,
        "limit": res.limit, "cost_usd": res.cost_usd,
        "root_input_tokens": root_in, "root_output_tokens": root_out,
        "sub_input_tokens": sub_in, "sub_output_tokens": sub_out,
        "tokens": root_in + root_out + sub_in + sub_out,
        "turns": res.turns, "subcalls": res.subcalls, "cache_hits": res.cache_hits,
        "sources": len(res.sources), "sources_verified": res.sources_verified,
        "wall_s": round(time.monotonic() - t0, 3),
        "trace_path": trace_path, "started_at": started, "finished_at": time.time(),
        "host": platform.node(), "code_version": code_version(),
    })
    return row


def run_instance(spec: dict[str, Any]) -> dict[str, Any]:
    """Blocking, picklable entry point: what a Ray task (or a process pool) would call."""
    return asyncio.run(arun_instance(spec))


# ---------------------------------------------------------------- results file
def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a results file or of every *.jsonl directly in a directory (last per key)."""
    p = Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    rows: dict[str, dict[str, Any]] = {}
    for f in files:
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue    # a torn last line
            if isinstance(row, dict) and "key" in row and "score" in row:
                rows[row["key"]] = row
    return list(rows.values())


# ---------------------------------------------------------------- executors
class AsyncioExecutor(_AsyncioExecutor):
    """`concurrency` instances at a time on one event loop in this process."""

    def __init__(self, concurrency: int = 4,
                 afn: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None):
        # spec -> row; the ablation runner passes its own
        super().__init__(concurrency, afn or arun_instance)


# ---------------------------------------------------------------- the run
def run_bench(specs: list[dict[str, Any]], out_dir: str | Path, *,
              executor: Executor | None = None, retry_errors: bool = False,
              progress: bool = True, on_row: OnRow | None = None) -> dict[str, Any]:
    """Run the specs not already done in out_dir/rows.jsonl; returns counts."""
    out = Path(out_dir)
    results = ResultsFile(out / ROWS_FILE)
    done = results.done(retry_errors)
    todo = [s for s in specs if s["key"] not in done]
    executor = executor or AsyncioExecutor()
    summary = {"total": len(specs), "skipped": len(specs) - len(todo), "ran": 0, "errors": 0}
    bar: Any = None
    task_id: Any = None
    scores: list[float] = []
    if progress and todo:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        bar = Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn(),
                       TextColumn("{task.fields[info]}"), console=Console(stderr=True))
        bar.start()
        task_id = bar.add_task("bench", total=len(todo), info="")

    def record(row: dict[str, Any]) -> None:
        results.append(row)      # durable before anything else looks at it
        summary["ran"] += 1
        summary["errors"] += row.get("status") == "error"
        scores.append(float(row.get("score") or 0.0))
        if bar is not None:
            bar.update(task_id, advance=1, info=(
                f"mean {sum(scores) / len(scores):.2f}  errors {summary['errors']}  "
                f"last {row['method']} {row['task']}-{format_length(row['length'])} "
                f"s{row['seed']}: {row['score']:.2f} ({row['status']})"))
        if on_row is not None:
            on_row(row)

    try:
        if todo:
            executor.run(todo, record)
    finally:
        if bar is not None:
            bar.stop()
        results.close()
    return summary

