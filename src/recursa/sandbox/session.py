"""Host side of the worker protocol: one worker, its calls, timeouts and restarts.

The worker's frames are untrusted (user code can write to the protocol's descriptors), so the
host reads them only while it waits for something (the worker's `ready`, a cell's `done`):
between cells nothing is read and a worker that writes anyway blocks on a full pipe. Each frame
is bounded by its type before it is parsed (`protocol.FrameLimits`), large ones are parsed off
the event loop, calls in flight are bounded in bytes (beyond, reading pauses until they
finish), frames nobody asked for are dropped and counted, and a worker that breaks the
protocol is killed and its run stopped with a `SandboxError` that says why (bytes that do not
decode at all are treated like a crash instead: the worker restarts, as a damaged remote
stream would need).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recursa.base.types import CallHandler, Cell, SandboxError
from recursa.sandbox import protocol
from recursa.sandbox.transport import Transport

log = logging.getLogger("recursa.sandbox")

_CELL_FIELDS = set(Cell.model_fields)
_STEP = 1 << 20   # a large frame is read (and its separators counted) this much at a time
_BATCH_KINDS = {"llm_batch": "prompts", "rlm_batch": "prompts"}


def startable(started: bool, closed: bool, context_path: str) -> Path:
    """The context file a sandbox that starts one worker session is about to start with; a
    clear error when it was started before, is closed, or the file is not there."""
    if started:
        raise SandboxError("the sandbox was already started")
    if closed:
        raise SandboxError("the sandbox is closed")
    path = Path(context_path)
    if not path.is_file():
        raise SandboxError(f"context file not found: {context_path}")
    return path


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


class _Breach(Exception):
    """The worker broke the protocol (what it sent no honest worker sends)."""


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
                 interrupt_grace: float = 2.0, limits: protocol.FrameLimits | None = None,
                 functions: list[dict[str, Any]] | None = None):
        self._factory = transport_factory
        self._context_path = context_path
        self._kind = kind
        self._functions = list(functions or [])   # host functions, defined at every (re)start
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
        self.limits = limits or protocol.LIMITS
        self._want = asyncio.Event()      # the read loop reads only while this is set
        self._starting = False            # waiting for ready / init_error
        self._cell: str | None = None     # the exec whose done we wait for
        self._cell_cap = 0                # its max_output_chars
        self._in_flight = 0               # bytes of the calls being served
        self._flight_freed = asyncio.Event()
        self._cell_dropped = [0, 0]       # frames, bytes dropped during the current cell
        self.dropped_frames = 0           # frames the host did not ask for, over the session
        self.dropped_bytes = 0
        self.breach: str | None = None    # how the worker broke the protocol; the end of it
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
        self._in_flight = 0
        self._cell = None
        self._starting = True
        self._want.set()
        self.start_failure = None
        try:
            await transport.start()
        except OSError as exc:
            self.start_failure = "oserror"
            await self._kill()
            raise SandboxError(f"could not start the sandbox worker: {exc}") from exc
        self._reader = asyncio.create_task(self._read_loop(transport, self._events))
        try:
            init: dict[str, Any] = {"type": "init", "context_path": self._context_path,
                                    "kind": self._kind}
            if self._functions:
                init["functions"] = self._functions
            await self._send(init)
            msg = await asyncio.wait_for(self._next_message(), self._start_timeout)
        except _Breach as exc:
            self.start_failure = "died"
            await self._kill()
            raise SandboxError(self._breach_message(str(exc))) from None
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
        self._want.clear()
        self._cell = None
        self._starting = False
        for task in list(self._calls):
            task.cancel()
        self._calls.clear()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._transport is not None:
            await self._transport.kill()

    @property
    def in_cell(self) -> bool:
        """Whether a cell is running (its done not yet received)."""
        return self._cell is not None

    @property
    def starting(self) -> bool:
        """Whether a worker is being started (its ready not yet received)."""
        return self._starting

    async def abort(self, reason: str) -> None:
        """Kill the worker now (e.g. a host-side limit was hit). A running cell reports
        `reason` and the worker is restarted as if it had died; between cells, the next cell
        restarts it first and says why."""
        if self._cell is None:
            self._broken = self._broken or reason
        else:
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
                await self._want.wait()      # nothing is read unless the host waits for it
                while self._in_flight > self.limits.in_flight_bytes:
                    self._flight_freed.clear()   # the worker's writes block meanwhile
                    await self._flight_freed.wait()
                n = protocol.decode_length(await transport.receive(protocol.HEADER.size))
                msg, n = await self._read_frame(transport, n)
                self._dispatch(msg, n, events)
        except asyncio.CancelledError:
            raise
        except EOFError:
            events.put_nowait(("dead", None))
        except protocol.MalformedFrame as exc:   # like a crash: the worker restarts
            events.put_nowait(("dead", f"it sent a malformed message ({exc})"))
        except protocol.ProtocolError as exc:
            events.put_nowait(("breach", str(exc)))
        except Exception as exc:  # transport failure of any kind: same as a dead worker
            events.put_nowait(("dead", f"{type(exc).__name__}: {exc}"))

    async def _read_frame(self, transport: Transport, n: int) -> tuple[dict[str, Any], int]:
        """One frame's body, bounded by what may come now, parsed (off the loop if large)."""
        lim = self.limits
        cap = self._cell_cap if self._cell is not None else None
        most = lim.frame_bytes(cap)
        if n > most:   # refused before reading it
            raise protocol.ProtocolError(f"it sent a frame of {n} bytes; at most {most} may "
                                         f"come {'during a cell' if cap else 'now'}")
        if n <= lim.parse_inline_bytes:
            body = await transport.receive(n)
            quick = None
        else:   # in steps, letting other tasks run between them
            first = await transport.receive(min(n, _STEP))
            if cap is not None and not first.startswith(protocol.CALL_PREFIX) \
                    and n > lim.done_bytes(cap):
                raise protocol.ProtocolError(
                    f"it sent a frame of {n} bytes that is not a call; at most "
                    f"{lim.done_bytes(cap)} may come")
            parts, got, quick = [first], len(first), protocol.quick_count(first)
            while got < n:
                await asyncio.sleep(0)
                part = await transport.receive(min(n - got, _STEP))
                quick += protocol.quick_count(part)
                parts.append(part)
                got += len(part)
            body = b"".join(parts)
            del parts
        if n <= lim.parse_inline_bytes:
            msg = self._parse(body, quick)
        else:   # a thread (it holds the GIL while parsing, but the loop gets turns between)
            msg = await asyncio.to_thread(self._parse, body, quick)
        protocol.check_frame(body, msg, lim, cap)
        return msg, n

    def _parse(self, body: bytes, quick: int | None) -> dict[str, Any]:
        values = protocol.count_values(body, self.limits.values, quick)
        if values > self.limits.values:
            raise protocol.ProtocolError(f"it sent a frame of about {values} JSON values; at "
                                         f"most {self.limits.values} are accepted")
        return protocol.decode_body(body)

    def _dispatch(self, msg: dict[str, Any], n: int,
                  events: asyncio.Queue[tuple[str, Any]]) -> None:
        """Serve a call, deliver what the host waits for, drop (and count) the rest."""
        kind = msg["type"]
        if kind == "call" and self._cell is not None:
            self._outstanding += 1
            self._in_flight += n
            task = asyncio.create_task(self._serve_call(msg, events, n))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
            events.put_nowait(("wake", None))
        elif kind == "done" and self._cell is not None and msg.get("id") == self._cell:
            try:
                protocol.check_done(msg, self.limits, self._cell_cap)
            except protocol.ProtocolError as exc:
                raise protocol.ProtocolError(f"{exc} (a done frame no worker sends)") from None
            self._cell = None
            self._want.clear()   # anything after the done waits in the pipe
            events.put_nowait(("msg", msg))
        elif kind in ("ready", "init_error") and self._starting:
            self._starting = False
            self._want.clear()
            events.put_nowait(("msg", msg))
        elif kind in ("call", "done", "ready", "init_error", "pong", "protocol_error"):
            if kind == "protocol_error":
                log.warning("sandbox worker reported: %.500s", msg.get("error"))
            self.dropped_frames += 1
            self.dropped_bytes += n
            self._cell_dropped[0] += 1
            self._cell_dropped[1] += n
            frames, nbytes = self._cell_dropped
            if frames > self.limits.unrequested_frames or \
                    nbytes > self.limits.unrequested_bytes:
                raise protocol.ProtocolError(
                    f"it sent {frames} frames ({nbytes} bytes) the host did not ask for")
        else:
            raise protocol.ProtocolError(f"it sent a frame of unknown type {kind[:40]!r}")

    def _breach_message(self, reason: str) -> str:
        self.breach = self.breach or reason
        return (f"the sandbox worker broke the protocol: {reason}. Model code wrote to the "
                f"host's channel; the worker was killed and this sandbox cannot be used again")

    async def _serve_call(self, msg: dict[str, Any], events: asyncio.Queue[tuple[str, Any]],
                          size: int = 0) -> None:
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
            self._in_flight -= size
            self._flight_freed.set()
            events.put_nowait(("wake", None))

    async def _next_message(self) -> dict[str, Any]:
        while True:
            kind, payload = await self._events.get()
            if kind == "msg":
                return payload
            if kind == "dead":
                raise _WorkerDied(payload or "")
            if kind == "breach":
                raise _Breach(payload)

    # ------------------------------------------------------------ cells
    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self.breach is not None:
            raise SandboxError(self._breach_message(self.breach))
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
        # Unguessable: a done forged between cells cannot match the next cell's id.
        cell_id = f"x{next(self._ids)}-{secrets.token_hex(8)}"
        t_start = time.perf_counter()
        try:
            cell = await self._run_inner(cell_id, code, timeout, max_output_chars, t_start)
        except _Breach as exc:
            await self._kill()
            raise SandboxError(self._breach_message(str(exc))) from None
        except asyncio.CancelledError:
            # The worker is mid-cell and nobody will wait for it: stop it now, restart lazily.
            self._broken = "the previous cell was cancelled"
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill())
            raise
        finally:
            self._cell = None
        dropped, self._cell_dropped = self._cell_dropped[0], [0, 0]
        if dropped:
            cell.stderr = (f"note: the host ignored {dropped} messages from the REPL process "
                           f"that it had not asked for\n") + cell.stderr
        return cell

    async def _run_inner(self, cell_id: str, code: str, timeout: float, max_output_chars: int,
                         t_start: float) -> Cell:
        # Forget stale events from before this cell (e.g. wake-ups from leftover threads).
        while not self._events.empty():
            kind, payload = self._events.get_nowait()
            if kind == "dead":
                return await self._died(payload, t_start, cell_id=None)
            if kind == "breach":
                raise _Breach(payload)
        try:   # a worker that died while idle (nothing is read between cells)
            exited = getattr(self._transport, "returncode", None) is not None
        except NotImplementedError:
            exited = False
        if exited:
            return await self._died(None, t_start, cell_id=None)
        self._cell, self._cell_cap = cell_id, int(max_output_chars)
        self._cell_dropped = [0, 0]
        self._want.set()
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
            try:   # not wait_for: on 3.11 it drops a cancel that lands as an event arrives
                async with asyncio.timeout(wait):
                    kind, payload = await self._events.get()
            except TimeoutError:
                return await self._timed_out(cell_id, timeout, t_start)
            now = time.monotonic()
            if not busy:
                used += now - mark
            mark = now
            busy = self._outstanding > 0
            if kind == "dead":
                return await self._died(payload, t_start, cell_id)
            if kind == "breach":
                raise _Breach(payload)
            if kind == "msg" and payload.get("type") == "done" and payload.get("id") == cell_id:
                return self._cell_from(payload)
            if not busy and used >= timeout:
                return await self._timed_out(cell_id, timeout, t_start)

    def _cell_from(self, msg: dict[str, Any]) -> Cell:
        fields = {k: v for k, v in msg.items() if k in _CELL_FIELDS}
        names = fields.get("variables")
        if isinstance(names, list):   # they feed prompts (compaction): a bounded list
            lim = self.limits
            fields["variables"] = [v for v in names if isinstance(v, str)
                                   and len(v) <= lim.variable_chars][:lim.variables]
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
                async with asyncio.timeout(left):
                    kind, payload = await self._events.get()
            except TimeoutError:
                break
            if kind == "dead":
                break
            if kind == "breach":
                raise _Breach(payload)
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
