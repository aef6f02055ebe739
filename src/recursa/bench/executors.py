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

import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from recursa.extras import MissingExtra

from .methods import method_label
from .runner import SCHEMA_VERSION, OnRow, row_key, run_instance

log = logging.getLogger("recursa.bench")

RunFn = Callable[[dict[str, Any]], dict[str, Any]]


def _require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingExtra("ray", "the Ray executor", module="ray", detail=str(exc)) from None
    return ray


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


class RayExecutor:
    """Runs each spec as a Ray task; see the module docstring.

    address: a cluster to join ("auto", "ray://host:10001", ...). None starts a local Ray
    instance for this run (and stops it after) unless Ray is already initialised in this
    process, in which case that instance is used and left running.
    env_vars: names of variables copied from this process into the tasks' environment (API
    keys for the models, e.g. OPENAI_API_KEY); a cluster's workers do not see the driver's.
    """

    def __init__(self, address: str | None = None, *, num_cpus: float = 1.0,
                 max_in_flight: int | None = None, max_retries: int = 0,
                 env_vars: Sequence[str] = (), runtime_env: dict[str, Any] | None = None,
                 init_options: dict[str, Any] | None = None, fn: RunFn = run_instance,
                 on_error: Callable[[dict[str, Any], str], dict[str, Any]] = failed_row):
        if num_cpus <= 0:
            raise ValueError("num_cpus must be positive")
        self.address = address
        self.num_cpus = num_cpus
        self.max_in_flight = max_in_flight
        self.max_retries = max_retries
        self.env_vars = list(env_vars)
        self.runtime_env = dict(runtime_env or {})
        self.init_options = dict(init_options or {})
        self.fn = fn              # any top-level spec -> row function (e.g. an env rollout)
        self.on_error = on_error  # the row for a task that died outside `fn`

    def _runtime_env(self) -> dict[str, Any] | None:
        env = dict(self.runtime_env)
        copied = {k: os.environ[k] for k in self.env_vars if k in os.environ}
        if copied:
            env["env_vars"] = {**env.get("env_vars", {}), **copied}
        return env or None

    def run(self, specs: list[dict[str, Any]], on_row: OnRow) -> None:
        ray = _require_ray()
        started_here = False
        if not ray.is_initialized():
            opts = {"include_dashboard": False, **self.init_options}
            ray.init(address=self.address, **opts)
            started_here = True
        try:
            self._run(ray, specs, on_row)
        finally:
            if started_here:
                ray.shutdown()

    def _run(self, ray: Any, specs: list[dict[str, Any]], on_row: OnRow) -> None:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": self.max_retries}
        renv = self._runtime_env()
        if renv:
            opts["runtime_env"] = renv
        task = ray.remote(**opts)(self.fn)
        # Submitting everything at once would work, but a bounded window keeps a huge run's
        # object store small and lets Ctrl-C cancel little.
        window = self.max_in_flight or max(
            2, 2 * int(ray.cluster_resources().get("CPU", 1) // self.num_cpus))
        todo = list(reversed(specs))
        pending: dict[Any, dict[str, Any]] = {}
        try:
            while todo or pending:
                while todo and len(pending) < window:
                    spec = todo.pop()
                    pending[task.remote(spec)] = spec
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    spec = pending.pop(ref)
                    try:
                        row = ray.get(ref)
                    except Exception as exc:   # the task died, not the method (that's a row)
                        log.warning("ray task for %s failed: %s", spec.get("key"), exc)
                        row = self.on_error(spec, f"ray task failed: {type(exc).__name__}: "
                                                  f"{str(exc)[:1000]}")
                    on_row(row)
        except BaseException:
            # Ctrl-C or an on_row failure: finished rows are already on disk; stop the rest
            # so a resume redoes exactly the unfinished ones.
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception as exc:
                    log.debug("could not cancel a ray task: %r", exc)
            raise


def add_executor_options(parser: Any) -> None:
    """`--executor local|ray`, `--address`, `--ray-env` for `recursa bench run`."""
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="local: --concurrency instances on this machine's event loop; "
                             "ray: one Ray task per instance (pip install 'recursa[ray]')")
    parser.add_argument("--address", default=None,
                        help="ray: the cluster to join (e.g. auto, ray://HOST:10001); "
                             "default: start a local Ray instance")
    parser.add_argument("--ray-env", action="append", default=[], metavar="NAME",
                        help="ray: copy this environment variable (e.g. an API key) into the "
                             "tasks; may be repeated")


def executor_from_args(a: Any) -> Any:
    """The executor `add_executor_options` asked for."""
    if getattr(a, "executor", "local") == "ray":
        return RayExecutor(address=a.address, env_vars=a.ray_env)
    from .runner import AsyncioExecutor
    return AsyncioExecutor(a.concurrency)
