"""Host side of the zygote (zygote.py): one fork server per sandbox configuration, and the
transport of a worker it forks.

Starting a worker the plain way costs a bubblewrap, an interpreter and the worker's imports:
about 90 ms of CPU per run, all of it on the host's cores. The zygote pays that once; each run
is then a fork plus its own namespaces, cgroup and uid (see zygote.py), a few ms of CPU.

The zygote is spawned from its own daemon thread, which then reads the control socket for the
zygote's life: bubblewrap's --die-with-parent fires when the *thread* that forked it ends, and
nothing here depends on any event loop, so one zygote serves every `asyncio.run()` of the
process. Its directory of runs (`runs_dir`, bound at /recursa/runs) outlives a zygote that
died; the next spawn starts a new zygote over the same directory.
"""

from __future__ import annotations

import array
import asyncio
import concurrent.futures as cf
import contextlib
import itertools
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from typing import Any

from recursa.base.background import BACKGROUND, WORKERS
from recursa.base.tempdirs import owned_tempdir
from recursa.sandbox.transport import PipeTransport, kill_tree

log = logging.getLogger("recursa.sandbox")


class ZygoteError(OSError):
    """The zygote could not start a run (or is not usable on this host)."""


class Zygote:
    """One zygote process and its control socket. Thread-safe."""

    def __init__(self, command: Any, runs_dir: str):
        self._command = command          # (runs_dir, control fd) -> argv
        self.runs_dir = runs_dir
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._spawned: dict[int, cf.Future[int | None]] = {}
        self._exits: dict[int, cf.Future[int]] = {}
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 - the zygote's stderr, for errors
        self._dead: str | None = None
        self._up = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="recursa-zygote", daemon=True)
        self._thread.start()
        self._up.wait(30)
        if self._sock is None and self._dead is None:
            self._dead = "the zygote did not start"

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # -- the control thread
    def _serve(self) -> None:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                self._proc = subprocess.Popen(
                    self._command(self.runs_dir, child.fileno()), pass_fds=[child.fileno()],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err,
                    start_new_session=True)
            except OSError as exc:
                self._dead = f"the zygote could not be started: {exc}"
                return
            finally:
                child.close()
            self._sock = host
            with contextlib.suppress(OSError):   # the run's pid comes with "spawned"
                host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._up.set()
            creds_size = socket.CMSG_SPACE(struct.calcsize("3i"))
            while True:
                try:
                    data, anc, _, _ = host.recvmsg(65536, creds_size)
                except OSError:
                    data, anc = b"", []
                if not data:
                    break
                pid = None
                for level, kind, raw in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        pid = struct.unpack("3i", raw[:struct.calcsize("3i")])[0]
                self._dispatch(json.loads(data), pid)
        finally:
            self._up.set()
            self._die(self._why())

    def _why(self) -> str:
        rc = self._proc.wait() if self._proc is not None else None
        with contextlib.suppress(OSError, ValueError):   # ValueError: closed by close()
            self._err.seek(0)
            tail = self._err.read()[-2000:].decode(errors="replace").strip()
            if tail:
                return f"the zygote exited (status {rc}): {tail}"
        return f"the zygote exited (status {rc})"

    def _dispatch(self, msg: dict[str, Any], pid: int | None) -> None:
        rid = msg.get("id")
        if not isinstance(rid, int):   # not a reply to anything we sent
            return
        with self._lock:
            if msg.get("op") == "spawned":
                fut = self._spawned.pop(rid, None)
                if fut is not None and not fut.done():
                    if msg.get("error"):
                        fut.set_exception(ZygoteError(msg["error"]))
                        self._exits.pop(rid, None)
                    else:   # the run's init, as this host sees it (0: not in our namespace)
                        fut.set_result(pid if msg.get("pid") and pid else None)
            elif msg.get("op") == "exit":
                ex = self._exits.pop(rid, None)
                if ex is not None and not ex.done():
                    ex.set_result(int(msg.get("status", 1)))

    def _die(self, why: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = why
            for fut in self._spawned.values():
                if not fut.done():
                    fut.set_exception(ZygoteError(why))
            for ex in self._exits.values():
                if not ex.done():
                    ex.set_result(-9)   # the pid namespace went with the zygote
            self._spawned.clear()
            self._exits.clear()

    # -- used by transports (any thread)
    def spawn(self, req: dict[str, Any], fds: list[int]) -> tuple[
            int, cf.Future[int | None], cf.Future[int]]:
        """Ask for a run; the caller closes `fds` after this returns (they were sent). The
        first future gives the host pid of the run's init (None if unknown) once it started."""
        with self._lock:
            if self._dead is not None or self._sock is None:
                raise ZygoteError(self._dead or "the zygote is not running")
            rid = next(self._ids)
            spawned: cf.Future[int | None] = cf.Future()
            exited: cf.Future[int] = cf.Future()
            self._spawned[rid] = spawned
            self._exits[rid] = exited
            msg = json.dumps({"op": "spawn", "id": rid, **req}).encode()
            try:
                self._sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", fds))])
            except OSError as exc:
                self._spawned.pop(rid, None)
                self._exits.pop(rid, None)
                raise ZygoteError(f"the zygote is gone: {exc}") from None
        return rid, spawned, exited

    def kill(self, rid: int) -> None:
        with self._lock:
            if self._sock is None or self._dead is not None:
                return
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps({"op": "kill", "id": rid}).encode())

    def close(self) -> None:
        """Stop the zygote (every run it started dies with its pid namespace)."""
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._proc is not None and self._proc.poll() is None:
            kill_tree(self._proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        if self._thread is not threading.current_thread():
            self._thread.join(5)     # it ends with the socket; shutdown leaves no thread
        self._err.close()


class ZygoteHost:
    """The zygote of one configuration: started on first use, restarted if it died; its runs'
    directories live in `runs_dir` for as long as this object."""

    def __init__(self, command: Any):
        self._command = command
        self._lock = threading.Lock()
        self._zygote: Zygote | None = None
        self.runs_dir = owned_tempdir("recursa-runs-")
        self.starts = 0

    def get(self) -> Zygote:
        with self._lock:
            z = self._zygote
            if z is None or not z.alive:
                if z is not None:
                    z.close()
                z = self._zygote = Zygote(self._command, self.runs_dir)
                self.starts += 1
            return z

    def new_run_dir(self) -> str:
        d = tempfile.mkdtemp(prefix="run-", dir=self.runs_dir)
        os.chmod(d, 0o700)
        return d

    def close(self) -> None:
        with self._lock:
            z, self._zygote = self._zygote, None
        if z is not None:
            z.close()
        shutil.rmtree(self.runs_dir, ignore_errors=True)


class ZygoteTransport(PipeTransport):
    """A worker forked by the zygote for one run. The pipes are made here and their far ends
    sent to the zygote; the worker's exit status comes back over the control socket."""

    def __init__(self, host: ZygoteHost, req: dict[str, Any], *,
                 cgroup_fds: Any = None, start_timeout: float = 30.0,
                 stderr_tail: int = 8192):
        super().__init__(stderr_tail=stderr_tail)
        self._host = host
        self._req = req
        self._cgroup_fds = cgroup_fds      # callable -> list of fds, or None
        self._timeout = start_timeout
        self._zygote: Zygote | None = None
        self._rid: int | None = None
        self._exited: cf.Future[int] | None = None
        self.pid: int | None = None        # the run's init on this host (its tree is the run)

    @property
    def returncode(self) -> int | None:
        ex = self._exited
        if ex is not None and ex.done():
            return ex.result()
        return None

    async def start(self) -> None:
        zygote = self._host.get()
        if not zygote.alive:
            raise ZygoteError(zygote._dead or "the zygote is not running")
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        # the worker's fd 0 reads what we write; its fds 1 and 2 write what we read
        stdio = [pipes[0][0], pipes[1][1], pipes[2][1]]
        mine = [pipes[0][1], pipes[1][0], pipes[2][0]]
        sent = list(stdio)
        try:
            if self._cgroup_fds is not None:
                sent += self._cgroup_fds()
            rid, spawned, exited = zygote.spawn(self._req, sent)
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in sent:   # the zygote has its own copies now
                os.close(fd)
        self._zygote, self._rid, self._exited = zygote, rid, exited
        self._own(*mine)
        try:
            self.pid = await asyncio.wait_for(asyncio.wrap_future(spawned), self._timeout)
        except TimeoutError:
            raise ZygoteError("the zygote did not answer") from None
        await self._connect()

    async def wait_exit(self, timeout: float) -> int | None:
        if self._exited is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._exited)), timeout)
        return self.returncode

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        if self._zygote is not None and self._rid is not None:
            self._zygote.kill(self._rid)
            await self.wait_exit(10)
        await self._disconnect()   # closes our ends of the pipes (see PipeTransport)


# ------------------------------------------------------------------ one per configuration
_HOSTS: dict[Any, ZygoteHost] = {}
_HOSTS_LOCK = threading.Lock()
_PID = os.getpid()


MAX_IDLE = 4   # zygotes of configurations with no open sandbox kept beyond this are stopped


def zygote_host(key: Any, command: Any) -> ZygoteHost:
    """The zygote of configuration `key` (made on first use). Each configuration (limits,
    tmp size, interpreter) has its own; zygotes with no open sandbox, beyond the `MAX_IDLE` most
    recently used, are stopped."""
    global _PID
    idle: list[ZygoteHost] = []
    BACKGROUND.attach(_ZYGOTES, WORKERS)
    with _HOSTS_LOCK:
        if _PID != os.getpid():   # forked: the parent's zygotes are not ours
            _HOSTS.clear()
            _PID = os.getpid()
        h = _HOSTS.pop(key, None) or ZygoteHost(command)
        _HOSTS[key] = h           # most recently used last
        for k in list(_HOSTS)[:-1][:max(0, len(_HOSTS) - 1 - MAX_IDLE)]:
            if not _has_runs(_HOSTS[k]):
                idle.append(_HOSTS.pop(k))
    for old in idle:
        old.close()
    return h


def _has_runs(h: ZygoteHost) -> bool:
    try:
        return bool(os.listdir(h.runs_dir))   # an open sandbox keeps its run directory
    except OSError:
        return False


def shutdown() -> None:
    """Stop every zygote of this process (they start again on the next run)."""
    with _HOSTS_LOCK:
        if _PID != os.getpid():
            return
        hosts = list(_HOSTS.values())
        _HOSTS.clear()
    for h in hosts:
        h.close()


class _Zygotes:
    """The zygotes as a part of recursa.base.background."""

    def shutdown(self) -> None:
        shutdown()

    def after_fork_in_child(self) -> None:
        global _HOSTS_LOCK, _PID
        _HOSTS_LOCK = threading.Lock()
        _HOSTS.clear()            # the parent's zygotes, for the parent to stop
        _PID = os.getpid()


_ZYGOTES = _Zygotes()
