"""Run a command as an unprivileged uid, from root: for the sandbox tests and benchmark of the
non-root path (most users are not root; this machine and CI run everything as root).

    python tests/sandbox_asuser.py [--uid N] [--expose PATH]... -- COMMAND...

Needs no user account: the command runs with uid and gid N (default: env RECURSA_UNPRIV_UID,
else 48213) and no supplementary groups, HOME and TMPDIR in a fresh directory it owns. What the
command needs may live where other users cannot reach it: the interpreter under /root (a pyenv),
the checkout and its venv in a 0700 directory (`mktemp -d`, a clone under /root). Each such
path (this interpreter's installation and environment, and every `--expose` path) is then made
reachable in a mount namespace of the command's own: the path's unreachable ancestor is replaced
by an empty tmpfs holding only the exposed paths, bound read-only, so nothing else of it is
visible. Used as a module: `command(argv, expose=...)` gives the wrapped command line and
`usable()` says whether it can work here (root, unprivileged user namespaces, bubblewrap).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable

DEFAULT_UID = 48213
_MS_RDONLY, _MS_BIND, _MS_REMOUNT, _MS_REC, _MS_PRIVATE = 1, 4096, 32, 16384, 1 << 18


def uid() -> int:
    return int(os.environ.get("RECURSA_UNPRIV_UID", DEFAULT_UID))


def command(argv: list[str], *, as_uid: int | None = None,
            expose: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """`argv` run as the unprivileged uid (call as root), with this interpreter's installation
    and environment and the `expose` paths (files or directories) reachable for it."""
    n = uid() if as_uid is None else as_uid
    paths = [sys.base_prefix, sys.prefix, *expose]
    return [sys.executable, "-I", os.path.abspath(__file__), "--uid", str(n),
            *(a for p in paths for a in ("--expose", os.fspath(p))), "--", *argv]


def needs() -> list[str]:
    """What a test run as the other uid needs of this checkout: the sources, the tests and the
    pytest settings, exposed to it wherever the checkout lives (a 0700 directory, a path with
    spaces)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    return [os.path.join(root, "src"), here, os.path.join(root, "pyproject.toml")]


def run_pytest(files: list[str], keyword: str, *,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """pytest on `files` (tests matching `keyword`, every marker) as the unprivileged uid, with
    this checkout's src/ and tests/ on the path. Skips (naming the file) when the checkout's
    own files are unreadable to other users (made under umask 077)."""
    import pytest
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    bad = unreadable(needs())
    if bad:
        pytest.skip(f"{bad} is not readable by other users (a checkout made under umask 077?), "
                    "so the unprivileged uid cannot run the tests from it")
    env = {**os.environ, "PYTHONPATH": f"{root}/src{os.pathsep}{here}"}
    cmd = command([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                   "-m", "", "-k", keyword, *files], expose=needs())
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


def unreadable(paths: Iterable[str | os.PathLike[str]]) -> str | None:
    """The first file or directory under `paths` that other users cannot read (a checkout
    made under umask 077), or None: exposing a path does not change its files' modes."""
    for top in map(os.fspath, paths):
        names = [top]
        for root, dirs, files in os.walk(top):
            names += [os.path.join(root, f) for f in dirs + files]
        for name in names:
            st = os.lstat(name)
            need = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & need != need:
                return name
    return None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _blocked(path: str, n: int) -> str | None:
    """The first directory on the way to `path` that uid `n` (no groups) cannot traverse, or
    None. `path` itself is what is exposed: its own mode is left as it is."""
    parts = path.split("/")[1:-1]
    cur = ""
    for p in parts:
        cur += "/" + p
        st = os.stat(cur)
        if not (st.st_mode & 0o001 or (st.st_uid == n and st.st_mode & 0o100)):
            return cur
    return None


def _outermost(paths: list[str]) -> list[str]:
    """The paths that are not inside another one of them (a venv inside the checkout)."""
    return [p for p in paths if not any(p.startswith(q + "/") for q in paths if q != "/")]


def _expose(paths: list[str], n: int) -> None:
    """In a mount namespace of our own, make each of `paths` reachable for uid `n`."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    todo = [(p, b) for p in _outermost(real) if (b := _blocked(p, n))]
    if not todo:
        return
    libc = _libc()
    _check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "private")
    # Hold each path open before the tmpfs hides it, then bind it back from the descriptor.
    held = [(p, os.open(p, os.O_PATH)) for p, _ in todo]
    for b in sorted({b for _, b in todo}):
        _check(libc.mount(b"tmpfs", b.encode(), b"tmpfs", ctypes.c_ulong(0), b"mode=0755"),
               f"tmpfs on {b}")
    for p, fd in held:
        os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(p, 0o755)
        else:
            open(p, "x").close()
        _check(libc.mount(f"/proc/self/fd/{fd}".encode(), p.encode(), None,
                          ctypes.c_ulong(_MS_BIND | _MS_REC), None), f"bind {p}")
        _check(libc.mount(None, p.encode(), None,
                          ctypes.c_ulong(_MS_BIND | _MS_REMOUNT | _MS_RDONLY), None),
               f"read-only {p}")
        os.close(fd)


def main(argv: list[str]) -> int:
    n = uid()
    expose = [sys.base_prefix, sys.prefix]
    while argv[:1] in (["--uid"], ["--expose"]):
        if argv[0] == "--uid":
            n = int(argv[1])
        else:
            expose.append(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    _expose(expose, n)
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
