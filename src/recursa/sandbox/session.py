"""Host side of the worker protocol: one worker, its calls, timeouts and restarts."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from recursa.sandbox import protocol
from recursa.sandbox.transport import Transport
from recursa.types import CallHandler, Cell, SandboxError

log = logging.getLogger("recursa.sandbox")

_CELL_FIELDS = set(Cell.model_fields)
_BATCH_KINDS = {"llm_batch": "prompts", "rlm_batch": "prompts"}


def _error_value(kind: str, args: dict[str, Any], exc: BaseException) -> Any:
    """A failed call becomes an error string in its slot(s); a batch keeps its shape."""
    msg = f"Error: {type(exc).__name__}: {exc}"
    key = _BATCH_KINDS.get(kind)
    if key is not None:
        items = args.get(key)
        n = len(items) if isinstance(items, list) else 1
        return [msg] * n
    return msg


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "(none)"


class _WorkerDied(Exception):
    pass


class WorkerSession:
    """Owns one worker over a `Transport`, restarting it (and reloading the context) as needed.

    `transport_factory` builds a fresh, unstarted transport for each worker incarnation.
    `context_path` is the path *as the worker sees it* (e.g. /recursa/context under bwrap).
    Calls from the worker are served as asyncio tasks, so a batch and calls from several
    threads of user code run concurrently. The per-cell timeout counts only time during which
    no host call is outstanding: waiting for sub-models does not use up a cell's time.
    """

    def __init__(self, transport_factory: Callable[[], Transport], *, context_path: str | None,
                 kind: str, handler: CallHandler, start_timeout: float = 60.0,
                 interrupt_grace: float = 2.0):
        self._factory = transport_factory
        self._context_path = context_path
        self._kind = kind
        self._handler = handler
        self._start_timeout = start_timeout
        self._grace = interrupt_grace
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._calls: set[asyncio.Task[None]] = set()
        self._outstanding = 0
        self._send_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._broken: str | None = None   # set when the worker must be restarted before use
        self._abort_reason: str | None = None   # why the host killed the worker (abort())
        self._closed = False
        self.variables: list[str] = []
        self.restarts = 0
        self.start_s = 0.0                # time the last (re)start took, incl. context load
        # why the last start() failed: "oserror" (could not start), "died" (the worker ended or
        # closed the stream before it was ready), "timeout", "init_error" (context not loaded)
        self.start_failure: str | None = None
        self.info: dict[str, Any] = {}
        # Set by the sandbox: why the worker died, when it knows better than the exit status
        # (e.g. its cgroup's OOM killer stopped the whole tree).
        self.explain_death: Callable[[], str | None] | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        t0 = time.perf_counter()
        transport = self._factory()
        self._transport = transport
        self._events = asyncio.Queue()
        self._outstanding = 0
        self.start_failure = None
        try:
            await transport.start()
        except OSError as exc:
            self.start_failure = "oserror"
            await self._kill()
            raise SandboxError(f"could not start the sandbox worker: {exc}") from exc
        self._reader = asyncio.create_task(self._read_loop(transport, self._events))
        try:
            await self._send({"type": "init", "context_path": self._context_path,
                              "kind": self._kind})
            msg = await asyncio.wait_for(self._next_message(), self._start_timeout)
        except (TimeoutError, _WorkerDied, ConnectionError) as exc:
            self.start_failure = "timeout" if isinstance(exc, TimeoutError) else "died"
            why = transport.diagnostics()
            await self._kill()
            raise SandboxError(f"the sandbox worker did not start ({exc or why}): {why}") from None
        if msg.get("type") != "ready":
            self.start_failure = "init_error"
            await self._kill()
            raise SandboxError(f"the sandbox worker could not load the context: "
                               f"{msg.get('error', msg)}")
        self.info = msg
        self.start_s = time.perf_counter() - t0
        self._broken = None
        self.variables = []

    async def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send({"type": "shutdown"}), 0.5)
        await self._kill()

    async def _kill(self) -> None:
        for task in list(self._calls):
            task.cancel()
        self._calls.clear()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._transport is not None:
            await self._transport.kill()

    async def abort(self, reason: str) -> None:
        """Kill the worker now (e.g. a host-side limit was hit); the running cell reports
        `reason` and the worker is restarted as if it had died."""
        self._abort_reason = reason
        if self._transport is not None:
            await self._transport.kill()

    async def _restart(self) -> None:
        await self._kill()
        self.restarts += 1
        await self.start()

    # ------------------------------------------------------------ stream
    async def _send(self, msg: dict[str, Any]) -> None:
        if self._transport is None:
            raise ConnectionError("no worker")
        data = protocol.encode(msg)
        async with self._send_lock:
            await self._transport.send(data)

    async def _read_loop(self, transport: Transport, events: asyncio.Queue[tuple[str, Any]]
                         ) -> None:
        try:
            while True:
                n = protocol.decode_length(await transport.receive(protocol.HEADER.size))
                msg = protocol.decode_body(await transport.receive(n))
                if msg["type"] == "call":
                    self._outstanding += 1
                    task = asyncio.create_task(self._serve_call(msg, events))
                    self._calls.add(task)
                    task.add_done_callback(self._calls.discard)
                    events.put_nowait(("wake", None))
                else:
                    events.put_nowait(("msg", msg))
        except asyncio.CancelledError:
            raise
        except EOFError:
            events.put_nowait(("dead", None))
        except protocol.ProtocolError as exc:
            events.put_nowait(("dead", f"it sent a malformed message ({exc})"))
        except Exception as exc:  # transport failure of any kind: same as a dead worker
            events.put_nowait(("dead", f"{type(exc).__name__}: {exc}"))

    async def _serve_call(self, msg: dict[str, Any], events: asyncio.Queue[tuple[str, Any]]
                          ) -> None:
        cid, kind = msg.get("id"), str(msg.get("kind"))
        raw = msg.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        try:
            try:
                value = await self._handler(kind, args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("sandbox call %s failed: %r", kind, exc)
                value = _error_value(kind, args, exc)
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                await self._send({"type": "result", "id": cid, "value": value})
        finally:
            self._outstanding -= 1
            events.put_nowait(("wake", None))

    async def _next_message(self) -> dict[str, Any]:
        while True:
            kind, payload = await self._events.get()
            if kind == "msg":
                return payload
            if kind == "dead":
                raise _WorkerDied(payload or "")

    # ------------------------------------------------------------ cells
    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        prefix = None
        if self._broken is not None:
            lost = self.variables
            reason = self._broken
            await self._restart()
            prefix = (f"note: the REPL was restarted before this cell ({reason}); `context` was "
                      f"reloaded; these variables were lost: {_names(lost)}\n")
            cell = await self._run(code, timeout, max_output_chars)
            cell.restarted = True
            cell.lost_variables = sorted(set(lost) | set(cell.lost_variables))
            cell.stderr = prefix + cell.stderr
            return cell
        return await self._run(code, timeout, max_output_chars)

    async def _run(self, code: str, timeout: float, max_output_chars: int) -> Cell:
        cell_id = f"x{next(self._ids)}"
        t_start = time.perf_counter()
        try:
            return await self._run_inner(cell_id, code, timeout, max_output_chars, t_start)
        except asyncio.CancelledError:
            # The worker is mid-cell and nobody will wait for it: stop it now, restart lazily.
            self._broken = "the previous cell was cancelled"
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill())
            raise

    async def _run_inner(self, cell_id: str, code: str, timeout: float, max_output_chars: int,
                         t_start: float) -> Cell:
        # Forget stale events from before this cell (e.g. wake-ups from leftover threads).
        while not self._events.empty():
            kind, payload = self._events.get_nowait()
            if kind == "dead":
                return await self._died(payload, t_start, cell_id=None)
        try:
            await self._send({"type": "exec", "id": cell_id, "code": code,
                              "max_output_chars": int(max_output_chars)})
        except ConnectionError:
            return await self._died(None, t_start, cell_id)

        used = 0.0
        mark = time.monotonic()
        busy = self._outstanding > 0
        while True:
            wait = None if busy else max(0.0, timeout - used)
            try:
                kind, payload = await asyncio.wait_for(self._events.get(), wait)
            except TimeoutError:
                return await self._timed_out(cell_id, timeout, t_start)
            now = time.monotonic()
            if not busy:
                used += now - mark
            mark = now
            busy = self._outstanding > 0
            if kind == "dead":
                return await self._died(payload, t_start, cell_id)
            if kind == "msg":
                if payload.get("type") == "done" and payload.get("id") == cell_id:
                    return self._cell_from(payload)
                if payload.get("type") == "protocol_error":
                    log.warning("sandbox worker reported: %s", payload.get("error"))
            if not busy and used >= timeout:
                return await self._timed_out(cell_id, timeout, t_start)

    def _cell_from(self, msg: dict[str, Any]) -> Cell:
        fields = {k: v for k, v in msg.items() if k in _CELL_FIELDS}
        try:
            cell = Cell(**fields)
        except Exception as exc:  # a worker that answers nonsense is a broken worker
            self._broken = f"it sent an invalid result ({exc})"
            return Cell(error=f"the sandbox returned an invalid result: {exc}")
        self.variables = list(cell.variables)
        return cell

    async def _timed_out(self, cell_id: str, timeout: float, t_start: float) -> Cell:
        # First ask nicely: KeyboardInterrupt keeps the REPL state.
        with contextlib.suppress(ConnectionError, OSError):
            await self._send({"type": "interrupt", "id": cell_id})
        deadline = time.monotonic() + self._grace
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                kind, payload = await asyncio.wait_for(self._events.get(), left)
            except TimeoutError:
                break
            if kind == "dead":
                break
            if (kind == "msg" and payload.get("type") == "done"
                    and payload.get("id") == cell_id):
                cell = self._cell_from(payload)
                cell.timed_out = True
                cell.elapsed_s = time.perf_counter() - t_start
                cell.error = (f"cell exceeded {timeout:g} s of running time and was interrupted "
                              f"(KeyboardInterrupt); the REPL state was kept.\n"
                              + (cell.error or ""))
                return cell
        lost = list(self.variables)
        await self._restart_or_fail()
        return Cell(
            error=(f"cell exceeded {timeout:g} s and was stopped; the REPL was restarted and "
                   f"`context` reloaded; these variables were lost: {_names(lost)}"),
            elapsed_s=time.perf_counter() - t_start,
            timed_out=True, restarted=True, lost_variables=lost,
        )

    async def _died(self, reason: str | None, t_start: float, cell_id: str | None) -> Cell:
        transport = self._transport
        wait_exit = getattr(transport, "wait_exit", None)
        if wait_exit is not None and reason is None:  # let it finish dying: exit status
            await wait_exit(2.0)
        explained = self.explain_death() if self.explain_death else None
        why = self._abort_reason or reason or explained or (
            transport.diagnostics() if transport else "unknown")
        self._abort_reason = None
        lost = list(self.variables)
        await self._restart_or_fail()
        where = "while running this cell" if cell_id else "between cells"
        return Cell(
            error=(f"the REPL process died {where}: {why}. It was restarted and `context` "
                   f"reloaded; these variables were lost: {_names(lost)}"),
            elapsed_s=time.perf_counter() - t_start,
            restarted=True, lost_variables=lost,
        )

    async def _restart_or_fail(self) -> None:
        try:
            await self._restart()
        except SandboxError:
            self._broken = "a restart failed"
            raise
