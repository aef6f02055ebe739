"""InProcessSandbox: the REPL runs inside the host process. NOT isolated.

Model-written code runs with the host's privileges: it can read your files and environment
(API keys included), use the network and crash the host. Use it only for trusted code, tests
and speed. It shares the REPL semantics of the worker (the same `Repl` class, loaded from
worker.py by path) so cells behave the same as in `LocalSandbox`.

Timeouts are best effort: a cell that exceeds its time gets KeyboardInterrupt raised in its
thread (PyThreadState_SetAsyncExc), which only lands when the thread runs Python bytecode. A
cell blocked in native code cannot be stopped; it keeps running in the background and the
sandbox refuses further cells.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import threading
import time
from types import ModuleType
from typing import Any

from recursa.base.locks import AST_LOCK
from recursa.base.types import CallHandler, Cell, ContextPayload, SandboxError
from recursa.sandbox.protocol import WORKER_PATH

_module: ModuleType | None = None
_module_lock = threading.Lock()


def worker_module() -> ModuleType:
    """worker.py imported by file path (it is a standalone program, not a recursa module)."""
    global _module
    with _module_lock:
        if _module is None:
            spec = importlib.util.spec_from_file_location("_recursa_worker", WORKER_PATH)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # dataclass-like machinery may look it up
            spec.loader.exec_module(mod)
            mod.__dict__["AST_LOCK"] = AST_LOCK   # one lock for every parse in this process
            _module = mod
        return _module


class _Routers:
    """sys.stdout/sys.stderr routing, installed only while at least one cell runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.out: Any = None
        self.err: Any = None

    def acquire(self) -> tuple[Any, Any]:
        mod = worker_module()
        with self.lock:
            if self.users == 0 or sys.stdout is not self.out or sys.stderr is not self.err:
                if not isinstance(sys.stdout, mod.StreamRouter):
                    self.out = mod.StreamRouter(sys.stdout, "<stdout>")
                    sys.stdout = self.out
                if not isinstance(sys.stderr, mod.StreamRouter):
                    self.err = mod.StreamRouter(sys.stderr, "<stderr>")
                    sys.stderr = self.err
            self.users += 1
            return self.out, self.err

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                if sys.stdout is self.out:
                    sys.stdout = self.out._fallback   # type: ignore[union-attr]
                if sys.stderr is self.err:
                    sys.stderr = self.err._fallback   # type: ignore[union-attr]


_routers = _Routers()


def _async_raise(ident: int, exc_type: type[BaseException]) -> bool:
    # imported here, only for a cell out of time: ~1 ms of every in-process run's start-up
    import ctypes
    n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))
    if n > 1:  # should never happen; undo to be safe
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
        return False
    return n == 1


class _LateRouter:
    """Passes writes to whichever router is current (the Repl is built before any cell runs)."""

    def __init__(self, which: str):
        self.which = which

    def register(self, ident: int, capture: Any) -> None:
        getattr(_routers, self.which).register(ident, capture)

    def unregister(self, ident: int) -> None:
        router = getattr(_routers, self.which)
        if router is not None:
            router.unregister(ident)


class InProcessSandbox:
    """Runs cells in a thread of the host process. Fast, trusted use only: NOT isolated."""

    isolation = "none (in-process: model code runs with the host's privileges)"

    def __init__(self, *, interrupt_grace: float = 2.0):
        self.interrupt_grace = interrupt_grace
        self._repl: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: CallHandler | None = None
        self._outstanding = 0
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._in_cell = False     # the cell thread runs the cell's code (it may be interrupted)
        # held to leave the cell and to interrupt it: an interrupt is sent only to a thread that
        # has not left, so it never lands in a later thread given the same ident
        self._leaving = threading.Lock()
        self._broken: str | None = None
        self._closed = False

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        if self._repl is not None:
            raise SandboxError("the sandbox was already started")
        mod = worker_module()
        self._loop = asyncio.get_running_loop()
        self._handler = handler
        repl = mod.Repl(self._call, _LateRouter("out"), _LateRouter("err"))
        try:
            await asyncio.to_thread(repl.load_context, payload.path, payload.kind)
            repl.define_functions(payload.functions)
        except (OSError, ValueError) as exc:
            raise SandboxError(f"could not load the context: {type(exc).__name__}: {exc}") from exc
        self._repl = repl

    # runs in cell threads
    def _call(self, kind: str, args: dict[str, Any]) -> Any:
        if self._loop is None or self._closed:
            raise RuntimeError("the sandbox is closed")
        with self._count_lock:
            self._outstanding += 1
        try:
            fut = asyncio.run_coroutine_threadsafe(self._serve(kind, args), self._loop)
            return fut.result()
        finally:
            with self._count_lock:
                self._outstanding -= 1

    async def _serve(self, kind: str, args: dict[str, Any]) -> Any:
        assert self._handler is not None
        try:
            return await self._handler(kind, args)
        except Exception as exc:
            # the worker session's module (and its transport) only for this error's shape
            from recursa.sandbox.session import _error_value
            return _error_value(kind, args, exc)

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self._repl is None or self._closed:
            raise SandboxError("the sandbox is not running")
        if self._broken:
            return Cell(error=f"the sandbox cannot run cells any more: {self._broken}")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[dict[str, Any]] = loop.create_future()
        repl = self._repl

        def work() -> None:
            try:
                res = repl.run(code, max_output_chars)
            except BaseException as exc:  # KeyboardInterrupt landing outside user code
                res = {"error": f"{type(exc).__name__}: {exc}"}
            while True:                   # no interrupt is sent once the flag has fallen
                try:
                    with self._leaving:
                        self._in_cell = False
                    break
                except KeyboardInterrupt:  # one sent just before: it has landed, go on
                    continue

            def deliver() -> None:
                if not done.done():
                    done.set_result(res)
            # a cell cut at a time limit may finish after its run's loop has closed: nobody
            # waits for its result any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver)

        _routers.acquire()
        t0 = time.perf_counter()
        thread = threading.Thread(target=work, name="recursa-inprocess-cell", daemon=True)
        self._thread = thread
        try:
            self._in_cell = True
            thread.start()
            used, mark = 0.0, time.monotonic()
            while not done.done():
                busy = self._outstanding > 0
                await asyncio.wait({done}, timeout=0.02 if busy else
                                   max(0.001, min(0.05, timeout - used)))
                now = time.monotonic()
                if not busy:
                    used += now - mark
                mark = now
                if not done.done() and used >= timeout:
                    return await self._stop(thread, done, timeout, t0)
            thread.join(1.0)  # it has finished its work; let it exit before the loop may close
            return Cell(**done.result())
        except asyncio.CancelledError:
            self._interrupt(thread)
            raise
        finally:
            _routers.release()

    async def _stop(self, thread: threading.Thread, done: asyncio.Future[dict[str, Any]],
                    timeout: float, t0: float) -> Cell:
        self._interrupt(thread)
        try:
            res = await asyncio.wait_for(asyncio.shield(done), self.interrupt_grace)
        except TimeoutError:
            self._broken = f"a cell exceeded {timeout:g} s and could not be stopped"
            return Cell(timed_out=True, elapsed_s=time.perf_counter() - t0,
                        error=(f"cell exceeded {timeout:g} s and could not be stopped (it is "
                               f"blocked outside Python code); it keeps running in the "
                               f"background and this in-process sandbox cannot run more cells"))
        cell = Cell(**res)
        cell.timed_out = True
        cell.error = (f"cell exceeded {timeout:g} s of running time and was interrupted "
                      f"(KeyboardInterrupt); the REPL state was kept.\n" + (cell.error or ""))
        return cell

    def _interrupt(self, thread: threading.Thread) -> None:
        """KeyboardInterrupt in the cell's thread while it runs the cell's code; not after, when
        it would land in the hand-over of the result."""
        with self._leaving:
            if self._in_cell and thread.ident is not None and thread.is_alive():
                _async_raise(thread.ident, KeyboardInterrupt)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._interrupt(self._thread)
        self._repl = None
