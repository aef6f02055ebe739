"""The executor seam: something that maps JSON-able specs to rows, handing each row to
`on_row` in the calling process as it finishes (which appends it to a ResultsFile).

- `AsyncioExecutor`: `concurrency` specs at a time on one event loop in this process.
- `RayExecutor`: one Ray task per spec, on a local Ray instance or a cluster (`address`).
  How many run at once is Ray's decision: each task asks for `num_cpus` and Ray starts as many
  as the cluster's free CPUs allow; `max_in_flight` only bounds how many are submitted ahead.
  `max_retries` lets Ray redo a task whose worker or node died (system failures only: an
  exception inside `fn` is not retried). Two optional hooks let a caller (the batch budget)
  steer it: `admit(spec, in_flight)` is asked before each submission (False with nothing in
  flight stops the run; with tasks in flight it is asked again after the next one ends), and
  `retry(spec, message)` may return a spec to submit again when a task died.

`recursa bench run`, the env rollouts and `recursa batch` all use these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

from recursa.base.extras import MissingExtra

log = logging.getLogger("recursa.batch")

OnRow = Callable[[dict[str, Any]], None]
RunFn = Callable[[dict[str, Any]], dict[str, Any]]


class Executor(Protocol):
    """Runs specs, calling `on_row(row)` in the calling process as each one finishes."""

    def run(self, specs: list[dict[str, Any]], on_row: OnRow) -> None: ...


class AsyncioExecutor:
    """`concurrency` specs at a time on one event loop in this process."""

    def __init__(self, concurrency: int,
                 afn: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.afn = afn       # spec -> row

    def run(self, specs: list[dict[str, Any]], on_row: OnRow) -> None:
        asyncio.run(self.arun(specs, on_row))

    async def arun(self, specs: list[dict[str, Any]], on_row: OnRow) -> None:
        sem = asyncio.Semaphore(self.concurrency)

        async def one(spec: dict[str, Any]) -> None:
            async with sem:
                row = await self.afn(spec)
            on_row(row)

        await asyncio.gather(*(one(s) for s in specs))


def _warn_unauthenticated_local_ray() -> None:
    """A local Ray instance listens on every interface (Ray 2.60 has no way to bind it to
    loopback: it turns 127.0.0.1 into the machine's routable address); Ray 2.52+ protects it
    with token authentication unless RAY_AUTH_MODE says otherwise. Say so when it does."""
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    if mode and mode != "token":
        log.warning("recursa: the local Ray instance started for this batch listens on every "
                    "network interface, and RAY_AUTH_MODE=%s turns its token authentication "
                    "off: anyone who can reach this machine can run code in it. Unset "
                    "RAY_AUTH_MODE (or set it to token), or start Ray yourself and pass "
                    "--address.", mode)


def require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingExtra("ray", "the Ray executor", module="ray", detail=str(exc)) from None
    return ray


class RayExecutor:
    """Runs each spec as a Ray task calling `fn(spec) -> row`; see the module docstring.

    address: a cluster to join ("auto", "ray://host:10001", ...). None starts a local Ray
    instance for this run (and stops it after) unless Ray is already initialised in this
    process, in which case that instance is used and left running.
    env_vars: names of variables copied from this process into the tasks' environment (API
    keys for the models, e.g. OPENAI_API_KEY); a cluster's workers do not see the driver's.
    on_error(spec, message): the row for a task that died outside `fn` (after Ray's retries).
    """

    def __init__(self, address: str | None = None, *, fn: RunFn,
                 on_error: Callable[[dict[str, Any], str], dict[str, Any]],
                 num_cpus: float = 1.0, max_in_flight: int | None = None, max_retries: int = 0,
                 env_vars: Sequence[str] = (), runtime_env: dict[str, Any] | None = None,
                 init_options: dict[str, Any] | None = None,
                 admit: Callable[[dict[str, Any], int], bool] | None = None,
                 retry: Callable[[dict[str, Any], str], dict[str, Any] | None] | None = None):
        if num_cpus <= 0:
            raise ValueError("num_cpus must be positive")
        self.address = address
        self.num_cpus = num_cpus
        self.max_in_flight = max_in_flight
        self.max_retries = max_retries
        self.env_vars = list(env_vars)
        self.runtime_env = dict(runtime_env or {})
        self.init_options = dict(init_options or {})
        self.fn = fn              # any top-level spec -> row function
        self.on_error = on_error
        self.admit = admit
        self.retry = retry

    def _runtime_env(self) -> dict[str, Any] | None:
        env = dict(self.runtime_env)
        copied = {k: os.environ[k] for k in self.env_vars if k in os.environ}
        if copied:
            env["env_vars"] = {**env.get("env_vars", {}), **copied}
        return env or None

    @contextlib.contextmanager
    def connected(self) -> Iterator[Any]:
        """Ray, initialised for this run (joined, or started and stopped after)."""
        ray = require_ray()
        started_here = False
        if not ray.is_initialized():
            opts = {"include_dashboard": False, **self.init_options}
            if self.address is None:
                _warn_unauthenticated_local_ray()
            ray.init(address=self.address, **opts)
            started_here = True
        try:
            yield ray
        finally:
            if started_here:
                ray.shutdown()

    def run(self, specs: list[dict[str, Any]], on_row: OnRow) -> None:
        with self.connected() as ray:
            self._run(ray, specs, on_row)

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
                    if self.admit and not self.admit(todo[-1], len(pending)):
                        break
                    spec = todo.pop()
                    pending[task.remote(spec)] = spec
                if not pending:
                    break      # not admitted with nothing in flight: the caller stopped it
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    spec = pending.pop(ref)
                    try:
                        row = ray.get(ref)
                    except Exception as exc:   # the task died, not `fn` (that's a row)
                        log.warning("ray task for %s failed: %s", spec.get("key"), exc)
                        message = f"ray task failed: {type(exc).__name__}: {str(exc)[:1000]}"
                        again = self.retry(spec, message) if self.retry else None
                        if again is not None:
                            todo.append(again)
                            continue
                        row = self.on_error(spec, message)
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


def add_executor_options(parser: Any, what: str = "instances") -> None:
    """`--executor local|ray`, `--address`, `--ray-env` (bench run, envs, batch)."""
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help=f"local: --concurrency {what} on this machine's event loop; "
                             f"ray: one Ray task per {what[:-1]} (pip install 'recursa[ray]')")
    parser.add_argument("--address", default=None,
                        help="ray: the cluster to join (e.g. auto, ray://HOST:10001); "
                             "default: start a local Ray instance")
    parser.add_argument("--ray-env", action="append", default=[], metavar="NAME",
                        help="ray: copy this environment variable (e.g. an API key) into the "
                             "tasks; may be repeated")
