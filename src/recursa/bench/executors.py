"""Executors beyond the local event loop: `RayExecutor` fans bench instances out as Ray tasks.

    run_bench(specs, out_dir, executor=RayExecutor(address="auto"))

One Ray task per instance (one RLM run, or one baseline run): the task calls the runner's
top-level `run_instance(spec) -> row` in a Ray worker and the row comes back to the driver,
which appends it to the same results file through the same `on_row` as the local executor.
Resume, the progress bar and the report are therefore unchanged. How many instances run at
once is Ray's decision: each task asks for `num_cpus` (default 1) and Ray starts as many as
the cluster's free CPUs allow; `max_in_flight` only bounds how many are submitted ahead.

Trace files are written by the worker that ran the instance, on its machine: on a cluster of
several machines put `--out` on storage they share, or the rows' `trace_path`s point at
files on other hosts.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from typing import Any

from recursa.core.batch.executors import RayExecutor as _RayExecutor
from recursa.core.batch.executors import (
    RunFn,
    add_executor_options,  # noqa: F401 (bench run, envs)
)
from recursa.core.batch.executors import require_ray as _require_ray  # noqa: F401 (its old home)

from .methods import method_label
from .runner import SCHEMA_VERSION, row_key, run_instance


def failed_row(spec: dict[str, Any], error: str) -> dict[str, Any]:
    """A row for an instance whose task died outside `run_instance` (a worker crash, a lost
    node, a cancelled task): counted as an error, redone by --retry-errors."""
    cfg = spec.get("config") or {}
    method = method_label(cfg.get("method", "?"), cfg.get("depth", 1), cfg.get("truncate", False),
                          cfg.get("worked_example", True))
    model = cfg.get("model") or "?"
    now = time.time()
    return {
        "schema": SCHEMA_VERSION,
        "key": spec.get("key") or row_key(spec["task"], spec["length"], spec["seed"], method,
                                          model, spec.get("split")),
        "task": spec["task"], "length": spec["length"], "seed": spec["seed"],
        "method": method, "model": model, "sub_model": cfg.get("sub_model") or model,
        "split": spec.get("split"), "answer": "", "answer_chars": 0, "gold": None, "gold_chars": 0,
        "score": 0.0, "metrics": {}, "status": "error", "error": error, "limit": None,
        "cost_usd": None, "root_input_tokens": 0, "root_output_tokens": 0,
        "sub_input_tokens": 0, "sub_output_tokens": 0, "tokens": 0, "turns": 0,
        "subcalls": 0, "wall_s": 0.0, "trace_path": None, "started_at": now,
        "finished_at": now, "host": platform.node(),
    }


class RayExecutor(_RayExecutor):
    """Runs each spec as a Ray task (recursa.core.batch.executors.RayExecutor), by default the
    bench's `run_instance`, with `failed_row` for a task that died; see the module docstring."""

    def __init__(self, address: str | None = None, *, fn: RunFn = run_instance,
                 on_error: Callable[[dict[str, Any], str], dict[str, Any]] = failed_row,
                 **options: Any):
        super().__init__(address, fn=fn, on_error=on_error, **options)


def executor_from_args(a: Any) -> Any:
    """The executor `add_executor_options` asked for."""
    if getattr(a, "executor", "local") == "ray":
        return RayExecutor(address=a.address, env_vars=a.ray_env)
    from .runner import AsyncioExecutor
    return AsyncioExecutor(a.concurrency)
