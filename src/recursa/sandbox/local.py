"""LocalSandbox: the default sandbox, one worker subprocess per RLM, under bubblewrap if present.

What is enforced (all configurable):
  * a clean environment (no host variables, hence no API keys), a private workspace as cwd/HOME;
  * rlimits set by the worker on itself before any user code runs: address space
    (`memory_mb`), CPU seconds over the worker's life (`cpu_seconds`), largest file written
    (`file_size_mb`), and processes (`max_processes`, see below);
  * a cap on the workspace's total size (`disk_mb`), watched by the host while a cell runs:
    over it, the worker is killed and restarted and the workspace emptied (a per-file limit
    alone would let many files fill the disk);
  * with bubblewrap: no network, a private pid/ipc/uts namespace, only /usr (+ /bin, /lib
    links), a few /etc files, the Python installation (read-only, at /recursa/python), the
    worker and the context (read-only, at /recursa/), the workspace (at /workspace) and a
    size-capped tmpfs /tmp are visible. It dies with its parent.

Processes: RLIMIT_NPROC is counted per *user id* and root is exempt from it, so it only means
something when the worker runs as its own uid. When the host runs as root under bubblewrap,
the worker therefore drops to a random unprivileged uid (200000-265535) after opening the
context, and the limit applies to that uid alone. Otherwise the process limit is not applied
(it would count every process of the host user) and `isolation` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from recursa.sandbox.session import WorkerSession
from recursa.sandbox.transport import SubprocessTransport
from recursa.types import CallHandler, Cell, ContextPayload, SandboxError

log = logging.getLogger("recursa.sandbox")

WORKER_PATH = Path(__file__).with_name("worker.py")
_IN = "/recursa"  # where the sandbox sees our files under bwrap
_warned_no_bwrap = False
_bwrap_ok: dict[str, bool] = {}


def base_python() -> str:
    """The base interpreter (not the venv's), so the worker sees only the stdlib."""
    base = os.path.realpath(sys.base_prefix)
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (os.path.join(base, "bin", name), os.path.join(base, "bin", "python3")):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.realpath(cand)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def find_bwrap() -> str | None:
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


def _bwrap_works(bwrap: str) -> bool:
    """bwrap may be installed yet unusable (e.g. in a container without user namespaces)."""
    if bwrap not in _bwrap_ok:
        args = [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "true"]
        try:
            ok = subprocess.run(args, capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        _bwrap_ok[bwrap] = ok
    return _bwrap_ok[bwrap]


class LocalSandbox:
    """A persistent REPL in a local subprocess; see the module docstring for what is isolated.

    isolation: "auto" (bubblewrap when usable, else limits only), "bwrap" (required) or
    "limits" (rlimits and a clean env only). After construction the attribute `isolation`
    holds a human-readable description of what is actually in force.
    """

    def __init__(self, *, isolation: Literal["auto", "bwrap", "limits"] = "auto",
                 memory_mb: int | None = 4096, cpu_seconds: int | None = 3600,
                 file_size_mb: int | None = 1024, max_processes: int | None = 256,
                 tmp_mb: int = 256, disk_mb: int | None = 4096,
                 python: str | None = None, bwrap: str | None = None,
                 drop_uid: bool = True, interrupt_grace: float = 2.0,
                 start_timeout: float = 60.0):
        if isolation not in ("auto", "bwrap", "limits"):
            raise ValueError(f"isolation must be auto, bwrap or limits, not {isolation!r}")
        self.memory_mb = memory_mb
        self.cpu_seconds = cpu_seconds
        self.file_size_mb = file_size_mb
        self.max_processes = max_processes
        self.tmp_mb = tmp_mb
        self.disk_mb = disk_mb
        self.disk_poll = 0.2
        self.python = python or base_python()
        self.interrupt_grace = interrupt_grace
        self.start_timeout = start_timeout
        bw = bwrap or find_bwrap()
        if isolation == "limits":
            self.mode = "limits"
        elif bw and _bwrap_works(bw):
            self.mode = "bwrap"
        elif isolation == "bwrap":
            raise SandboxError("isolation='bwrap' was requested but bubblewrap is not usable")
        else:
            self.mode = "limits"
            global _warned_no_bwrap
            if not _warned_no_bwrap:
                _warned_no_bwrap = True
                log.warning("bubblewrap (bwrap) is not available: the local sandbox runs with "
                            "resource limits and a clean environment only; model code can read "
                            "your files and use the network")
        self.bwrap = bw
        self.uid: int | None = None
        if self.mode == "bwrap" and drop_uid and os.geteuid() == 0:
            self.uid = random.randint(200000, 265535)
        self.isolation = self._describe()
        self.workspace: str | None = None
        self._session: WorkerSession | None = None
        self._closed = False

    def _describe(self) -> str:
        lim = []
        if self.memory_mb:
            lim.append(f"memory {self.memory_mb} MB")
        if self.cpu_seconds:
            lim.append(f"cpu {self.cpu_seconds} s")
        if self.file_size_mb:
            lim.append(f"file size {self.file_size_mb} MB")
        if self.max_processes and self.uid is not None:
            lim.append(f"processes {self.max_processes}")
        if self.disk_mb:
            lim.append(f"workspace {self.disk_mb} MB")
        limits = ", ".join(lim) or "none"
        if self.mode == "bwrap":
            who = f"uid {self.uid}" if self.uid is not None else "host uid"
            return (f"bubblewrap (no network, private fs, {who}; limits: {limits})")
        return f"limits only, no bubblewrap (not isolated from files or network; limits: {limits})"

    # ------------------------------------------------------------ Sandbox protocol
    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        if self._session is not None:
            raise SandboxError("the sandbox was already started")
        if not os.path.isfile(payload.path):
            raise SandboxError(f"context file not found: {payload.path}")
        self.workspace = tempfile.mkdtemp(prefix="recursa-ws-")
        if self.uid is not None:
            os.chown(self.workspace, self.uid, self.uid)
        argv, env, cwd, ctx_path = self._command(os.path.realpath(payload.path))
        self._session = WorkerSession(
            lambda: SubprocessTransport(argv, env=env, cwd=cwd),
            context_path=ctx_path, kind=payload.kind, handler=handler,
            start_timeout=self.start_timeout, interrupt_grace=self.interrupt_grace)
        try:
            await self._session.start()
        except BaseException:
            await self.close()
            raise

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self._session is None:
            raise SandboxError("the sandbox was not started")
        session = self._session
        if not self.disk_mb or not self.workspace:
            return await session.run(code, timeout=timeout, max_output_chars=max_output_chars)
        watch = asyncio.create_task(self._watch_disk(session))
        try:
            cell = await session.run(code, timeout=timeout, max_output_chars=max_output_chars)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        if await asyncio.to_thread(self._over_disk):   # written faster than we looked
            await asyncio.to_thread(self._empty_workspace)
            cell.stderr = (f"note: the workspace exceeded its {self.disk_mb} MB limit; its "
                           f"files were deleted\n") + cell.stderr
        return cell

    def _over_disk(self) -> bool:
        assert self.workspace is not None and self.disk_mb
        return disk_usage(self.workspace, limit=self.disk_mb * 1024 * 1024) is None

    def _empty_workspace(self) -> None:
        assert self.workspace is not None
        for entry in os.listdir(self.workspace):
            path = os.path.join(self.workspace, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    async def _watch_disk(self, session: WorkerSession) -> None:
        """While a cell runs: over `disk_mb`, kill the worker (it restarts) and empty the
        workspace, so that many files under the per-file limit cannot fill the host's disk."""
        while True:
            await asyncio.sleep(self.disk_poll)
            if await asyncio.to_thread(self._over_disk):
                await session.abort(f"its workspace exceeded the {self.disk_mb} MB limit, so "
                                    f"it was stopped and the workspace emptied")
                await asyncio.to_thread(self._empty_workspace)
                return

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        try:
            if session is not None:
                await asyncio.shield(session.close())
        finally:
            if self.workspace:
                shutil.rmtree(self.workspace, ignore_errors=True)

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def session(self) -> WorkerSession | None:
        return self._session


    # ------------------------------------------------------------ command line
    def _limits(self) -> dict[str, int]:
        mb = 1024 * 1024
        lim: dict[str, int] = {"core": 0}
        if self.memory_mb:
            lim["as"] = self.memory_mb * mb
        if self.cpu_seconds:
            lim["cpu"] = self.cpu_seconds
        if self.file_size_mb:
            lim["fsize"] = self.file_size_mb * mb
        if self.max_processes and self.uid is not None:
            lim["nproc"] = self.max_processes
        return lim

    def _command(self, context: str) -> tuple[list[str], dict[str, str], str, str]:
        assert self.workspace is not None
        env = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
               "PYTHONUNBUFFERED": "1"}
        limits = ["--limits", json.dumps(self._limits())]
        if self.mode == "limits":
            env.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=self.workspace,
                       TMPDIR=self.workspace)
            argv = [self.python, "-I", "-S", str(WORKER_PATH), *limits]
            return argv, env, self.workspace, context

        assert self.bwrap is not None
        prefix = os.path.realpath(sys.base_prefix)
        python = self.python
        relocate = not prefix.startswith("/usr/")
        if relocate:  # show the interpreter at a neutral path so nothing of /root etc. leaks
            if not python.startswith(prefix + "/"):
                raise SandboxError(f"interpreter {python} is not inside {prefix}")
            python = f"{_IN}/python" + python[len(prefix):]
        env.update(PATH=f"{_IN}/python/bin:/usr/bin:/bin", HOME="/workspace", TMPDIR="/tmp")
        if relocate:
            env["LD_LIBRARY_PATH"] = f"{_IN}/python/lib"  # for --enable-shared builds

        a = [self.bwrap, "--die-with-parent", "--new-session", "--clearenv"]
        if self.uid is not None:
            # Privileged bwrap without a user namespace, so the worker can setuid() itself to
            # its own uid (CAP_SETUID is then dropped by the kernel).
            a += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                  "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            a += ["--unshare-all"]
        a += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(top):
                a += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                a += ["--ro-bind", top, top]
        for f in ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf"):
            a += ["--ro-bind-try", f, f]
        a += ["--perms", "0755", "--dir", _IN]
        if relocate:
            a += ["--ro-bind", prefix, f"{_IN}/python"]
        a += ["--ro-bind", str(WORKER_PATH), f"{_IN}/worker.py",
              "--ro-bind", context, f"{_IN}/context",
              "--bind", self.workspace, "/workspace",
              "--perms", "1777", "--size", str(self.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
              "--proc", "/proc", "--dev", "/dev", "--chdir", "/workspace"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        a += ["--", python, "-I", "-S", f"{_IN}/worker.py", *limits]
        if self.uid is not None:
            a += ["--preopen", f"{_IN}/context", "--uid", str(self.uid), "--gid", str(self.uid)]
        return a, {}, self.workspace, f"{_IN}/context"


def disk_usage(root: str, *, limit: int, max_entries: int = 200_000) -> int | None:
    """Bytes allocated under `root`, or None once over `limit` bytes or `max_entries` files
    (a million empty files is also an attack on the disk)."""
    total = 0
    entries = 0
    todo = [root]
    while todo:
        try:
            it = os.scandir(todo.pop())
        except OSError:
            continue
        with it:
            for e in it:
                entries += 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += getattr(st, "st_blocks", 0) * 512 or st.st_size
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                if total > limit or entries > max_entries:
                    return None
    return total
