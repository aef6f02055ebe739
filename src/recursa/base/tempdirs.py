"""Temporary directories that name their owner, and a sweep of those whose owner is gone.

A host killed with SIGKILL runs no cleanup: its workers die with it (parent-death signal), but
the directories of its sandboxes, spare workers and run contexts would stay in the temp dir
forever. So every such directory is made by `owned_tempdir`, whose name says who owns it:

    recursa-<kind>-<pid>-<starttime>-<scope>-<random>

`starttime` is the owner's start time (field 22 of /proc/PID/stat, clock ticks since boot), so
a reused pid is told from the owner; `scope` is a short hash of the boot id and the pid
namespace, so a pid is only ever judged by a process that sees the same pids (a container
sharing /tmp, another machine on a shared file system, or a previous boot: never swept).

The first `owned_tempdir` call of a process (or `recursa.base.background.start()`) starts `sweep_stale`
in a background thread (once per process and directory; `recursa.base.background.shutdown()` stops it): it removes the directories in the temp dir whose name matches the
pattern exactly, whose scope is ours, that are real directories (not symlinks) owned by us (or,
as root, by a worker's uid), and whose owner pid is dead or now belongs to another process
(start time differs). Nothing a live process uses is touched. It is bounded in time, never
raises, never follows symlinks, and skips whatever it cannot remove.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time

from recursa.base.background import BACKGROUND, WATCHERS

log = logging.getLogger("recursa.tempdirs")

# The uids workers drop to when the host runs as root (LocalSandbox; one per live worker, see
# recursa.sandbox.uids): as root, a workspace chowned to one of them is still ours to sweep.
# 0x70000000 and up: above the subordinate ids useradd hands out (SUB_UID_MIN 100000 to
# SUB_UID_MAX 600100000, 65536 per user) and systemd's container range (524288-1879048191), in
# the range systemd documents as unused (1879048192-2147352575), and below 2^31, where tools
# that take uid_t for signed would go wrong.
WORKER_UID_MIN = 0x70000000
WORKER_UID_MAX = WORKER_UID_MIN + (1 << 24) - 1

_PREFIX = re.compile(r"recursa-[a-z]+-\Z")
# mkdtemp's random part: 8 characters of [a-z0-9_]
_NAME = re.compile(r"recursa-[a-z]+-([1-9][0-9]{0,9})-([0-9]{1,20})-([0-9a-f]{8})-[a-z0-9_]{8}\Z")
_UNKNOWN = "00000000"

_lock = threading.Lock()
_swept: set[tuple[int, str]] = set()      # (pid, directory) already swept (or being swept)
_threads: list[threading.Thread] = []     # sweeps running now
_stop = threading.Event()                 # set by shutdown: sweeps end at the next entry
_ident: tuple[int, str, str] | None = None   # (pid, starttime, scope) of this process


def _starttime(pid: int | str) -> str | None:
    """Field 22 of /proc/PID/stat; None if there is no such process; raises OSError else."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = data[data.rindex(b")") + 2:].split()
    return fields[19].decode()


def _scope() -> str:
    """Who can judge our pids: same boot and same pid namespace (Linux), else unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        ns = os.readlink("/proc/self/ns/pid")
        if not boot or not ns:
            return _UNKNOWN
    except OSError:
        return _UNKNOWN
    h = hashlib.sha256(f"{boot}\0{ns}".encode()).hexdigest()[:8]
    return h if h != _UNKNOWN else "00000001"


def identity() -> tuple[int, str, str]:
    """(pid, start-time token, scope) of this process; the token is "0" and the scope unknown
    where /proc cannot tell (then nothing is ever swept)."""
    global _ident
    pid = os.getpid()
    ident = _ident
    if ident is None or ident[0] != pid:   # first call, or a forked child
        start, scope = "0", _UNKNOWN
        try:
            # /proc must be the one of our pid namespace for its pids to mean ours
            if os.readlink("/proc/self") == str(pid):
                start = _starttime(pid) or "0"
                scope = _scope()
        except (OSError, ValueError, IndexError):
            pass
        if start == "0":
            scope = _UNKNOWN
        ident = _ident = (pid, start, scope)
    return ident


def owned_tempdir(prefix: str, dir: str | None = None) -> str:
    """`tempfile.mkdtemp` with the owner in the name (see the module docstring); `prefix` is
    "recursa-<kind>-". The first call of a process starts the sweep of stale directories."""
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix must look like 'recursa-<kind>-', not {prefix!r}")
    pid, start, scope = identity()
    path = tempfile.mkdtemp(prefix=f"{prefix}{pid}-{start}-{scope}-", dir=dir)
    if dir is None:
        start_sweep(os.path.dirname(path))
    return path


def start_sweep(directory: str | None = None) -> threading.Thread | None:
    """Sweep `directory` (default: the temp dir) in a daemon thread, once per process."""
    try:
        directory = os.path.realpath(directory or tempfile.gettempdir())
        key = (os.getpid(), directory)
        with _lock:
            if key in _swept or BACKGROUND.exiting:
                return None
            _swept.add(key)
            BACKGROUND.attach(_SWEEPS, WATCHERS)
            t = threading.Thread(target=sweep_stale, args=(directory,), name="recursa-tmp-sweep",
                                 daemon=True)
            _threads[:] = [x for x in _threads if x.is_alive()] + [t]
        t.start()
        return t
    except Exception:   # never let housekeeping break a run
        log.debug("recursa: could not start the temp dir sweep", exc_info=True)
        return None


def sweep_stale(directory: str | None = None, *, time_limit: float = 30.0) -> list[str]:
    """Remove the stale owned directories in `directory` (default: the temp dir); return the
    paths removed (fully). Never raises."""
    removed: list[str] = []
    try:
        deadline = time.monotonic() + time_limit
        directory = directory or tempfile.gettempdir()
        _, _, scope = identity()
        if scope == _UNKNOWN:
            return removed
        with os.scandir(directory) as it:
            candidates = [e for e in it if _NAME.match(e.name)]
        for entry in candidates:
            if time.monotonic() > deadline or _stop.is_set():
                break
            try:
                if _stale(entry, scope):
                    _rmtree(entry.path)
                    if not os.path.lexists(entry.path):
                        removed.append(entry.path)
            except Exception:
                log.debug("recursa: could not sweep %s", entry.path, exc_info=True)
    except Exception:
        log.debug("recursa: temp dir sweep failed", exc_info=True)
    if removed:
        log.debug("recursa: removed %d stale temporary directories", len(removed))
    return removed


def _stale(entry: os.DirEntry[str], scope: str) -> bool:
    m = _NAME.match(entry.name)
    if m is None or m.group(3) != scope:
        return False
    st = entry.stat(follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):      # a symlink or a file with our name: not ours
        return False
    euid = os.geteuid()
    if st.st_uid != euid and not (euid == 0 and WORKER_UID_MIN <= st.st_uid <= WORKER_UID_MAX):
        return False
    pid, start = int(m.group(1)), m.group(2)
    try:
        now = _starttime(pid)
    except (OSError, ValueError, IndexError):
        return False                      # cannot tell: keep
    if now is None:
        return True                       # the owner is gone
    # start "0": the owner could not read its start time; only a dead owner is certain
    return start != "0" and now != start  # the pid now belongs to another process


def _rmtree(path: str) -> None:
    """Remove a tree without following symlinks (shutil's fd-based rmtree); as non-root, a
    directory made unreadable or read-only is chmod-ed once and retried, else skipped."""

    def onerror(func, p, exc_info) -> None:  # noqa: ANN001
        if not issubclass(exc_info[0], PermissionError) or os.geteuid() == 0:
            return
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            if func in (os.open, os.scandir) and stat.S_ISDIR(st.st_mode):
                os.chmod(p, 0o700)        # could not be listed: make it listable, go again
                shutil.rmtree(p, ignore_errors=True)
            elif func in (os.unlink, os.rmdir):
                parent = os.path.dirname(p)
                if stat.S_ISDIR(os.lstat(parent).st_mode):
                    os.chmod(parent, 0o700)   # a read-only directory: make it writable
                    func(p)

    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path, onerror=onerror)


class _Sweeps:
    """The sweeps as a part of recursa.base.background."""

    def shutdown(self) -> None:
        with _lock:
            threads = list(_threads)
            _stop.set()
        for t in threads:
            if t is not threading.current_thread():
                t.join(5)
        with _lock:
            _threads.clear()
            _stop.clear()

    def after_fork_in_child(self) -> None:
        global _lock
        _lock = threading.Lock()
        _threads.clear()


_SWEEPS = _Sweeps()
