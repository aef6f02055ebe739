"""Byte-stream transports that carry the worker protocol.

`WorkerSession` only needs a way to start a worker, move bytes both ways and kill it, so a
remote sandbox (``docker run -i``, a Modal sandbox's stdio, ...) plugs in by providing another
`Transport`. `PipeTransport` is the part every local transport shares (three pipes attached to the
running loop, a stderr tail). `SubprocessTransport` covers anything started as a local command,
including ``docker run -i IMAGE python worker.py``, or takes over a process started earlier
with `subprocess.Popen` (`AdoptedTransport`, a pre-started spare worker); the zygote's
transport (zygote.py) is another `PipeTransport` whose process is forked by a fork server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


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
    if not hasattr(os, "killpg"):   # Windows: no groups or SIGSTOP; os.kill terminates one process
        if alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        return
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


class _Gone(asyncio.BaseProtocol):
    """A pipe protocol whose `gone` is done once the transport has closed its pipe."""

    gone: asyncio.Future[None]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.gone.done():
            self.gone.set_result(None)


class _WritePipeProtocol(_Gone, asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """Flow control for a write pipe, so StreamWriter.drain() works on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(loop)
        self.gone = loop.create_future()


class _ReadPipeProtocol(_Gone, asyncio.StreamReaderProtocol):
    """A StreamReader's protocol."""

    def __init__(self, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop):
        super().__init__(reader, loop=loop)
        self.gone = loop.create_future()


def loop_closes_pipe_fds(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop's pipe transports close the fd themselves rather than through the file
    object: uvloop's do (libuv closes it), then call the file object's close() as well, which
    would close the same number a second time, by then maybe another thread's new fd."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


async def wait_pid_exit(pid: int, poll: Callable[[], int | None], timeout: float) -> int | None:
    """Wait up to `timeout` s for child `pid` to exit without blocking the loop (a pidfd when
    the kernel has them, else polling); `poll()` reaps it and returns its status or None."""
    if (rc := poll()) is not None:
        return rc
    loop = asyncio.get_running_loop()
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)  # type: ignore[attr-defined]
    try:
        if pidfd is not None:  # readable once the process has exited
            exited = loop.create_future()
            def on_exit() -> None:
                if not exited.done():
                    exited.set_result(None)
            loop.add_reader(pidfd, on_exit)
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(exited, timeout)
            finally:
                loop.remove_reader(pidfd)
            return poll()
        deadline = loop.time() + timeout
        delay = 0.001
        while (rc := poll()) is None and loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        return rc
    finally:
        if pidfd is not None:
            os.close(pidfd)


class PipeTransport:
    """The byte-stream half shared by every local transport: the worker's stdin, stdout and
    stderr are pipes whose fds `_connect` hands to the running loop; stderr is kept as a short
    tail for diagnostics. Subclasses start, wait for and kill the process.

    An fd handed to the loop is the loop's to close: uvloop closes it in libuv only when the
    transport's close callback runs, a loop iteration after `close()`. Closing it ourselves
    before that (as this class once did) freed the number while libuv still had it, so the next
    socket or pipe the process opened got it, libuv's deferred close then closed *that* one,
    and the loop aborted (epoll_ctl EBADF) or another connection lost its fd. So `_disconnect`
    waits for every transport to report its pipe closed and closes only the fds no transport
    took.
    """

    def __init__(self, *, stderr_tail: int = 8192):
        self._tail_size = stderr_tail
        self._tail = b""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._transports: list[asyncio.BaseTransport] = []
        self._gone: list[asyncio.Future[None]] = []
        self._loose: list[int] = []     # our fds of the pipes no transport has taken yet
        self._drain: asyncio.Task[None] | None = None
        self._killed = False

    def _own(self, stdin: int, stdout: int, stderr: int) -> None:
        """Take the fds of our ends of the three pipes (we close them unless a transport
        takes them)."""
        self._loose = [stdin, stdout, stderr]

    async def _connect(self) -> None:
        """Hand the fds given to `_own` to the running loop as pipe transports."""
        loop = asyncio.get_running_loop()
        closefd = not loop_closes_pipe_fds(loop)
        stdin, stdout, stderr = self._loose

        def pipe(fd: int, mode: str) -> Any:
            # From here on the fd is the loop's: its transport closes it, even if connecting
            # fails after the transport was made (and the file object, on the stock loop, if
            # no transport was made at all).
            self._loose.remove(fd)
            return os.fdopen(fd, mode, buffering=0, closefd=closefd)

        reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        rt, rp = await loop.connect_read_pipe(lambda: _ReadPipeProtocol(reader, loop),
                                              pipe(stdout, "rb"))
        self._transports.append(rt)
        self._gone.append(rp.gone)
        err = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        et, ep = await loop.connect_read_pipe(lambda: _ReadPipeProtocol(err, loop),
                                              pipe(stderr, "rb"))
        self._transports.append(et)
        self._gone.append(ep.gone)
        wt, wp = await loop.connect_write_pipe(lambda: _WritePipeProtocol(loop),
                                               pipe(stdin, "wb"))
        self._transports.append(wt)
        self._gone.append(wp.gone)
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

    async def _disconnect(self) -> None:
        """After the process is gone: close the fds no transport took, let stderr drain, have
        the loop close its pipes and wait until it has."""
        loose, self._loose = self._loose, []
        for fd in loose:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._drain is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._drain, 1)
        for t in self._transports:
            if t.is_closing():   # e.g. the worker closed its end: already on its way
                continue
            if isinstance(t, asyncio.WriteTransport):
                t.abort()   # nothing left to deliver: do not wait for a full pipe to drain
            else:
                t.close()
        if self._gone:
            # The close callbacks run on the next loop iteration; the timeout only guards
            # against a loop that never reports the loss.
            await asyncio.wait(self._gone, timeout=5)

    @property
    def returncode(self) -> int | None:
        raise NotImplementedError

    def diagnostics(self) -> str:
        text = describe_exit(self.returncode)
        tail = self._tail.decode("utf-8", errors="replace").strip()
        if tail:
            text += "; its last error output was:\n" + tail[-2000:]
        return text


class SubprocessTransport(PipeTransport):
    """A local command whose stdin/stdout carry the protocol, in its own session.

    Started at `start()` from `argv`, or (`proc=`) a process already started with
    `subprocess.Popen` (pipes for all three streams, its own session), possibly from another
    thread before this loop existed: that is what lets a process-wide pool of pre-started
    workers serve `asyncio.run()` calls that each bring a new loop. Either way the pipes are
    attached to the loop the same way and the exit is awaited with a pidfd, so no child watcher
    thread is involved.
    """

    def __init__(self, argv: Sequence[str] | None = None, *,
                 proc: subprocess.Popen[bytes] | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 pass_fds: Sequence[int] = (), stderr_tail: int = 8192,
                 marker: str | None = None, on_start: Callable[[int], None] | None = None):
        super().__init__(stderr_tail=stderr_tail)
        self.on_start = on_start   # called with the pid once the process exists
        if (argv is None) == (proc is None):
            raise ValueError("give either argv or proc")
        if proc is not None and (proc.stdin is None or proc.stdout is None
                                 or proc.stderr is None):
            raise ValueError("the process needs stdin, stdout and stderr pipes")
        self.argv = list(argv) if argv is not None else list(proc.args)  # type: ignore
        self.marker = marker   # see kill_tree
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.pass_fds = tuple(pass_fds)
        self._proc = proc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    async def start(self) -> None:
        if self._proc is None:
            # Popen forks in the loop's thread, as asyncio.create_subprocess_exec does too.
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, bufsize=0, env=self.env, cwd=self.cwd,
                pass_fds=self.pass_fds,
                start_new_session=True)  # its own process group, so kill() reaches the group
        proc = self._proc
        if self.on_start is not None:
            self.on_start(proc.pid)
        self._own(*take_popen_pipes(proc))
        await self._connect()

    async def wait_exit(self, timeout: float) -> int | None:
        """Wait up to `timeout` s for the process to exit on its own; return its status."""
        if self._proc is None:
            return None
        return await wait_pid_exit(self._proc.pid, self._proc.poll, timeout)

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        proc = self._proc
        if proc is None:
            return
        kill_tree(proc.pid, alive=proc.poll() is None, marker=self.marker)
        await self.wait_exit(10)
        # The group may outlive its leader (POSIX; Windows has no process groups to kill).
        if hasattr(os, "killpg"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        await self._disconnect()
        close_popen_pipes(proc)   # a start cut short before it took them


class AdoptedTransport(SubprocessTransport):
    """`SubprocessTransport` over a process started earlier (a pre-started spare worker)."""

    def __init__(self, proc: subprocess.Popen[bytes], *, stderr_tail: int = 8192,
                 marker: str | None = None, on_start: Callable[[int], None] | None = None):
        super().__init__(proc=proc, stderr_tail=stderr_tail, marker=marker, on_start=on_start)


def take_popen_pipes(proc: subprocess.Popen[bytes]) -> tuple[int, int, int]:
    """Our own fds of a process's stdin, stdout and stderr pipes, its file objects closed (so
    that neither they nor `close_popen_pipes` can close a number a loop owns later)."""
    fds = []
    for f in (proc.stdin, proc.stdout, proc.stderr):
        assert f is not None
        fds.append(os.dup(f.fileno()))
        f.close()
    return fds[0], fds[1], fds[2]


def close_popen_pipes(proc: subprocess.Popen[bytes]) -> None:
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
