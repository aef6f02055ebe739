"""Files that may hold user data, created readable by their owner only, whatever the umask.

Traces, the response cache, chat history, exported training data, bench result rows and viewer
pages carry prompts, contexts and answers. With the usual umask 022, `open()` / `mkdir()` would
make them world-readable on a shared machine, so recursa creates them here instead:

- a directory recursa creates is 0700 (each missing level of the path, not just the last);
  a directory that already exists keeps its mode: it is the user's, and may be shared on purpose;
- a file recursa creates is 0600 from the moment it exists (`O_CREAT` with 0600, then `fchmod`,
  so no window where another user could open it); a file that already exists keeps its mode,
  for the same reason (to tighten one written by an older recursa: `chmod 600 FILE`).

The modes are set explicitly after creation, so an unusual umask (077, or one that drops owner
bits) gives the same result as 022.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Make `path` and any missing parents as 0700 directories; existing ones are left as
    they are. Returns the path."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:     # made meanwhile by another thread or process: theirs
            if not d.is_dir():
                raise
            continue
        os.chmod(d, DIR_MODE)       # mkdir's mode went through the umask
    if not path.is_dir():           # a file in the way: say so, as mkdir does
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(path))
    return path


def _open_fd(path: Path, flags: int) -> int:
    """An fd on `path`; a new file is made 0600, an existing one keeps its mode."""
    private_dir(path.parent)
    flags |= getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return os.open(path, flags)
    try:
        os.fchmod(fd, FILE_MODE)    # the umask may have removed owner bits
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | os.PathLike[str], mode: str = "a",
                 encoding: str | None = "utf-8") -> IO[Any]:
    """`open(path, mode)` for mode "a", "w" (text) or "ab", "wb", creating the file 0600 (and
    its missing directories 0700)."""
    kind = mode.replace("b", "")
    if kind not in ("a", "w"):
        raise ValueError(f"open_private: mode {mode!r} (use a, w, ab or wb)")
    flags = os.O_WRONLY | (os.O_APPEND if kind == "a" else os.O_TRUNC)
    fd = _open_fd(Path(path), flags)
    try:
        if "b" in mode:
            return os.fdopen(fd, mode)
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def write_private_text(path: str | os.PathLike[str], text: str,
                       encoding: str = "utf-8") -> None:
    """`Path(path).write_text(text)`, creating the file 0600 (and its directories 0700)."""
    with open_private(path, "w", encoding=encoding) as f:
        f.write(text)


def touch_private(path: str | os.PathLike[str]) -> Path:
    """Create `path` empty and 0600 if it is missing (for files another library then opens,
    e.g. sqlite's database or readline's history)."""
    path = Path(path)
    if not path.exists():
        os.close(_open_fd(path, os.O_WRONLY))
    return path
