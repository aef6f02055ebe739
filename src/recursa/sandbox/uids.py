"""The uid of each worker when the host runs as root: one per live worker, never shared.

A uid is leased from `WORKER_UID_MIN..WORKER_UID_MAX` (recursa.base.tempdirs: above the usual
subordinate uid ranges, in a range nothing else assigns) and held until the worker's sandbox
is gone. Unique within the process (a set of leased uids) and between recursa processes on
the host: each lease holds an exclusive `flock` on a file named after the uid in a root-only
directory (/run/recursa-uids-0), which the kernel releases when the holder dies, even by
SIGKILL; a killed holder's file stays (unlocked, harmless) until the next boot empties /run.
Two concurrent runs therefore never share a uid, so neither can signal, ptrace or count
against the other's processes (RLIMIT_NPROC is per uid).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import tempfile
import threading

from recursa.base.background import BACKGROUND, GROUPS
from recursa.base.tempdirs import WORKER_UID_MAX, WORKER_UID_MIN
from recursa.base.types import SandboxError

_lock = threading.Lock()
_held: dict[int, int] = {}   # leased uid -> fd of its locked file


def _lock_dir() -> str:
    # /run (a tmpfs, emptied at boot) when we may write there: only root leases uids
    base = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    path = os.path.join(base, f"recursa-uids-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid() \
            or st.st_mode & 0o077:
        raise SandboxError(f"{path} is not a private directory of this user; cannot lease "
                           f"worker uids safely")
    return path


def _try_lock(directory: str, uid: int) -> int | None:
    """The fd of `uid`'s lock file, locked by us; None if another process holds it."""
    path = os.path.join(directory, str(uid))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # the holder before us may have unlinked the file after we opened it: ours must be the
        # file now at that path, or a third process could lock a new one too
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def lease_uid() -> int:
    """A uid no other live worker of this host's recursa processes has; `release_uid` it."""
    directory = _lock_dir()
    span = WORKER_UID_MAX - WORKER_UID_MIN + 1
    BACKGROUND.attach(_LEASES, GROUPS)
    with _lock:
        for _ in range(256):
            uid = WORKER_UID_MIN + secrets.randbelow(span)
            if uid in _held:
                continue
            fd = _try_lock(directory, uid)
            if fd is not None:
                _held[uid] = fd
                return uid
    raise SandboxError("could not find a free uid for the worker")


def release_uid(uid: int) -> None:
    """Give a leased uid back (its worker's processes are gone)."""
    with _lock:
        fd = _held.pop(uid, None)
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(_lock_dir(), str(uid)))
        os.close(fd)


def leased() -> set[int]:
    """The uids this process holds now (tests, diagnostics)."""
    with _lock:
        return set(_held)


class _Leases:
    """The leases as a part of recursa.base.background, for its fork hook:
    each lease is its sandbox's to release, and the kernel drops the locks at exit."""

    def shutdown(self) -> None:
        pass

    def after_fork_in_child(self) -> None:
        # The leases are the parent's: drop our copies (the parent's locks stay held).
        global _lock
        _lock = threading.Lock()
        for fd in _held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        _held.clear()


_LEASES = _Leases()
