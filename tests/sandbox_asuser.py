"""Run a command as an unprivileged uid, from root: for the sandbox tests and benchmark of the
non-root path (most users are not root; this machine and CI run everything as root).

    python tests/sandbox_asuser.py [--uid N] -- COMMAND...

Needs no user account: the command runs with uid and gid N (default: env RECURSA_UNPRIV_UID,
else 48213) and no supplementary groups, HOME and TMPDIR in a fresh directory it owns. The
interpreter may live where other users cannot reach it (a pyenv under /root): the command then
runs in a mount namespace of its own in which that directory's unreachable ancestor is replaced
by an empty tmpfs holding only the interpreter's installation (bound read-only), so nothing
else of it is visible. Used as a module: `command(argv)` gives the wrapped command line and
`usable()` says whether it can work here (root, unprivileged user namespaces, bubblewrap).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

DEFAULT_UID = 48213
_MS_RDONLY, _MS_BIND, _MS_REMOUNT, _MS_REC, _MS_PRIVATE = 1, 4096, 32, 16384, 1 << 18


def uid() -> int:
    return int(os.environ.get("RECURSA_UNPRIV_UID", DEFAULT_UID))


def command(argv: list[str], *, as_uid: int | None = None) -> list[str]:
    """`argv` run as the unprivileged uid (call as root)."""
    n = uid() if as_uid is None else as_uid
    return [sys.executable, "-I", os.path.abspath(__file__), "--uid", str(n), "--", *argv]


def run_pytest(files: list[str], keyword: str, *,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """pytest on `files` (tests matching `keyword`, every marker) as the unprivileged uid, with
    this checkout's src/ and tests/ on the path."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    env = {**os.environ, "PYTHONPATH": f"{root}/src:{here}"}
    cmd = command([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                   "-m", "", "-k", keyword, *files])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=root)


def usable() -> str | None:
    """None when commands can run unprivileged with bubblewrap here, else why not."""
    if os.geteuid() != 0:
        return "the test process is not root (it cannot switch to another uid)"
    if not hasattr(os, "unshare") and not _libc():
        return "no unshare()"
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "bubblewrap is not installed"
    probe = subprocess.run(command([bwrap, "--unshare-all", "--ro-bind", "/", "/", "true"]),
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return (f"bubblewrap does not work for an unprivileged user here (unprivileged user "
                f"namespaces off?): {probe.stderr.strip()[-300:]}")
    return None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _reachable(path: str, n: int) -> str | None:
    """The first ancestor of `path` that uid `n` (no groups) cannot traverse, or None."""
    parts = os.path.realpath(path).split("/")[1:]
    cur = ""
    for p in parts:
        cur += "/" + p
        st = os.stat(cur)
        if os.path.isdir(cur) and not (st.st_mode & 0o001 or (st.st_uid == n
                                                              and st.st_mode & 0o100)):
            return cur
    return None


def _expose(prefix: str, n: int) -> None:
    """In a mount namespace of our own, make `prefix` reachable for uid `n`."""
    blocked = _reachable(prefix, n)
    if blocked is None:
        return
    libc = _libc()
    _check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "private")
    stage = tempfile.mkdtemp(prefix="recursa-asuser-")
    _check(libc.mount(prefix.encode(), stage.encode(), None, ctypes.c_ulong(_MS_BIND | _MS_REC),
                      None), "bind")
    _check(libc.mount(b"tmpfs", blocked.encode(), b"tmpfs", ctypes.c_ulong(0), b"mode=0755"),
           "tmpfs")
    os.makedirs(prefix, mode=0o755, exist_ok=True)
    _check(libc.mount(stage.encode(), prefix.encode(), None,
                      ctypes.c_ulong(_MS_BIND | _MS_REC), None), "bind back")
    _check(libc.mount(None, prefix.encode(), None,
                      ctypes.c_ulong(_MS_BIND | _MS_REMOUNT | _MS_RDONLY), None), "read-only")
    libc.umount2(stage.encode(), 2)
    os.rmdir(stage)


def main(argv: list[str]) -> int:
    n = uid()
    if argv[:1] == ["--uid"]:
        n, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    _expose(os.path.realpath(sys.base_prefix), n)
    home = tempfile.mkdtemp(prefix=f"recursa-asuser-{n}-")
    os.chown(home, n, n)
    os.setgroups([])
    os.setgid(n)
    os.setuid(n)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUDO_", "XDG_"))}
    env.update(HOME=home, TMPDIR=home, USER=f"uid{n}", LOGNAME=f"uid{n}")
    os.chdir(home)
    os.execvpe(argv[0], argv, env)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
