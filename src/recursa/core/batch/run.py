"""The batch core: run items with bounded concurrency under one batch budget, here or on Ray.

One async core, `aiter_batch`, yields an `ItemResult` per item as it finishes; `abatch`
collects them in item order; `iter_batch` / `batch` are the blocking twins. Each item is one
`RLM.acompletion`; an item whose run raised becomes an error Result, so one failure never stops
the rest. With a `BatchBudget`, each item attempt reserves its worst case in a BatchLedger
before it starts (recursa.core.batch.ledger): when the budget cannot cover another item, no new
item starts, what runs finishes, and the items never started come back with `result=None`.

`executor=RayBatchExecutor(...)` runs each item as a Ray task (the sandbox and the model
clients live on the worker); the ledger is one actor on the driver's node; a task whose worker
or node died is settled as lost with the spend it last reported and retried as a new attempt.
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import platform
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recursa.base.types import Event, Result

from .items import BatchItem, load_item_context, make_items
from .ledger import BatchBudget, BatchLedger, RemoteLedger, item_caps, ray_ledger
from .rows import error_result, item_row, row_cut, spend_of

if TYPE_CHECKING:
    from recursa.core.rlm import RLM


@dataclass
class ItemResult:
    """One item's outcome. `result` None: the batch budget stopped the batch before it
    started (`row` None too); otherwise `row` is what `recursa batch` writes."""

    item: BatchItem
    result: Result | None
    row: dict[str, Any] | None = None
    attempt: int = 0


@dataclass
class BatchResult(Sequence[Result | None]):
    """Results in item order (None: never started) and the batch's totals in `summary`."""

    items: list[BatchItem]
    results: list[Result | None]
    summary: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, i: Any) -> Any:
        return self.results[i]

    def __len__(self) -> int:
        return len(self.results)


# ---------------------------------------------------------------- one item
class SpendReporter:
    """A trace sink that tells the ledger what a running attempt has spent so far, so a
    worker that dies mid-item still leaves its spend counted."""

    def __init__(self, ledger: Any, key: str, attempt: int):
        self.ledger, self.key, self.attempt = ledger, key, attempt
        self.inp = self.out = 0
        self.cost: float | None = 0.0

    def emit(self, ev: Event) -> None:
        d = ev.data
        counted = ((ev.kind == "turn" and (ev.phase == "update"
                                           or (ev.phase == "end" and d.get("last"))))
                   or (ev.kind == "subcall" and ev.phase == "end"))
        if not counted or not d.get("usage"):
            return
        u = d["usage"]
        self.inp += int(u.get("input_tokens", 0))
        self.out += int(u.get("output_tokens", 0))
        c = d.get("cost_usd")
        self.cost = None if c is None or self.cost is None else self.cost + c
        self.ledger.report(self.key, self.attempt, input_tokens=self.inp,
                           output_tokens=self.out, cost=self.cost)

    def close(self) -> None:
        pass


def _limits_now(caps: dict[str, Any], ledger: Any) -> dict[str, Any]:
    """The item's limits, its time cut to what the batch has left."""
    limits = dict(caps)
    left = ledger.remaining_seconds()
    if left is not None:
        limits["max_seconds"] = max(0.001, min(limits.get("max_seconds") or math.inf, left))
    return limits


async def run_attempt(rlm: RLM, item: BatchItem, attempt: int, ledger: Any,
                      caps: dict[str, Any], output: Any) -> ItemResult:
    """One attempt of one item: the run, its settlement in the ledger, its row."""
    started, t0 = time.time(), time.monotonic()
    try:
        res = await rlm.acompletion(item.query, item.context, output=output,
                                    **_limits_now(caps, ledger))
    except Exception as e:      # bad context, preflight...: this item's error row
        res = error_result(f"{type(e).__name__}: {e}")
    inp, out, cost = spend_of(res)
    ledger.settle(item.key, attempt, input_tokens=inp, output_tokens=out, cost=cost)
    row = item_row(item, res, attempt=attempt, started_at=started,
                   wall_s=time.monotonic() - t0)
    return ItemResult(item, res, row, attempt)


# ---------------------------------------------------------------- the local executor
async def _run_local(rlm: RLM, items: list[BatchItem], ledger: BatchLedger,
                     caps: dict[str, Any], output: Any, concurrency: int,
                     emit: Callable[[ItemResult], None]) -> None:
    todo = deque(items)
    running: set[asyncio.Task[ItemResult]] = set()
    try:
        while todo or running:
            while todo and len(running) < concurrency and not ledger.stopped:
                attempt, _ = ledger.reserve(todo[0].key, final=not running)
                if attempt is None:
                    break       # wait for a running item to settle, or stopped
                item = todo.popleft()
                running.add(asyncio.create_task(
                    run_attempt(rlm, item, attempt, ledger, caps, output)))
            if not running:
                break
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                emit(t.result())
    finally:
        for t in running:
            t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    for item in todo:
        emit(ItemResult(item, None))


# ---------------------------------------------------------------- the Ray executor
class RayBatchExecutor:
    """Items as Ray tasks on a local Ray instance or a cluster (`address`, e.g. "auto" or
    "ray://HOST:10001"). The RLM is shipped to the workers (give models as spec strings; API
    keys by name in `env_vars`, copied into the tasks' environment); contexts given as paths
    are read on the driver (recursa.core.context.load_path) and shipped, so workers need no shared
    storage. `retries`: how many times an item whose worker or node died is tried again.
    `runtime_env`, `init_options`: passed to Ray."""

    def __init__(self, address: str | None = None, *, num_cpus: float = 1.0, retries: int = 2,
                 max_in_flight: int | None = None, env_vars: Sequence[str] = (),
                 runtime_env: dict[str, Any] | None = None,
                 init_options: dict[str, Any] | None = None):
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.address, self.num_cpus, self.retries = address, num_cpus, retries
        self.max_in_flight = max_in_flight
        self.env_vars, self.runtime_env = list(env_vars), dict(runtime_env or {})
        self.init_options = dict(init_options or {})
        self.last_ledger: dict[str, Any] | None = None   # the actor's final snapshot

    def run(self, rlm: RLM, items: list[BatchItem], budget: BatchBudget, ledger_kw: dict[str, Any],
            caps: dict[str, Any], output: Any, emit: Callable[[ItemResult], None]) -> None:
        from .executors import RayExecutor
        by_key = {it.key: it for it in items}
        ex = RayExecutor(self.address, fn=run_ray_item, on_error=_ray_failed,
                         num_cpus=self.num_cpus, max_in_flight=self.max_in_flight,
                         max_retries=0,     # retries are ours: each one a new, settled attempt
                         env_vars=self.env_vars, runtime_env=self.runtime_env,
                         init_options=self.init_options)
        with ex.connected() as ray:
            handle = ray_ledger(ray, budget, **ledger_kw)
            ledger = RemoteLedger(handle)
            rlm_ref = ray.put(rlm)
            started: set[str] = set()

            def admit(spec: dict[str, Any], in_flight: int) -> bool:
                attempt, _ = ledger.reserve(spec["key"], final=in_flight == 0)
                if attempt is None:
                    return False
                spec["attempt"] = attempt
                if "item" not in spec:       # read the context only when it is about to run
                    item = copy.copy(by_key[spec["key"]])
                    item.context = load_item_context(item.context)
                    spec.update(item=item, rlm=rlm_ref, ledger=handle, output=output,
                                caps=caps)
                started.add(spec["key"])
                return True

            def retry(spec: dict[str, Any], message: str) -> dict[str, Any] | None:
                ledger.lost(spec["key"], spec["attempt"])
                return spec if spec["attempt"] <= self.retries else None

            def on_row(out: dict[str, Any]) -> None:
                item = by_key[out["key"]]
                res = out["result"]
                row = item_row(item, res, attempt=out["attempt"], host=out.get("host"),
                               started_at=out.get("started_at"), wall_s=out.get("wall_s"))
                # where it ran (None: every attempt died with its worker)
                row["ray_node"], row["ray_pid"] = out.get("node"), out.get("pid")
                emit(ItemResult(item, res, row, out["attempt"]))

            ex.admit, ex.retry = admit, retry
            try:
                ex._run(ray, [{"key": it.key} for it in items], on_row)
            finally:
                self.last_ledger = ledger.snapshot()
                ray.kill(handle)
            for it in items:
                if it.key not in started:
                    emit(ItemResult(it, None))


def run_ray_item(spec: dict[str, Any]) -> dict[str, Any]:
    """A Ray task: one attempt of one item on this worker, settled in the ledger actor here
    (so its spend counts even if the reply never reaches the driver)."""
    import ray
    rlm = spec["rlm"]
    if isinstance(rlm, ray.ObjectRef):
        rlm = ray.get(rlm)
    ledger = RemoteLedger(spec["ledger"])
    item, attempt = spec["item"], spec["attempt"]
    rlm = copy.copy(rlm)
    rlm.sinks = [*rlm.sinks, SpendReporter(ledger, item.key, attempt)]
    started, t0 = time.time(), time.monotonic()
    res = asyncio.run(run_attempt(rlm, item, attempt, ledger, spec["caps"],
                                  spec["output"])).result
    return {"key": item.key, "attempt": attempt, "result": res, "host": platform.node(),
            "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
            "started_at": started,
            "wall_s": round(time.monotonic() - t0, 3)}


def _ray_failed(spec: dict[str, Any], message: str) -> dict[str, Any]:
    """The outcome of an item whose every attempt died with its worker."""
    return {"key": spec["key"], "attempt": spec.get("attempt", 0),
            "result": error_result(message)}


# ---------------------------------------------------------------- the entry points
def _prepare(rlm: RLM, items: Any, query: str | None, contexts: Any, column: str | None,
             budget: BatchBudget | dict[str, Any] | None, concurrency: int,
             limits: dict[str, Any]) -> tuple[list[BatchItem], BatchBudget, dict[str, Any],
                                              dict[str, Any]]:
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    from recursa.core.budget import Budget
    unknown = set(limits) - set(Budget.model_fields)
    if unknown:
        raise TypeError(f"unknown limit(s): {', '.join(sorted(unknown))}")
    its = items if isinstance(items, list) and all(isinstance(i, BatchItem) and i.key
                                                  for i in items) \
        else make_items(items, query=query, contexts=contexts, column=column)
    b = budget if isinstance(budget, BatchBudget) else BatchBudget.model_validate(budget or {})
    per_item = {k: v for k, v in rlm.budget.model_dump().items()
                if k in ("max_cost_usd", "max_tokens", "max_seconds") and v is not None}
    caps, tokens, cost = item_caps(b, {**per_item, **limits}, concurrency)
    return its, b, caps, {"item_tokens": tokens, "item_cost": cost}


async def aiter_batch(rlm: RLM, items: Iterable[Any] | None = None, *, query: str | None = None,
                      contexts: Any = None, column: str | None = None,
                      concurrency: int = 4, budget: BatchBudget | dict[str, Any] | None = None,
                      output: Any = None, executor: RayBatchExecutor | None = None,
                      summary: dict[str, Any] | None = None,
                      **limits: Any) -> AsyncIterator[ItemResult]:
    """Run the items, yielding each ItemResult as it finishes (items the budget never
    started come last, with result None). `limits` are per item (as `acompletion` takes);
    `budget` caps the batch. `summary`, if given, is filled with the batch's totals."""
    its, b, caps, ledger_kw = _prepare(rlm, items, query, contexts, column, budget,
                                       concurrency, limits)
    t0 = time.monotonic()
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[ItemResult | None] = asyncio.Queue()
    counts = {"done": 0, "failed": 0, "cut": 0, "not_started": 0}

    def emit(r: ItemResult) -> None:
        if r.result is None:
            counts["not_started"] += 1
        else:
            counts["done"] += 1
            counts["failed"] += r.result.status == "error"
            # a limit ended it with no answer: ran, but not done (a resume runs it again)
            counts["cut"] += r.row is not None and row_cut(r.row)
        out.put_nowait(r)

    if not its:      # e.g. a resumed batch with every item done: no Ray to join
        executor = None
    if executor is None:
        ledger = BatchLedger(b, **ledger_kw)
        work: asyncio.Future[Any] = asyncio.ensure_future(
            _run_local(rlm, its, ledger, caps, output, concurrency, emit))
        snapshot: Callable[[], dict[str, Any] | None] = ledger.snapshot
    else:
        def emit_threadsafe(r: ItemResult) -> None:
            loop.call_soon_threadsafe(emit, r)
        work = asyncio.ensure_future(asyncio.to_thread(
            executor.run, rlm, its, b, ledger_kw, caps, output, emit_threadsafe))
        snapshot = lambda: executor.last_ledger     # noqa: E731
    work.add_done_callback(lambda _f: loop.call_soon(out.put_nowait, None))
    try:
        while True:
            r = await out.get()
            if r is None:
                break
            yield r
        await work       # raises what the executor raised
    finally:
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if summary is not None:
        led = snapshot() or {}
        summary.update(total=len(its), **counts, cost_usd=led.get("cost_usd"),
                       tokens=led.get("tokens", 0), stopped=led.get("stopped"),
                       lost_attempts=led.get("lost_attempts", 0),
                       elapsed_s=round(time.monotonic() - t0, 3), ledger=led)


async def abatch(rlm: RLM, items: Iterable[Any] | None = None, **options: Any) -> BatchResult:
    """Run the items (see aiter_batch) and return their results in item order."""
    summary: dict[str, Any] = {}
    got: dict[int, ItemResult] = {}
    async for r in aiter_batch(rlm, items, summary=summary, **options):
        got[r.item.index] = r
    ordered = [got[i] for i in sorted(got)]
    return BatchResult(items=[r.item for r in ordered], results=[r.result for r in ordered],
                       summary=summary)


def batch(rlm: RLM, items: Iterable[Any] | None = None, **options: Any) -> BatchResult:
    """Blocking twin of `abatch`; safe to call from inside a running event loop."""
    return _blocking(abatch(rlm, items, **options))


def _blocking(coro: Any) -> Any:
    from recursa.base.blocking import run_blocking
    return run_blocking(coro)


def iter_batch(rlm: RLM, items: Iterable[Any] | None = None,
               **options: Any) -> Iterator[ItemResult]:
    """Blocking twin of `aiter_batch`: ItemResults as they finish, from a thread that runs
    the async core. Leaving the loop early stops the batch (running items are cancelled)."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue()
    running: dict[str, Any] = {}

    async def pump() -> None:
        running["loop"], running["task"] = asyncio.get_running_loop(), asyncio.current_task()
        try:
            async for r in aiter_batch(rlm, items, **options):
                q.put(("item", r))
        except BaseException as e:
            q.put(("error", e))
        finally:
            q.put(("end", None))

    t = threading.Thread(target=asyncio.run, args=(pump(),), daemon=True,
                         name="recursa-batch")
    t.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "end":
                break
            if kind == "error":
                raise value
            yield value
    finally:
        if t.is_alive() and "task" in running:     # left early: cancel what still runs
            running["loop"].call_soon_threadsafe(running["task"].cancel)
        t.join()
