"""Byte-stream transports that carry the worker protocol.

`WorkerSession` only needs a way to start a worker, move bytes both ways and kill it, so a
remote sandbox (``docker run -i``, a Modal sandbox's stdio, ...) plugs in by providing another
`Transport`. `SubprocessTransport` covers anything started as a local command, including
``docker run -i IMAGE python worker.py``. `AdoptedTransport` takes over a process that was
started earlier, outside any event loop, with `subprocess.Popen` (a pre-started spare worker),
and connects its pipes to the running loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Transport(Protocol):
    """One worker incarnation's byte stream. Not reused after `kill()`."""

    async def start(self) -> None:
        """Start the worker process; raise OSError (or SandboxError) if it cannot start."""
        ...

    async def send(self, data: bytes) -> None:
        """Write all of `data`; raise ConnectionError if the worker is gone."""
        ...

    async def receive(self, n: int) -> bytes:
        """Return exactly `n` bytes; raise EOFError when the stream ends first."""
        ...

    async def kill(self) -> None:
        """Stop the worker and everything it started. Idempotent."""
        ...

    def diagnostics(self) -> str:
        """A short description of how the worker ended (exit status, stderr tail)."""
        ...


def describe_exit(returncode: int | None) -> str:
    """Words a model understands for a process exit status."""
    if returncode is None:
        return "it stopped responding"
    if returncode < 0 or 128 < returncode <= 128 + 64:
        # bwrap and shells report a child killed by signal N as status 128 + N.
        sig = -returncode if returncode < 0 else returncode - 128
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = {
            "SIGKILL": " (out of memory, os.kill, or killed by the host)",
            "SIGXCPU": " (CPU time limit reached)",
            "SIGXFSZ": " (file size limit reached)",
            "SIGSEGV": " (a crash in native code)",
        }.get(name, "")
        return f"it was killed by {name}{why}"
    return f"it exited with status {returncode}"


def descendants(pid: int) -> list[int]:
    """All processes whose ancestry leads to `pid` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may contain spaces.
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) >= 2:
            children.setdefault(int(rest[1]), []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def _freeze_tree(root: int, rounds: int = 20) -> list[int]:
    """SIGSTOP `root` and its descendants until no new ones appear; return the descendants."""
    stopped: set[int] = set()
    for pid in [root]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
    for _ in range(rounds):
        new = [p for p in descendants(root) if p not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
            stopped.add(pid)
    return sorted(stopped)


def processes_with(marker: str) -> list[int]:
    """Processes whose command line contains `marker` (Linux /proc; empty elsewhere)."""
    needle = marker.encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def kill_tree(pid: int, *, alive: bool = True, marker: str | None = None) -> None:
    """SIGKILL process `pid`, its group and its descendants (frozen first, so that a fork loop
    cannot outrun us). If the leader is already gone (`alive` false) and a `marker` is given,
    the processes whose command line contains it are killed the same way instead: bwrap
    killed in its first milliseconds leaves its inner process orphaned (its parent-death signal
    was not set yet), out of reach by ancestry."""
    roots = [pid] if alive else []
    if not alive and marker:
        roots += [p for p in processes_with(marker) if p != pid and p != os.getpid()]
    for root in roots:
        # Children that left the process group (setsid) are still descendants: the worker
        # makes itself a subreaper so orphans re-parent to it rather than to init.
        victims = _freeze_tree(root)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGKILL)
        for p in [root, *victims]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)


class SubprocessTransport:
    """A local command whose stdin/stdout carry the protocol; stderr is kept as a short tail."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, pass_fds: Sequence[int] = (),
                 stderr_tail: int = 8192, marker: str | None = None):
        self.argv = list(argv)
        self.marker = marker   # see kill_tree
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.pass_fds = tuple(pass_fds)
        self._tail_size = stderr_tail
        self._tail = b""
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self._killed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
            pass_fds=self.pass_fds,
            start_new_session=True,  # its own process group, so kill() reaches the group
        )
        self._drain = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while True:
            chunk = await self._proc.stderr.read(65536)
            if not chunk:
                return
            self._tail = (self._tail + chunk)[-self._tail_size:]

    async def send(self, data: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or self._killed:
            raise ConnectionError("worker is not running")
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            raise ConnectionError(f"worker is gone: {exc}") from None

    async def receive(self, n: int) -> bytes:
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise EOFError("worker is not running")
        try:
            return await proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError:
            raise EOFError("worker closed its output") from None

    async def wait_exit(self, timeout: float) -> int | None:
        """Wait up to `timeout` s for the process to exit on its own; return its status."""
        if self._proc is None:
            return None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._proc.wait(), timeout)
        return self._proc.returncode

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        proc = self._proc
        if proc is None:
            return
        kill_tree(proc.pid, alive=proc.returncode is None, marker=self.marker)
        with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
            await asyncio.wait_for(proc.wait(), 10)
        # The group may outlive its leader.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.stdin is not None:
            proc.stdin.close()
        if self._drain is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._drain, 1)

    def diagnostics(self) -> str:
        rc = self._proc.returncode if self._proc else None
        text = describe_exit(rc)
        tail = self._tail.decode("utf-8", errors="replace").strip()
        if tail:
            text += "; its last error output was:\n" + tail[-2000:]
        return text


class _WritePipeProtocol(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """Flow control for a write pipe, so StreamWriter.drain() works on it."""


async def _wait_popen(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """Wait up to `timeout` s for a Popen child without blocking the loop; its status."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(proc.pid)  # type: ignore[attr-defined]
    try:
        if pidfd is not None:  # readable once the process has exited
            exited = loop.create_future()
            loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(exited, timeout)
            finally:
                loop.remove_reader(pidfd)
            return proc.poll()
        deadline = loop.time() + timeout
        delay = 0.001
        while proc.poll() is None and loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        return proc.returncode
    finally:
        if pidfd is not None:
            os.close(pidfd)


class AdoptedTransport:
    """A worker already started with `subprocess.Popen` (stdin/stdout/stderr pipes, its own
    session), adopted into the running event loop at `start()`.

    The process may have been started from another thread and before this loop existed, which
    is what lets a process-wide pool of pre-started workers serve `asyncio.run()` calls that
    each bring a new loop. Otherwise it behaves like `SubprocessTransport`.
    """

    def __init__(self, proc: subprocess.Popen[bytes], *, stderr_tail: int = 8192,
                 marker: str | None = None):
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise ValueError("the process needs stdin, stdout and stderr pipes")
        self._proc = proc
        self.marker = marker   # see kill_tree
        self._tail_size = stderr_tail
        self._tail = b""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._transports: list[asyncio.BaseTransport] = []
        self._drain: asyncio.Task[None] | None = None
        self._killed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    async def start(self) -> None:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        rt, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), proc.stdout)
        self._transports.append(rt)
        err = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        et, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(err, loop=loop), proc.stderr)
        self._transports.append(et)
        wt, wp = await loop.connect_write_pipe(lambda: _WritePipeProtocol(loop), proc.stdin)
        self._transports.append(wt)
        self._reader = reader
        self._writer = asyncio.StreamWriter(wt, wp, None, loop)
        self._drain = asyncio.create_task(self._drain_stderr(err))

    async def _drain_stderr(self, err: asyncio.StreamReader) -> None:
        while True:
            chunk = await err.read(65536)
            if not chunk:
                return
            self._tail = (self._tail + chunk)[-self._tail_size:]

    async def send(self, data: bytes) -> None:
        writer = self._writer
        if writer is None or self._killed or writer.transport.is_closing():
            raise ConnectionError("worker is not running")
        try:
            writer.write(data)
            await writer.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            raise ConnectionError(f"worker is gone: {exc}") from None

    async def receive(self, n: int) -> bytes:
        if self._reader is None:
            raise EOFError("worker is not running")
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise EOFError("worker closed its output") from None

    async def wait_exit(self, timeout: float) -> int | None:
        """Wait up to `timeout` s for the process to exit on its own; return its status."""
        return await _wait_popen(self._proc, timeout)

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        proc = self._proc
        kill_tree(proc.pid, alive=proc.poll() is None, marker=self.marker)
        await _wait_popen(proc, 10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if self._drain is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._drain, 1)
        for t in self._transports:
            t.close()
        close_popen_pipes(proc)   # those no transport took yet (a start that was cut short)

    def diagnostics(self) -> str:
        text = describe_exit(self._proc.poll())
        tail = self._tail.decode("utf-8", errors="replace").strip()
        if tail:
            text += "; its last error output was:\n" + tail[-2000:]
        return text


def close_popen_pipes(proc: subprocess.Popen[bytes]) -> None:
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
