"""LocalSandbox: the default sandbox, one worker process per run, under bubblewrap.

Without a usable bubblewrap it refuses to start (isolation.py says why and what to do);
`isolation="limits"` (sandbox kind "limits") runs the worker unconfined, by explicit choice.

What is enforced (all configurable):
  * a clean environment (no host variables, hence no API keys), a private workspace as cwd/HOME;
  * rlimits set by the worker on itself before any user code runs: address space
    (`memory_mb`), CPU seconds over the worker's life (`cpu_seconds`), largest file written
    (`file_size_mb`), and processes (`max_processes`, see below);
  * limits on the whole process tree (treelimits.py): memory (`memory_mb`) and processes
    (`max_processes`, default 64, threads count) through a control group of the sandbox's own
    where the host can make one (cgroup v2 or v1), else a host-side watch of the tree's resident
    memory that stops and restarts the worker; `tree_limits` and `isolation` say which;
  * a cap on the workspace's total size (`disk_mb`). A worker forked by the zygote gets a
    workspace that is a size-capped tmpfs (zygote.py): the kernel refuses the write that would
    pass it (ENOSPC), and its files count against the memory caps. Elsewhere the host watches
    the workspace from start to close, between cells too: over it, the worker is killed and
    restarted and the workspace emptied (a per-file limit alone would let many files fill the
    disk); a breach between cells is reported by the next cell. Either way no one file may
    exceed the cap (RLIMIT_FSIZE is the smaller of `file_size_mb` and `disk_mb`);
  * with bubblewrap: no network, a private pid/ipc/uts namespace, only /usr (+ /bin, /lib
    links), a few /etc files, the Python installation (read-only, at /recursa/python), the
    worker and the context (read-only, at /recursa/), the workspace (at /workspace) and a
    size-capped tmpfs /tmp are visible. It dies with its parent.

How a worker starts. Starting bubblewrap and a bare interpreter and importing the worker's
modules costs ~90 ms of CPU. Two ways avoid paying it per run:
  * the zygote (forkserver.py, zygote.py; with bubblewrap, the default): one fork server per
    configuration, inside one bubblewrap, with the worker imported; each run is a fork that
    enters its own mount, pid, network, IPC, UTS and cgroup namespaces, sees only its own
    workspace, context and /tmp, joins its own cgroup (if any) and, as root, drops to its own
    uid; without root (Linux 5.14+) the zygote is in an unprivileged user namespace and each
    run enters a nested one of its own with no capabilities. About 10-15 ms of CPU per start,
    all of it counted. `zygote=False` / RECURSA_ZYGOTE=0 turn it off.
  * spares (elsewhere: `isolation="limits"`, or a kernel older than 5.14 without root, or where
    the zygote cannot start): a process-wide pool keeps
    `prewarm` (default 1, env RECURSA_PREWARM; 0 disables) started workers per configuration,
    spawned with plain `subprocess.Popen` from one long-lived thread (they are not tied to any
    event loop), and `start()` adopts one into the current loop; the next spare is started in
    the background. That hides the start's latency, not its CPU.
Either way the context is not known when the worker starts: it is bound as a private, read-only
directory (/recursa/ctx) into which `start()` hard-links (or copies) the payload file, and the
worker first waits for `init`, opens that file, and only then drops its uid and serves cells
(`--late-context`); nothing but `init` is accepted before the drop. A spare is used once; one
that died or is older than RECURSA_PREWARM_MAX_AGE seconds (600) is discarded and replaced; all
are killed at interpreter exit, and die with the host anyway (bwrap --die-with-parent /
PR_SET_PDEATHSIG; a zygote's runs die with its pid namespace). The directories of a killed host
are named after it (`recursa.base.tempdirs.owned_tempdir`) and removed by the next process's sweep.

Processes: RLIMIT_NPROC is counted per *user id* and root is exempt from it, so it only means
something when the worker runs as its own uid. When the host runs as root under bubblewrap,
the worker therefore drops to an unprivileged uid of its own (leased by uids.py: unique
among live workers, outside the usual subordinate uid ranges) after opening the context, and
the limit applies to that uid alone. Without root, a zygote's run has a user namespace of its
own, and since Linux 5.14 RLIMIT_NPROC counts a uid's processes per
user namespace: the limit then holds for the run alone. With a cgroup, `pids.max` bounds the
tree in every mode; without one, a uid or a user namespace of its own the process limit is not
applied (it would count every process of the host user) and `isolation` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from recursa.base.background import BACKGROUND, WORKERS
from recursa.base.images import pillow_site
from recursa.base.tempdirs import owned_tempdir
from recursa.base.types import CallHandler, Cell, ContextPayload, SandboxError
from recursa.sandbox import budgets
from recursa.sandbox.budgets import HOST, MB, Member, RunTree
from recursa.sandbox.forkserver import ZygoteTransport, zygote_host
from recursa.sandbox.isolation import bwrap_works, find_bwrap, require_isolation
from recursa.sandbox.protocol import WORKER_PATH
from recursa.sandbox.session import WorkerSession
from recursa.sandbox.transport import (
    AdoptedTransport,
    SubprocessTransport,
    close_popen_pipes,
    descendants,
    kill_tree,
)
from recursa.sandbox.treelimits import WATCH, RunCgroup, cgroup_host, processes_of_uid
from recursa.sandbox.uids import lease_uid, release_uid

log = logging.getLogger("recursa.sandbox")

ZYGOTE_PATH = Path(__file__).with_name("zygote.py")
_IN = "/recursa"  # where the sandbox sees our files under bwrap
_CTX_DIR = f"{_IN}/ctx"  # the worker's private context directory, read-only
_bwrap_works = bwrap_works   # the old private name, for callers that imported it


def base_python() -> str:
    """The base interpreter (not the venv's), so the worker sees only the stdlib."""
    base = os.path.realpath(sys.base_prefix)
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (os.path.join(base, "bin", name), os.path.join(base, "bin", "python3")):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.realpath(cand)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def nproc_per_userns() -> bool:
    """Whether RLIMIT_NPROC counts a uid's processes per user namespace (Linux 5.14+), so a
    run in a user namespace of its own can be limited without a uid of its own."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# ------------------------------------------------------------------ worker command lines
@dataclass(frozen=True)
class WorkerConfig:
    """What a worker's command line depends on, apart from its own directories and uid.

    Two sandboxes with equal configs get interchangeable workers, so this is the key of the
    pool of spares."""

    mode: str                       # "bwrap" | "limits"
    python: str
    bwrap: str | None
    limits: tuple[tuple[str, int], ...]
    tmp_mb: int
    drop_uid: bool                  # bwrap as root: each worker gets its own uid
    worker: str = str(WORKER_PATH)
    userns: bool = False            # bwrap without root: a zygote in a user namespace
    pillow: str | None = field(default_factory=pillow_site)   # for Image.crop in the worker

    def new_worker(self) -> WorkerSpec:
        """Make a worker's private directories (and uid) and its command line."""
        spec = WorkerSpec(workspace=owned_tempdir("recursa-ws-"))
        try:
            if self.drop_uid:
                spec.uid = lease_uid()
                os.chown(spec.workspace, spec.uid, spec.uid)
            if self.mode == "bwrap":
                spec.ctxdir = owned_tempdir("recursa-wctx-")
            spec.argv, spec.env, spec.cwd = self._command(spec)
        except BaseException:
            spec.cleanup()
            raise
        return spec

    def _command(self, spec: WorkerSpec) -> tuple[list[str], dict[str, str], str]:
        env = self._env()
        tail = ["--limits", json.dumps(dict(self.limits)), "--late-context",
                "--confine", "require"]
        if self.mode == "limits":
            env.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=spec.workspace,
                       TMPDIR=spec.workspace)
            tail += ["--pillow", self.pillow] if self.pillow else []
            return [self.python, "-I", "-S", self.worker, *tail], env, spec.workspace

        assert spec.ctxdir is not None
        a, python = self._bwrap(env, privileged=spec.uid is not None)
        # The context directory is empty until start() links the payload file into it: a
        # directory bind shows files added later, a file bind could not be re-pointed.
        a += ["--ro-bind", spec.ctxdir, _CTX_DIR,
              "--bind", spec.workspace, "/workspace",
              "--perms", "1777", "--size", str(self.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        a += self._bwrap_tail(env)
        a += ["--", python, "-I", "-S", f"{_IN}/worker.py", *tail]
        if spec.uid is not None:
            a += ["--uid", str(spec.uid), "--gid", str(spec.uid)]
        return a, {}, spec.workspace

    def zygote_command(self, runs_dir: str, control_fd: int) -> list[str]:
        """The zygote's command line (see zygote.py): like a worker's, plus the capabilities
        it needs to give each run its own namespaces, and every run's directories at
        /recursa/runs (each run unmounts them from its own view). Without root, in a user
        namespace of its own, with capabilities over its own namespaces only (zygote.py)."""
        assert self.drop_uid or self.userns
        env = self._env()
        env.update(HOME="/workspace", TMPDIR="/tmp")
        if self.userns:   # SETFCAP: to map its uid 0 into each run's user namespace
            a, python = self._bwrap(env, privileged=False, userns_caps=(
                "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETPCAP", "CAP_SETFCAP"))
        else:
            a, python = self._bwrap(env, privileged=True, extra_caps=(
                "CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_KILL", "CAP_NET_ADMIN",
                "CAP_DAC_READ_SEARCH"))
        a += ["--ro-bind", str(ZYGOTE_PATH), f"{_IN}/zygote.py",
              "--dir", _CTX_DIR, "--dir", "/workspace", "--dir", "/tmp",
              "--bind", runs_dir, f"{_IN}/runs"]
        a += self._bwrap_tail(env)
        return a + ["--", python, "-I", "-S", f"{_IN}/zygote.py", "--control-fd",
                    str(control_fd), *(["--userns"] if self.userns else [])]

    def program_command(self, argv: Sequence[str], *, ro: Sequence[tuple[str, str]] = (),
                        rw: Sequence[tuple[str, str]] = ()) -> list[str]:
        """bubblewrap around a program of recursa's own other than the REPL worker (the
        document parser, recursa.documents.confine), with what a worker gets: a clean
        environment, no network, its own pid/ipc/uts/user namespaces, only /usr, the interpreter
        (at /recursa/python when relocated) and a size-capped /tmp to see, no capabilities;
        plus the `ro` / `rw` binds (host path, path inside). `argv` follows the interpreter."""
        assert self.mode == "bwrap"
        env = self._env()
        a, python = self._bwrap(env, privileged=False)
        if os.geteuid() == 0:   # bwrap run by root keeps every capability unless told
            a += ["--cap-drop", "ALL"]
        for src, dst in ro:
            a += ["--ro-bind", src, dst]
        for src, dst in rw:
            a += ["--bind", src, dst]
        a += ["--dir", "/workspace",
              "--perms", "1777", "--size", str(self.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        a += self._bwrap_tail(env)
        return [*a, "--", python, *argv]

    @staticmethod
    def _env() -> dict[str, str]:
        return {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
                "PYTHONUNBUFFERED": "1"}

    def _bwrap(self, env: dict[str, str], *, privileged: bool,
               extra_caps: tuple[str, ...] = (),
               userns_caps: tuple[str, ...] = ()) -> tuple[list[str], str]:
        """bwrap's options up to the per-worker mounts; the interpreter's path inside."""
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
        if privileged:
            # Privileged bwrap without a user namespace, so the worker can setuid() itself to
            # its own uid (CAP_SETUID is then dropped by the kernel).
            a += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                  "--unshare-cgroup-try"]
            if extra_caps:   # the zygote: only what it needs (bwrap as root keeps all else)
                a += ["--cap-drop", "ALL"]
            for cap in ("CAP_SETUID", "CAP_SETGID", *extra_caps):
                a += ["--cap-add", cap]
        elif userns_caps:
            # Not root: uid 0 of a user namespace of its own (the host user outside), with
            # these capabilities over its own namespaces and nothing else.
            a += ["--unshare-user", "--uid", "0", "--gid", "0", "--unshare-ipc",
                  "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                  "--cap-drop", "ALL"]
            for cap in userns_caps:
                a += ["--cap-add", cap]
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
        a += ["--ro-bind", self.worker, f"{_IN}/worker.py"]
        if self.pillow:   # only PIL and its bundled libraries (the worker looks for them here)
            a += ["--perms", "0755", "--dir", f"{_IN}/site",
                  "--ro-bind", f"{self.pillow}/PIL", f"{_IN}/site/PIL",
                  "--ro-bind-try", f"{self.pillow}/pillow.libs", f"{_IN}/site/pillow.libs"]
        return a, python

    @staticmethod
    def _bwrap_tail(env: dict[str, str]) -> list[str]:
        # the root tmpfs (/recursa and the mount points) read-only: outside /workspace and /tmp
        # nothing is writable even without a uid drop (user namespace)
        a = ["--proc", "/proc", "--dev", "/dev", "--chdir", "/workspace", "--remount-ro", "/"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        return a


@dataclass
class WorkerSpec:
    """One worker's private directories, uid and command line (owned by one sandbox, or by
    the pool while it is a spare)."""

    workspace: str
    ctxdir: str | None = None       # host dir bound read-only at /recursa/ctx (bwrap)
    uid: int | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    root: str | None = None         # a zygote run's directory (holds workspace and ctxdir)

    def place_context(self, path: str) -> str:
        """Make the payload file visible to the worker; return its path as the worker sees it.
        Hard link when on the same filesystem (instant), else copy."""
        if self.ctxdir is None:
            return path
        dest = os.path.join(self.ctxdir, "context")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copyfile(path, dest)
        return f"{_CTX_DIR}/context"

    @property
    def marker(self) -> str | None:
        """A string only this worker's bwrap processes have in their command line."""
        return self.ctxdir

    def linkable(self, path: str) -> bool:
        if self.ctxdir is None:
            return True
        try:
            return os.stat(path).st_dev == os.stat(self.ctxdir).st_dev
        except OSError:
            return False

    def cleanup(self) -> None:
        for d in (self.workspace, self.ctxdir, self.root):
            if d:
                shutil.rmtree(d, ignore_errors=True)
        if self.uid is not None:   # its processes are gone: another worker may have it
            release_uid(self.uid)


def _spawn(spec: WorkerSpec) -> subprocess.Popen[bytes]:
    return subprocess.Popen(spec.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0, env=spec.env, cwd=spec.cwd,
                            start_new_session=True)


def _kill_now(spare: Spare) -> None:
    """SIGKILL a spare and everything under it (no waiting)."""
    kill_tree(spare.proc.pid, alive=spare.proc.poll() is None, marker=spare.spec.marker)


# ------------------------------------------------------------------ the pool of spares
@dataclass
class Spare:
    config: WorkerConfig
    spec: WorkerSpec
    proc: subprocess.Popen[bytes]
    born: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.proc.poll() is None


class SparePool:
    """Process-wide: up to `n` started, unused workers per `WorkerConfig`.

    Spares are spawned by one daemon thread that lives until `shutdown()`, because the
    parent-death signal bwrap and the worker set fires when the *thread* that forked them
    ends. Spares are therefore not tied to any event loop; a sandbox adopts one into its loop.
    A part of recursa.base.background: attached on the first `take()`, stopped
    by `recursa.base.background.shutdown()` or at exit.
    """

    MAX_CONFIGS = 4   # configs that keep spares; the least recently used beyond are dropped

    def __init__(self, max_age: float | None = None):
        self.max_age = float(max_age if max_age is not None else
                             _env_int("RECURSA_PREWARM_MAX_AGE", 600))
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._spares: dict[WorkerConfig, list[Spare]] = {}
        self._want: dict[WorkerConfig, int] = {}       # target number of spares
        self._used: dict[WorkerConfig, float] = {}     # last take(), for the LRU bound
        self._spawning: dict[WorkerConfig, int] = {}
        self._trash: list[Spare] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()
        self.spawned = 0
        self.taken = 0

    # -- used by sandboxes (any thread, any loop)
    def take(self, config: WorkerConfig, n: int) -> Spare | None:
        """A live spare for `config` (or None), and keep `n` of them ready from now on."""
        with self._cond:
            if self._closed or self._pid != os.getpid() or BACKGROUND.exiting:
                return None
            now = time.monotonic()
            lst = self._spares.setdefault(config, [])
            got = None
            while lst:
                s = lst.pop(0)
                if s.alive() and now - s.born < self.max_age:
                    got = s
                    break
                self._trash.append(s)
            while len(lst) > n:
                self._trash.append(lst.pop())
            self._want[config] = n
            self._used[config] = now
            for old in sorted(self._used, key=self._used.__getitem__)[:-self.MAX_CONFIGS]:
                self._forget(old)
            if got is not None:
                self.taken += 1
            self._wake()
        return got

    def discard(self, spare: Spare) -> None:
        """Kill an unused spare (in the background) and remove its directories."""
        _kill_now(spare)
        with self._cond:
            self._trash.append(spare)
            self._wake()

    def shutdown(self) -> None:
        """Kill every spare and stop the spawner thread; the next `take()` starts again."""
        with self._cond:
            if self._pid != os.getpid():
                return
            self._closed = True
            victims = [s for lst in self._spares.values() for s in lst] + self._trash
            self._spares.clear()
            self._trash = []
            self._want.clear()
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)   # it ends after the job in hand (a spawn it then disposes of)
        for s in victims:
            _kill_now(s)
        for s in victims:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(2)
            close_popen_pipes(s.proc)
            s.spec.cleanup()
        with self._cond:
            self._closed = False

    def after_fork_in_child(self) -> None:
        # The spares belong to the parent: drop our copies of their pipes, keep nothing.
        for lst in self._spares.values():
            for s in lst:
                close_popen_pipes(s.proc)
        self._reset()

    def pids(self, config: WorkerConfig | None = None) -> list[int]:
        """Pids of the spares now in the pool (for tests and diagnostics)."""
        with self._cond:
            return [s.proc.pid for k, lst in self._spares.items() for s in lst
                    if config in (None, k)]

    def count(self, config: WorkerConfig | None = None) -> int:
        with self._cond:
            return sum(len(v) for k, v in self._spares.items() if config in (None, k))

    def wait_ready(self, config: WorkerConfig, n: int = 1, timeout: float = 30.0) -> bool:
        """Block until `n` spares for `config` exist (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._spares.get(config, [])) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    # -- internals (called with the lock held unless noted)
    def _forget(self, config: WorkerConfig) -> None:
        self._trash.extend(self._spares.pop(config, []))
        self._want.pop(config, None)
        self._used.pop(config, None)

    def _wake(self) -> None:
        if self._thread is None:
            BACKGROUND.attach(self, WORKERS)
            self._thread = threading.Thread(target=self._serve, name="recursa-prewarm",
                                            daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _next_job(self) -> Any:
        if self._closed:
            return None
        now = time.monotonic()
        for lst in self._spares.values():
            for s in list(lst):
                if not s.alive() or now - s.born >= self.max_age:
                    lst.remove(s)
                    self._trash.append(s)
        if self._trash:
            trash, self._trash = self._trash, []
            return lambda: self._dispose(trash)
        for config, n in self._want.items():
            have = len(self._spares.get(config, [])) + self._spawning.get(config, 0)
            if have < n:
                self._spawning[config] = self._spawning.get(config, 0) + 1
                return lambda: self._spawn_one(config)
        return None

    def _idle_wait(self) -> float | None:
        borns = [s.born for lst in self._spares.values() for s in lst]
        if not borns:
            return None
        return max(0.05, min(borns) + self.max_age - time.monotonic())

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                job = self._next_job()
                while job is None:
                    if self._thread is not me:    # shut down
                        return
                    self._cond.wait(self._idle_wait())
                    job = self._next_job()
            try:
                job()
            except Exception:  # never let the thread die: its end would kill the spares
                log.exception("recursa prewarm: unexpected error")

    def _dispose(self, spares: list[Spare]) -> None:   # spawner thread, lock not held
        for s in spares:
            _kill_now(s)
        for s in spares:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(5)
            close_popen_pipes(s.proc)
            s.spec.cleanup()

    def _spawn_one(self, config: WorkerConfig) -> None:   # spawner thread, lock not held
        spec = proc = None
        try:
            spec = config.new_worker()
            proc = _spawn(spec)
        except Exception as exc:
            log.warning("recursa prewarm: could not start a spare worker: %s", exc)
            if spec is not None:
                spec.cleanup()
            with self._cond:
                self._spawning[config] -= 1
                self._want.pop(config, None)   # do not retry in a loop; the next take() will
            return
        spare = Spare(config, spec, proc)
        with self._cond:
            self._spawning[config] -= 1
            keep = (not self._closed and self._pid == os.getpid() and config in self._want
                    and len(self._spares.get(config, [])) < self._want[config])
            if keep:
                self._spares.setdefault(config, []).append(spare)
                self.spawned += 1
                self._cond.notify_all()
        if not keep:
            self._dispose([spare])


POOL = SparePool()


# ------------------------------------------------------------------ the sandbox
class LocalSandbox:
    """A persistent REPL in a local subprocess; see the module docstring for what is isolated.

    isolation: "auto" or "bwrap" (the default: bubblewrap; where it cannot work, the
    constructor raises IsolationUnavailable saying why and what to do), or "limits" (rlimits,
    a clean env and the seccomp filter only: NOT isolated from the host's files, network and
    processes; an explicit choice, also `make_sandbox("limits")`). After construction the
    attribute `isolation` holds a human-readable description of what is actually in force
    (after `start()`, with the worker's own uid).
    prewarm: how many started spare workers of this configuration to keep ready in the
    process-wide pool (default: env RECURSA_PREWARM, else 1; 0 starts every worker on demand).
    Not used when a zygote forks the workers.
    zygote: fork each worker from a per-configuration fork server (zygote.py) instead of
    starting bubblewrap and an interpreter per run (default: env RECURSA_ZYGOTE, else on). With
    bubblewrap as root (a uid per run), or without root on Linux 5.14+ (a user namespace per
    run); elsewhere spares are used.
    cgroups: limit memory and processes of each sandbox's whole process tree with its own
    control group where the host allows (default on; env RECURSA_CGROUPS=0 turns it off);
    otherwise a host thread watches the tree's resident memory (see treelimits.py).
    """

    def __init__(self, *, isolation: Literal["auto", "bwrap", "limits"] = "auto",
                 memory_mb: int | Literal["auto"] | None = "auto",
                 cpu_seconds: int | None = 3600,
                 file_size_mb: int | None = 1024, max_processes: int | None = 64,
                 tmp_mb: int = 256, disk_mb: int | None = 4096,
                 python: str | None = None, bwrap: str | None = None,
                 drop_uid: bool = True, interrupt_grace: float = 2.0,
                 start_timeout: float = 60.0, prewarm: int | None = None,
                 zygote: bool | None = None, cgroups: bool = True):
        if isolation not in ("auto", "bwrap", "limits"):
            raise ValueError(f"isolation must be auto, bwrap or limits, not {isolation!r}")
        self.memory_mb: int | None = budgets.default_run_memory_mb() if memory_mb == "auto" \
            else memory_mb
        self.cpu_seconds = cpu_seconds
        self.file_size_mb = file_size_mb
        self.max_processes = max_processes
        self.tmp_mb = tmp_mb
        self.disk_mb = disk_mb
        self.disk_poll = 0.2
        self.python = python or base_python()
        self.interrupt_grace = interrupt_grace
        self.start_timeout = start_timeout
        self.prewarm = max(0, prewarm if prewarm is not None else _env_int("RECURSA_PREWARM", 1))
        bw = bwrap or find_bwrap()
        if isolation == "limits":   # unconfined: only ever an explicit choice
            self.mode = "limits"
        else:   # never a silent fall back to no isolation (isolation.py says why and what to do)
            bw = require_isolation(bw)
            self.mode = "bwrap"
        self.bwrap = bw
        self.drop_uid = self.mode == "bwrap" and drop_uid and os.geteuid() == 0
        if zygote is None:
            zygote = _env_int("RECURSA_ZYGOTE", 1) != 0
        # Not root: the zygote runs in a user namespace and each run gets one of its own, where
        # RLIMIT_NPROC counts the run's processes alone (Linux 5.14+; older kernels count them
        # per host user, so neither is used there).
        self.userns = bool(zygote and self.mode == "bwrap" and os.geteuid() != 0
                           and nproc_per_userns())
        self.uid: int | None = None      # the current worker's own uid (set by start())
        self.config = WorkerConfig(
            mode=self.mode, python=self.python, bwrap=bw if self.mode == "bwrap" else None,
            limits=tuple(sorted(self._limits().items())), tmp_mb=self.tmp_mb,
            drop_uid=self.drop_uid, userns=self.userns)
        self.use_zygote = bool(zygote and (self.drop_uid or self.userns)
                               and self.config not in _NO_ZYGOTE)
        self._cg_host = (cgroup_host() if cgroups and (memory_mb or max_processes) else None)
        self.workspace: str | None = None
        self.prewarmed = False          # whether start() adopted a pre-started worker
        self.forked = False             # whether start() had the zygote fork the worker
        self._spec: WorkerSpec | None = None
        self._session: WorkerSession | None = None
        self._cgroup: RunCgroup | None = None
        self._disk_entries = 0          # files in the workspace at the last look
        self._watcher: asyncio.Task[None] | None = None
        # the run tree this sandbox shares its caps with (budgets.py): its own when it is a
        # top-level run's, else the one of the run whose REPL started this child run
        self._tree: RunTree | None = None
        self._owns_tree = False
        self._member: Member | None = None
        self._watch_key: int | None = None
        self._closed = False
        self.isolation = self._describe()

    @property
    def _disk_polled(self) -> bool:
        """Whether the host watches the workspace's size (not a capped tmpfs: not forked)."""
        return bool(self.disk_mb and self.workspace and not self.forked)

    @property
    def tree_limits(self) -> str:
        """How memory and processes are limited for the whole process tree: "cgroup v1",
        "cgroup v2" or "watch" (host-side watch of resident memory; processes per uid)."""
        return self._cg_host.describe() if self._cg_host is not None else "watch"

    def _describe(self) -> str:
        lim = []
        mech = self.tree_limits
        if self.memory_mb:
            how = mech if mech != "watch" else "host watch of resident memory"
            lim.append(f"memory {self.memory_mb} MB per process and for the whole tree ({how})")
        if self.cpu_seconds:
            lim.append(f"cpu {self.cpu_seconds} s")
        if self.file_size_mb or self.disk_mb:
            fsize = min(x for x in (self.file_size_mb, self.disk_mb) if x)
            lim.append(f"file size {fsize} MB")
        if self.max_processes and (mech != "watch" or self.drop_uid or self.userns):
            how = mech if mech != "watch" else (
                "RLIMIT_NPROC of its own uid" if self.drop_uid
                else "RLIMIT_NPROC of its own user namespace")
            lim.append(f"processes {self.max_processes} ({how})")
        if self.disk_mb:
            lim.append(f"workspace {self.disk_mb} MB" + (" (a capped tmpfs)" if self.use_zygote
                                                         else " (watched)"))
        limits = ", ".join(lim) or "none"
        if self.mode == "bwrap":
            if self.userns and self.use_zygote:
                who = "host uid in a user namespace of its own, no capabilities"
            elif not self.drop_uid:
                who = "host uid"
            elif self.uid is not None:
                who = f"uid {self.uid}"
            else:
                who = "own unprivileged uid"
            how = ", forked by a zygote into its own namespaces" if self.use_zygote else ""
            return f"bubblewrap (no network, private fs, {who}{how}; limits: {limits})"
        return f"limits only, no bubblewrap (not isolated from files or network; limits: {limits})"

    # ------------------------------------------------------------ Sandbox protocol
    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        if self._session is not None or self._spec is not None:
            raise SandboxError("the sandbox was already started")
        if not os.path.isfile(payload.path):
            raise SandboxError(f"context file not found: {payload.path}")
        try:
            await self._join_tree()
        except BaseException:
            await self.close()
            raise
        tree = self._tree
        if self._cg_host is not None and self._cgroup is None:
            mem = self.memory_mb * MB if self.memory_mb else None
            if mem and tree is not None and tree.memory:
                # a little under the run's cap: a sandbox alone in its run meets its own limit
                # first (the run's group is charged a few pages of its own besides)
                mem = max(MB, min(mem, tree.memory) - budgets.OWN_MARGIN)
            try:
                self._cgroup = self._cg_host.new_group(mem, self.max_processes or None,
                                                       parent=tree.group if tree else None)
            except OSError as exc:   # e.g. the parent group vanished: watch instead
                log.warning("recursa: could not create the sandbox's control group (%s); "
                            "watching its memory from the host instead", exc)
                self._cg_host = None
                self.isolation = self._describe()
        assert tree is not None and self._member is not None
        await budgets.enter(tree, self._member, child=not self._owns_tree)
        handler = budgets.in_tree(handler, tree, self._member)
        forked = False
        if self.use_zygote:
            try:
                await self._start_forked(payload, handler)
                forked = True
            except _ZygoteUnusable as exc:
                _NO_ZYGOTE.add(self.config)
                self.use_zygote = False
                log.warning("recursa: the sandbox zygote is not usable here (%s); starting "
                            "each worker on its own", exc)
                self.isolation = self._describe()
        if not forked:
            await self._start_spawned(payload, handler)
        if self._disk_polled or self.memory_mb or self._cgroup is not None:
            # Limits hold between cells too: one watch from start to close.
            self._watcher = asyncio.create_task(self._watch())

    async def _join_tree(self) -> None:
        """Join the run tree of the run whose REPL started this sandbox's run (a child run),
        or open one of this sandbox's own (a top-level run): commit its caps against the
        process's totals (waiting for room) and make its control group."""
        cur = budgets.current()
        parent: Member | None = None
        if cur is not None:
            self._tree, parent = cur
        else:
            self._tree = await self._open_tree()
            self._owns_tree = True
        self._member = Member(name=f"sandbox {id(self):x}", parent=parent,
                              usage=self._memory_now)

    async def _open_tree(self) -> RunTree:
        mem = min(self.memory_mb * MB, HOST.memory) if self.memory_mb else None
        procs = min(self.max_processes, HOST.processes) if self.max_processes else None
        tree = RunTree(mem, procs, host=HOST)
        if self._cg_host is not None:    # the kernel measures (and caps) the process's total
            whole = RunCgroup(self._cg_host.kind, self._cg_host.memory_parent,
                              self._cg_host.pids_parent, None, None)
            HOST.measure_with(whole.resident, whole.processes)
        if mem or procs:
            tree.lease = await HOST.acquire(mem or 0, procs or 0, wait=budgets.wait_seconds(),
                                            what=self.isolation, usage=tree.usage)
        if self._cg_host is not None:
            try:
                self._cg_host.set_totals(HOST.memory, HOST.processes)
                tree.attach(self._cg_host.new_group(mem, procs, tree=True))
            except OSError as exc:
                log.warning("recursa: could not create the run's control group (%s); its "
                            "sandboxes' memory is summed from the host instead", exc)
        return tree

    def _memory_now(self) -> int:
        """This sandbox's memory in use now: its group's, else its watched tree's."""
        if self._cgroup is not None:
            return self._cgroup.resident()
        return WATCH.rss(self._watch_key) if self._watch_key is not None else 0

    def _run_memory_reason(self) -> str:
        tree = self._tree
        assert tree is not None and tree.memory
        if not any(m is not self._member and m.running for m in tree.members):
            return self._memory_reason()      # alone in its run: its own limit
        how = self.tree_limits if self.tree_limits != "watch" else "host watch"
        return (f"the run it belongs to reached its {tree.memory // MB} MB memory limit "
                f"({how}), which the run's sandbox and its child runs' share, so this "
                f"sandbox, the one started last, was stopped")

    async def _leave_tree(self) -> None:
        tree, self._tree = self._tree, None
        if tree is None:
            return
        if self._member is not None:
            tree.leave(self._member)
        if self._owns_tree:
            if tree.group is not None:
                await asyncio.to_thread(tree.group.remove)
            tree.close()

    async def _start_forked(self, payload: ContextPayload, handler: CallHandler) -> None:
        host = zygote_host(self.config, self.config.zygote_command)
        try:
            run = host.new_run_dir()
            # In a user namespace every run is the host user outside (zygote.RUN_UID inside).
            uid = None if self.userns else lease_uid()
            spec = WorkerSpec(workspace=os.path.join(run, "ws"), ctxdir=os.path.join(run, "ctx"),
                              uid=uid, root=run)
            self._spec = spec
            os.mkdir(spec.workspace, 0o700)
            if uid is not None:
                os.chown(spec.workspace, uid, uid)
            os.mkdir(spec.ctxdir, 0o755)   # type: ignore[arg-type]
            self.workspace, self.uid = spec.workspace, uid
            self.isolation = self._describe()
            src = os.path.realpath(payload.path)
            if spec.linkable(src):
                ctx_path = spec.place_context(src)
            else:
                ctx_path = await asyncio.to_thread(spec.place_context, src)
        except BaseException:
            await self.close()
            raise
        req = {"run": os.path.basename(run), "uid": uid or 0, "limits": dict(self.config.limits),
               "tmp_bytes": self.tmp_mb * 1024 * 1024}
        if self.disk_mb:   # a size-capped tmpfs: enforced by the kernel, no watch needed
            req["disk_bytes"] = self.disk_mb * 1024 * 1024
        cgroup = self._cgroup

        def transport() -> ZygoteTransport:
            return ZygoteTransport(host, req, start_timeout=self.start_timeout,
                                   cgroup_fds=cgroup.open_procs if cgroup else None)

        self._session = WorkerSession(
            transport, context_path=ctx_path, kind=payload.kind, handler=handler,
            functions=payload.functions,
            start_timeout=self.start_timeout, interrupt_grace=self.interrupt_grace)
        self._session.explain_death = self._explain_death
        try:
            await self._session.start()
        except SandboxError as exc:
            first = host.starts <= 1 and self._session.start_failure in ("oserror", "died")
            session, self._session = self._session, None
            await session.close()
            spec.cleanup()
            self._spec = None
            self.workspace = self.uid = None
            if first:   # the very first zygote of this configuration: not usable here
                raise _ZygoteUnusable(str(exc)) from exc
            await self.close()
            raise
        except BaseException:
            await self.close()
            raise
        self.forked = True
        self.isolation = self._describe()

    async def _start_spawned(self, payload: ContextPayload, handler: CallHandler) -> None:
        spare = POOL.take(self.config, self.prewarm) if self.prewarm > 0 else None
        adopt: list[AdoptedTransport] = []
        join = self._join_cgroup if self._cgroup is not None else None
        try:
            if spare is not None:
                spec = spare.spec
                adopt.append(AdoptedTransport(spare.proc, marker=spec.marker, on_start=join))
                self.prewarmed = True
            else:
                spec = self.config.new_worker()
            self._spec = spec
            self.workspace = spec.workspace
            self.uid = spec.uid
            self.isolation = self._describe()
            src = os.path.realpath(payload.path)
            if spec.linkable(src):
                ctx_path = spec.place_context(src)
            else:   # a copy of a large file must not block the loop
                ctx_path = await asyncio.to_thread(spec.place_context, src)
        except BaseException:
            if spare is not None:
                POOL.discard(spare)
            await self.close()
            raise

        def transport() -> SubprocessTransport:
            if adopt:
                return adopt.pop()
            return SubprocessTransport(spec.argv, env=spec.env, cwd=spec.cwd,
                                       marker=spec.marker, on_start=join)

        self._session = WorkerSession(
            transport, context_path=ctx_path, kind=payload.kind, handler=handler,
            functions=payload.functions,
            start_timeout=self.start_timeout, interrupt_grace=self.interrupt_grace)
        self._session.explain_death = self._explain_death
        try:
            try:
                await self._session.start()
            except SandboxError as exc:
                if spare is None or self._session.start_failure != "died":
                    raise
                # The spare died before it could be used: start a fresh one instead.
                log.info("recursa: a pre-started worker was dead (%s); starting a new one", exc)
                self.prewarmed = False
                await self._session.start()
        except BaseException:
            if adopt:   # cancelled before the session took the spare
                POOL.discard(spare)  # type: ignore[arg-type]
            await self.close()
            raise

    def _memory_reason(self) -> str:
        how = self.tree_limits
        return (f"its processes together went over the sandbox's {self.memory_mb} MB memory "
                f"limit ({how if how != 'watch' else 'host watch'}), so all of them were "
                f"stopped")

    def _explain_death(self) -> str | None:
        """A worker that died because its group hit the memory limit (cgroup v2 kills the
        whole group at once, before the watch can look) is reported as such."""
        if self._cgroup is not None and self._cgroup.over_memory():
            self._cgroup.rearm()
            return self._memory_reason()
        return None

    def _join_cgroup(self, pid: int) -> None:
        """Put a worker started as its own command (and what it started so far: bwrap's
        inner processes) in this sandbox's group. No user code has run yet: the worker waits
        for `init` first."""
        assert self._cgroup is not None
        for p in (pid, *descendants(pid)):
            with contextlib.suppress(ProcessLookupError):   # dead: the start will say so
                self._cgroup.add(p)

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self._session is None:
            raise SandboxError("the sandbox was not started")
        session = self._session
        watch_disk = self._disk_polled
        if self._tree is not None and self._member is not None and self._member.need:
            await self._tree.wait_for_room(self._member)
        cell = await session.run(code, timeout=timeout, max_output_chars=max_output_chars)
        if watch_disk and await self._disk_used() is None:   # written faster than we looked
            await asyncio.to_thread(self._empty_workspace)
            cell.stderr = (f"note: the workspace exceeded its {self.disk_mb} MB limit; its "
                           f"files were deleted\n") + cell.stderr
        if self._cgroup is not None:
            refused = self._cgroup.pids_refused()
            if refused > 0:
                cell.stderr = (f"note: the sandbox's limit of {self.max_processes} processes "
                               f"(threads count too) was reached; {refused} could not be "
                               f"started\n") + cell.stderr
            self._cgroup.rearm()
        return cell

    async def _disk_used(self) -> int | None:
        """Bytes in the workspace, None once over `disk_mb`. A small workspace is scanned
        right here (tens of microseconds); a big one in a thread, off the loop."""
        assert self.workspace is not None and self.disk_mb
        limit = self.disk_mb * 1024 * 1024
        used: int | None = -1
        if self._disk_entries < 1000:
            used, self._disk_entries = disk_usage_entries(self.workspace, limit=limit,
                                                          give_up_after=2000)
        if used == -1:
            used, self._disk_entries = await asyncio.to_thread(
                disk_usage_entries, self.workspace, limit=limit)
        return used

    def _disk_wait(self, used: int) -> float:
        """When to look again: soon near the cap, else no sooner than a fast writer (4 GB/s)
        could reach it, and at most a second."""
        assert self.disk_mb
        left = self.disk_mb * 1024 * 1024 - used
        return min(1.0, max(self.disk_poll, left / 4e9))

    def _empty_workspace(self) -> None:
        assert self.workspace is not None
        for entry in os.listdir(self.workspace):
            path = os.path.join(self.workspace, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _watch_memory(self, session: WorkerSession, over: asyncio.Event) -> int | None:
        """Without a cgroup: have the host's tree watch report this worker's tree (its own
        uid's processes, or the worker's descendants) going over `memory_mb`."""
        if self._cgroup is not None or not self.memory_mb:
            return None
        pid = getattr(session._transport, "pid", None)
        if self.uid is None and pid is None:
            return None
        loop = asyncio.get_running_loop()
        return WATCH.watch(self.memory_mb * 1024 * 1024,
                           lambda rss: None if loop.call_soon_threadsafe(over.set) else None,
                           uid=self.uid, root=None if self.uid is not None else pid)

    async def _watch(self) -> None:
        """From start to close (between cells too), stop the worker when its workspace passes
        `disk_mb` (and empty the workspace: a per-file limit alone would let many files fill
        the host's disk), or when its processes together pass `memory_mb`. During a cell the
        cell reports it and the worker restarts; between cells the next cell restarts it and
        says why (session.abort)."""
        over = asyncio.Event()
        key: int | None = None
        watched: Any = None        # the worker incarnation (transport) being watched
        stopped: Any = None        # one we stopped: nothing more to do until it is replaced
        loop = asyncio.get_running_loop()
        next_disk = loop.time() + self.disk_poll
        watch_disk = self._disk_polled
        try:
            while True:
                await asyncio.sleep(self.disk_poll)
                session = self._session
                if session is None:
                    return
                transport = session._transport
                up = not (session.starting or transport is None or transport is stopped)
                if self._member is not None:   # only a running worker is stopped at the cap
                    self._member.running = up
                if not up:
                    continue
                if transport is not watched:   # a new worker: watch its tree
                    if key is not None:
                        WATCH.unwatch(key)
                    over.clear()
                    key = self._watch_key = self._watch_memory(session, over)
                    watched = transport
                when = "" if session.in_cell else "between cells, "
                tree = self._tree
                if tree is not None and self._member is not None and tree.over() \
                        and tree.victim() is self._member:
                    # the run's sandboxes together at the run's cap: the last one started goes
                    # (and its next cell waits for the room it was using: budgets.py)
                    old = self._cgroup.pids() if self._cgroup is not None else []
                    stopped = transport
                    tree.stopped_one(self._member, self._memory_now())
                    await session.abort(when + self._run_memory_reason())
                    for pid in old:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                    if self._cgroup is not None:
                        self._cgroup.rearm()
                    continue
                if over.is_set() or (self._cgroup is not None and self._cgroup.over_memory()):
                    # The group's members now, not later: the restarted worker joins it too.
                    old = self._cgroup.pids() if self._cgroup is not None else []
                    stopped = transport
                    await session.abort(when + self._memory_reason())
                    for pid in old:   # anything that left the worker's tree
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                    if self._cgroup is not None:
                        self._cgroup.rearm()
                    continue
                if watch_disk and loop.time() >= next_disk:
                    used = await self._disk_used()
                    if used is None:
                        stopped = transport
                        await session.abort(f"{when}its workspace exceeded the {self.disk_mb} "
                                            f"MB limit, so it was stopped and the workspace "
                                            f"emptied")
                        await asyncio.to_thread(self._empty_workspace)
                        continue
                    next_disk = loop.time() + self._disk_wait(used)
        finally:
            if key is not None:
                WATCH.unwatch(key)
            self._watch_key = None
            if self._member is not None:
                self._member.running = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        try:
            if session is not None:
                await asyncio.shield(session.close())
        finally:
            if self._cgroup is not None:
                await asyncio.to_thread(self._cgroup.remove)
                self._cgroup = None
            if self._spec is not None:
                self._spec.cleanup()
            await self._leave_tree()

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def session(self) -> WorkerSession | None:
        return self._session

    def processes(self) -> list[int]:
        """Host pids of the worker's process tree now (its control group's members, else the
        processes of its own uid, else the worker command's descendants)."""
        if self._cgroup is not None:
            return self._cgroup.pids()
        if self.forked and self.uid is not None:
            return processes_of_uid(self.uid)
        pid = getattr(self._session._transport, "pid", None) if self._session else None
        return [pid, *descendants(pid)] if pid else []

    # ------------------------------------------------------------ command line
    def _limits(self) -> dict[str, int]:
        mb = 1024 * 1024
        lim: dict[str, int] = {"core": 0}
        if self.memory_mb:
            lim["as"] = self.memory_mb * mb
        if self.cpu_seconds:
            lim["cpu"] = self.cpu_seconds
        if self.file_size_mb or self.disk_mb:   # no one file larger than the workspace
            lim["fsize"] = min(x for x in (self.file_size_mb, self.disk_mb) if x) * mb
        if self.max_processes and (self.drop_uid or self.userns):
            lim["nproc"] = self.max_processes
        return lim


class _ZygoteUnusable(Exception):
    pass


_NO_ZYGOTE: set[WorkerConfig] = set()   # configurations whose zygote could not start here


def disk_usage(root: str, *, limit: int, max_entries: int = 200_000) -> int | None:
    """Bytes allocated under `root`, or None once over `limit` bytes or `max_entries` files
    (a million empty files is also an attack on the disk)."""
    return disk_usage_entries(root, limit=limit, max_entries=max_entries)[0]


def disk_usage_entries(root: str, *, limit: int, max_entries: int = 200_000,
                       give_up_after: int | None = None) -> tuple[int | None, int]:
    """`disk_usage` and the number of entries seen; (-1, n) if more than `give_up_after`
    entries had to be looked at (too many to scan on the event loop)."""
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
                if give_up_after is not None and entries > give_up_after:
                    return -1, entries
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += getattr(st, "st_blocks", 0) * 512 or st.st_size
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                if total > limit or entries > max_entries:
                    return None, entries
    return total, entries
