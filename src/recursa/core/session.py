"""Sessions: several questions about one context, in one sandbox.

    with rlm.session(context) as s:           # or: async with rlm.session(context) as s
        s.completion("How many orders are there?")
        s.completion("And how many of them were refunded?")   # sees the first run's variables
        s.spent                                # the session's totals so far

Each question is an ordinary top-level run (its own Result, its own run in the trace), but the
root's REPL is the same one: the loaded context, every variable, and `session_history` (a list
of {"query", "answer"} dicts of the earlier questions) carry over, and the root's first message
says briefly what was asked and answered before. Children of `rlm_query` still get fresh REPLs.

The session owns an event loop in a thread of its own, so that the sandbox (pipes, a worker
process) lives on one loop whichever way it is called: `completion` blocks on it, `acompletion`
awaits it from any loop. Questions run one at a time. After `idle_timeout` seconds without a
question the session closes itself (its sandbox's worker is gone); using a closed session
raises `SessionClosed`.

Limits: the RLM's budget (and per-call overrides) apply to each question; limits given to
`RLM.session(...)` (`max_cost_usd`, `max_tokens`, `max_subcalls`, `max_seconds`) apply to the
questions together: each question gets what is left, and a question asked when nothing is left
raises `BudgetExceeded`. The session keeps a parent ledger (every question's ledger reserves and
settles there too, so a cancelled question's spend counts as it happened) and a time allowance
(each question's deadline counts against it). A question runs as `RLM.arun` in a `RunScope`:
the kept sandbox, the session's trace file, the question's event hook and preface; the RLM
itself is never copied or changed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from recursa.base.tempdirs import owned_tempdir
from recursa.base.types import (
    BudgetExceeded,
    CallHandler,
    Cell,
    ContextError,
    ContextPayload,
    Event,
    RecursaError,
    Result,
    Sandbox,
    SandboxError,
)
from recursa.core import context as ctx
from recursa.core.budget import Budget, Ledger
from recursa.core.deadline import Allowance
from recursa.obs.trace import new_id

if TYPE_CHECKING:
    from recursa.core.rlm import RLM

T = TypeVar("T")

HISTORY_VAR = "session_history"
# limits that add up over a session's questions (the others are per question by nature)
SESSION_LIMITS = ("max_cost_usd", "max_tokens", "max_subcalls", "max_seconds")
DEFAULT_IDLE_TIMEOUT = 600.0
SUMMARY_ITEMS = 6          # earlier Q&A shown in the root's first message
SUMMARY_CHARS = 300        # of each query / answer there


class SessionClosed(RecursaError):
    """The session was closed (by `close()`, its context manager, or its idle timeout)."""


class SessionSpend(BaseModel):
    """What a session's questions have spent together. `cost_usd` is None when a model had no
    known price (the total is then unknown, not zero)."""

    questions: int = 0
    cost_usd: float | None = 0.0
    tokens: int = 0
    subcalls: int = 0
    elapsed_s: float = 0.0


class Turn(BaseModel):
    """One question of a session and how it ended."""

    query: str
    answer: str
    status: str
    run_id: str = ""
    cost_usd: float | None = 0.0


class _KeptSandbox:
    """The session's sandbox as each question's run sees it: started once (with the session's
    context), handed the running question's call handler, and left open when a run closes it."""

    def __init__(self, make: Callable[[], Sandbox]):
        self._make = make
        self.inner: Sandbox | None = None
        self._started = False
        self._handler: CallHandler | None = None
        self.preamble = ""          # run before each question: resets `answer`, sets history

    @property
    def isolation(self) -> str:
        return self.inner.isolation if self.inner is not None else "not started"

    async def _serve(self, kind: str, args: dict[str, Any]) -> Any:
        if self._handler is None:      # a thread left running by an earlier question
            raise RuntimeError("no question is running in this session")
        return await self._handler(kind, args)

    async def ensure(self, payload: ContextPayload) -> None:
        """Start the sandbox with the context, unless it runs already."""
        if self._started:
            return
        if self.inner is None:
            self.inner = self._make()
        try:
            await self.inner.start(payload, self._serve)
        except BaseException:          # a failed or cancelled start: the next question retries
            inner, self.inner = self.inner, None
            with contextlib.suppress(Exception):
                await inner.close()
            raise
        self._started = True

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        self._handler = handler
        await self.ensure(payload)
        assert self.inner is not None
        if self.preamble:
            cell = await self.inner.run(self.preamble, timeout=30.0, max_output_chars=2000)
            if cell.error:
                raise SandboxError(f"could not set the session's variables: {cell.error}")

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self.inner is None:
            raise SandboxError("the session's sandbox is not running")
        return await self.inner.run(code, timeout=timeout, max_output_chars=max_output_chars)

    async def close(self) -> None:
        """A question's run is over; the sandbox stays for the next one."""
        self._handler = None

    async def shutdown(self) -> None:
        inner, self.inner, self._started, self._handler = self.inner, None, False, None
        if inner is not None:
            await inner.close()


class _Runner:
    """Where the session's sandbox lives: an event loop in a daemon thread of its own, or
    (`loop` given) a running loop the caller owns, such as a server's."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop | None = None):
        self.owned = loop is None
        self.loop = loop or asyncio.new_event_loop()
        self.thread: threading.Thread | None = None
        self.ident = threading.get_ident()      # a borrowed loop runs in the creating thread
        if self.owned:
            self.thread = threading.Thread(target=self._main, name=name, daemon=True)
            self.thread.start()
            assert self.thread.ident is not None
            self.ident = self.thread.ident

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def in_thread(self) -> bool:
        return threading.get_ident() == self.ident

    def stop(self) -> None:
        if not self.owned or self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None and not self.in_thread():
            self.thread.join(10.0)


class Session:
    """Questions about one context in one kept sandbox; made by `RLM.session(context)`."""

    def __init__(self, rlm: RLM, context: Any, *, idle_timeout: float | None = None,
                 trace_path: str | os.PathLike[str] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, **limits: Any):
        if context is None:
            raise ContextError("a session needs a context: pass RLM.session(context)")
        if isinstance(context, os.PathLike) and not Path(context).exists():
            raise ContextError(f"context path does not exist: {context}")
        unknown = set(limits) - set(SESSION_LIMITS)
        if unknown:
            per_q = sorted(unknown & set(Budget.model_fields))
            hint = (f"; {', '.join(per_q)} applies to each question: set it on RLM(...) or "
                    f"per completion()") if per_q else ""
            raise TypeError(f"session got unknown option(s): {', '.join(sorted(unknown))}"
                            f"{hint}")
        # validated like any Budget (no negative costs, ...)
        Budget.model_validate({k: v for k, v in limits.items() if v is not None})
        self.limits: dict[str, Any] = {k: v for k, v in limits.items() if v is not None}
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be a positive number of seconds")
        self.idle_timeout = DEFAULT_IDLE_TIMEOUT if idle_timeout is None else idle_timeout
        self.id = new_id()
        self.rlm = rlm
        self.context = context
        self.trace_path = Path(trace_path) if trace_path else rlm.trace_path or (
            rlm.trace_dir / f"session-{self.id}.jsonl" if rlm.trace_dir else None)
        self.history: list[Turn] = []
        self.questions = 0
        # the session's limits: cost, tokens and sub-calls in a parent ledger that every
        # question's ledger reserves and settles in too; seconds in an allowance
        self._ledger = Ledger(Budget.model_validate(
            {k: v for k, v in self.limits.items() if k != "max_seconds"}))
        self._clock = Allowance(self.limits.get("max_seconds"))
        self.closed_reason: str | None = None
        self._kept = _KeptSandbox(rlm._make_sandbox)
        self._runner: _Runner | None = None
        self._loop = loop      # a caller's running loop to live on (else a thread of its own)
        self._lock: asyncio.Lock | None = None      # made on the runner's loop
        self._idle: asyncio.TimerHandle | None = None
        self._workdir: str | None = None
        self._guard = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()   # calls not yet done
        self.last_used = time.monotonic()

    # ------------------------------------------------------------ state
    @property
    def spent(self) -> SessionSpend:
        """The questions' spend so far (a cancelled question's included)."""
        led = self._ledger
        return SessionSpend(questions=self.questions, cost_usd=led.cost_usd, tokens=led.tokens,
                            subcalls=led.subcalls, elapsed_s=round(self._clock.used, 4))

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    def _check_open(self) -> None:
        if self.closed_reason is not None:
            raise SessionClosed(f"session {self.id} was closed {self.closed_reason}; start a "
                                f"new one with RLM.session(context)")

    def _runner_now(self) -> _Runner:
        with self._guard:
            self._check_open()
            if self._runner is None:
                if self._loop is not None and self._loop is not _running_loop():
                    raise RuntimeError("a session given `loop=` is used from that loop only")
                self._runner = _Runner(f"recursa-session-{self.id}", self._loop)
                self._runner.loop.call_soon_threadsafe(self._arm_idle)
            return self._runner

    def _call(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            runner = self._runner_now()
        except BaseException:
            coro.close()
            raise
        fut = runner.submit(coro)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    # ------------------------------------------------------------ public API
    def start(self) -> None:
        """Load the context into the sandbox now (else the first question does)."""
        if self._loop is not None:
            raise RuntimeError("this session lives on a caller's event loop: use astart")
        self._call(self._astart()).result()

    async def astart(self) -> None:
        await asyncio.wrap_future(self._call(self._astart()))

    def completion(self, query: str, *, output: Any = None,
                   on_event: Callable[[Event], Any] | None = None, **limits: Any) -> Result:
        """Ask one question (blocking). Limits given here apply to this question only;
        `on_event` gets this question's events (besides the RLM's own `on_event`)."""
        if self._loop is not None:
            raise RuntimeError("this session lives on a caller's event loop: use acompletion")
        fut = self._call(self._ask(query, output, on_event, limits))
        try:
            return fut.result()
        except KeyboardInterrupt:        # cancel the question, keep the session
            fut.cancel()
            with contextlib.suppress(BaseException):   # its clean-up counts its spend
                self._call(self._settled()).result(timeout=10.0)
            raise

    async def acompletion(self, query: str, *, output: Any = None,
                          on_event: Callable[[Event], Any] | None = None,
                          **limits: Any) -> Result:
        """Ask one question; cancelling the awaiting task cancels the question only."""
        return await asyncio.wrap_future(self._call(self._ask(query, output, on_event, limits)))

    def close(self) -> None:
        """Close the sandbox and stop the session's thread; later use raises SessionClosed."""
        self._shutdown("by close()")

    async def aclose(self) -> None:
        runner = self._runner
        if runner is not None and not runner.owned and runner.in_thread():
            await self._aclose_here("by close()")      # on the loop it lives on
        else:
            await asyncio.to_thread(self._shutdown, "by close()")

    def summary(self) -> str:
        """One line: questions, spend, state."""
        s = self.spent
        cost = "unknown" if s.cost_usd is None else f"${s.cost_usd:.4f}"
        caps = ", ".join(f"{k}={v}" for k, v in self.limits.items())
        state = f"closed {self.closed_reason}" if self.closed else "open"
        return (f"session {self.id}: {s.questions} question(s), cost {cost}, tokens "
                f"{s.tokens:,}, sub-calls {s.subcalls}, {s.elapsed_s:.1f}s"
                + (f"; session limits {caps}" if caps else "") + f"; {state}")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Session {self.summary()}>"

    # ------------------------------------------------------------ on the session's loop
    @contextlib.asynccontextmanager
    async def _busy(self) -> AsyncIterator[None]:
        """One thing at a time on the sandbox; the idle clock stops meanwhile."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._check_open()
            if self._idle is not None:
                self._idle.cancel()
            try:
                yield
            finally:
                self.last_used = time.monotonic()
                if not self.closed:
                    self._arm_idle()

    async def _astart(self) -> None:
        async with self._busy():
            if self._workdir is None:
                self._workdir = owned_tempdir("recursa-session-")
            prep = await asyncio.to_thread(ctx.prepare, self.context, Path(self._workdir))
            await self._kept.ensure(prep.payload)

    async def _settled(self) -> None:
        """Return once no question is running (a cancelled one has finished its clean-up)."""
        if self._lock is not None:
            async with self._lock:
                pass

    async def _ask(self, query: str, output: Any, on_event: Callable[[Event], Any] | None,
                   limits: dict[str, Any]) -> Result:
        async with self._busy():            # one question at a time
            return await self._question(query, output, on_event, limits)

    async def _question(self, query: str, output: Any, on_event: Callable[[Event], Any] | None,
                        limits: dict[str, Any]) -> Result:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        unknown = set(limits) - set(Budget.model_fields)
        if unknown:
            raise TypeError(f"unknown limit(s): {', '.join(sorted(unknown))}")
        from recursa.core.output import OutputSpec
        from recursa.core.rlm import RunScope
        spec = OutputSpec.of(output) if output is not None else None
        # each question's budget is capped by what is left (the plan and combinators check
        # their bounds against it); the parent ledger and the allowance count the spend
        budget = Budget.model_validate({**self.rlm.budget.model_dump(), **limits,
                                        **self._remaining(limits)})
        self._kept.preamble = self._preamble()
        scope = RunScope(sandbox=self._kept, trace_path=self.trace_path,  # type: ignore[arg-type]
                         on_event=on_event, preface=self._preface(), ledger=self._ledger,
                         allowance=self._clock)
        try:
            res = await self.rlm.arun(query, self.context, budget, output=spec, scope=scope)
        except asyncio.CancelledError:     # its spend is in the session's ledger already
            self.questions += 1
            raise
        self.questions += 1
        self.history.append(Turn(query=query, answer=res.answer, status=res.status,
                                 run_id=res.run_id, cost_usd=res.cost_usd))
        return res

    def _remaining(self, limits: dict[str, Any]) -> dict[str, Any]:
        """This question's share of the session limits: what is left (or less, if asked)."""
        out: dict[str, Any] = {}
        s = self.spent
        if "max_cost_usd" in self.limits and s.cost_usd is None:
            raise BudgetExceeded("max_cost_usd", "the session's max_cost_usd cannot be checked: "
                                                 "an earlier question's cost is unknown")
        for name, cap in self.limits.items():
            if name == "max_cost_usd":
                left: float = cap - (s.cost_usd or 0.0)
                spent_s = f"${s.cost_usd or 0.0:.4f} of ${cap}"
            elif name == "max_tokens":
                left, spent_s = cap - s.tokens, f"{s.tokens:,} of {cap:,} tokens"
            elif name == "max_subcalls":
                left, spent_s = cap - s.subcalls, f"{s.subcalls} of {cap} sub-calls"
            else:
                left, spent_s = cap - s.elapsed_s, f"{s.elapsed_s:.1f} of {cap} s"
            # no sub-calls left still lets a question run; nothing else left does not
            if left <= 0 and not (name == "max_subcalls" and left == 0):
                raise BudgetExceeded(name, f"the session's {name} is spent ({spent_s} over "
                                           f"{s.questions} question(s)); start a new session "
                                           f"or raise the limit")
            asked = limits.get(name)
            left = max(left, 0)
            out[name] = left if asked is None else min(asked, left)
            if name == "max_tokens":
                out[name] = max(1, int(out[name]))
        return out

    def _preface(self) -> str | None:
        """The earlier questions, briefly, for the root's first message."""
        if not self.history:
            return None
        shown = self.history[-SUMMARY_ITEMS:]
        first = len(self.history) - len(shown) + 1
        lines = [f"This is question {len(self.history) + 1} of a session about this context. "
                 f"The REPL still holds every variable the earlier questions made (SHOW_VARS() "
                 f"lists them), and `{HISTORY_VAR}` is the list of their "
                 f'{{"query", "answer"}} dicts. Earlier questions and answers:']
        for i, t in enumerate(shown, first):
            lines.append(f"{i}. Q: {_clip(t.query)}\n   A: {_clip(t.answer) or '(no answer)'}")
        return "\n".join(lines)

    def _preamble(self) -> str:
        import json
        data = json.dumps([{"query": t.query, "answer": t.answer} for t in self.history],
                          ensure_ascii=False)
        return (f'answer = {{"content": "", "ready": False}}\n'
                f"{HISTORY_VAR} = __import__('json').loads({data!r})")

    def _arm_idle(self) -> None:
        if self._runner is None or self.closed:
            return
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._runner.loop.call_later(self.idle_timeout, self._on_idle)

    def _on_idle(self) -> None:
        if self._lock is not None and self._lock.locked():   # a question is running
            self._arm_idle()
            return
        reason = f"after {self.idle_timeout:g} s idle"
        threading.Thread(target=self._shutdown, args=(reason,), daemon=True).start()

    def _mark_closed(self, reason: str) -> tuple[bool, _Runner | None]:
        with self._guard:
            if self.closed_reason is not None:
                return False, None
            self.closed_reason = reason
            runner, self._runner = self._runner, None
        return True, runner

    async def _aclose_here(self, reason: str) -> None:
        first, _runner = self._mark_closed(reason)
        if not first:
            return
        for fut in list(self._pending):
            fut.cancel()
        await self._aclose_inner()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _shutdown(self, reason: str) -> None:
        first, runner = self._mark_closed(reason)
        if not first:
            return
        if runner is not None and runner.in_thread():   # e.g. close() from an on_event callback
            threading.Thread(target=self._stop_runner, args=(runner,), daemon=True).start()
        elif runner is not None:
            self._stop_runner(runner)

    def _stop_runner(self, runner: _Runner) -> None:
        for fut in list(self._pending):      # a question still running is cancelled
            fut.cancel()
        coro = self._aclose_inner()
        try:
            fut = runner.submit(coro)
        except RuntimeError:        # its loop closed first (its owner or the interpreter ended)
            coro.close()
        else:
            with contextlib.suppress(Exception):
                fut.result(timeout=30.0)
        runner.stop()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    async def _aclose_inner(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        if self._lock is not None:     # let a cancelled question finish its clean-up first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lock.acquire(), 10.0)
        await self._kept.shutdown()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _clip(text: str, n: int = SUMMARY_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."
