"""A folder or repository as a context: {relative path: value}, honouring its .gitignore files
(pathspec, with git's rules: deeper files win, `!` re-includes) and .git/info/exclude, skipping
VCS and tool folders, binaries (counted in a note) and files that fail to load (each named).

Only regular files inside the folder are read: devices, FIFOs and sockets are skipped, and so
are symlinks (a .gitignore that is a symlink is read only when it leads to a regular file inside
the folder): a `.gitignore` linked to /dev/zero, or a FIFO, is never opened. `load_tree` reads
the folder in a confined parser (recursa.documents.confine); `read_tree` is what runs there."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from recursa.base import images
from recursa.documents import limits
from recursa.documents.errors import DocumentError, MissingExtra
from recursa.documents.load import load_source
from recursa.documents.source import Source, detect

SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".tox", ".idea", ".vscode"}


def read_small_file(path: Path, root: Path, cap: int) -> str | None:
    """The text of `path` if it is a regular file inside `root` (through symlinks that stay in
    it) of at most `cap` bytes; else None. Opened without blocking, never following a last
    symlink out of the folder: a FIFO, a device or /dev/zero is not read."""
    try:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(os.path.realpath(root)):
            return None
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if len(data) > cap else data.decode("utf-8", errors="replace")


class _Ignores:
    def __init__(self, root: Path):
        self.specs: list[tuple[str, Any]] = []
        self.unread: list[str] = []     # ignore files there but not read (see read_small_file)
        self.available = True
        try:
            import pathspec
        except ImportError:
            self.available = False
            return
        self._pathspec = pathspec
        self.add(root, "", root / ".git" / "info" / "exclude")

    def add(self, root: Path, rel_dir: str, file: Path | None = None) -> None:
        if not self.available:
            return
        f = file or (root / rel_dir / ".gitignore")
        text = read_small_file(f, root, limits.MAX_IGNORE_FILE_BYTES)
        if text is None:
            if os.path.lexists(f):
                self.unread.append(f.relative_to(root).as_posix())
            return
        self.specs.append((rel_dir, self._pathspec.GitIgnoreSpec.from_lines(text.splitlines())))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict = None
        for base, spec in self.specs:
            if base and not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1:] if base else rel
            got = spec.check_file(sub + "/" if is_dir else sub).include
            if got is not None:
                verdict = got
        return bool(verdict)


def walk(root: Path, skipped: Counter[str] | None = None,
         unread: list[str] | None = None) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every regular file under `root` that a folder context takes:
    VCS, tool and hidden folders, what the .gitignore files exclude, symlinks and special files
    (devices, FIFOs, sockets) are left out (counted in `skipped`). `unread` gets the ignore
    files that are there but were not read (not a regular file in the folder, or too big)."""
    skipped = Counter() if skipped is None else skipped
    ign = _Ignores(root)
    if unread is not None:
        ign.unread = unread
    for dirpath, dirs, names in os.walk(root, onerror=lambda e: skipped.update(["unreadable"])):
        here = Path(dirpath)
        rel_dir = "" if here == root else here.relative_to(root).as_posix()
        ign.add(root, rel_dir)
        keep = []
        for d in sorted(dirs):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if d in SKIP_DIRS or d.startswith("."):
                continue
            if ign.ignored(rel, True):
                skipped["ignored by .gitignore"] += 1
                continue
            keep.append(d)
        dirs[:] = keep
        for n in sorted(names):
            rel = f"{rel_dir}/{n}" if rel_dir else n
            if n == ".gitignore":
                continue
            if ign.ignored(rel, False):
                skipped["ignored by .gitignore"] += 1
                continue
            try:
                mode = os.lstat(here / n).st_mode
            except OSError:
                skipped["unreadable"] += 1
                continue
            if stat.S_ISLNK(mode):
                skipped["symlinks not followed"] += 1
                continue
            if not stat.S_ISREG(mode):
                skipped["not regular files (devices, FIFOs, sockets)"] += 1
                continue
            yield rel, here / n


def load_tree(root: Path) -> tuple[dict[str, Any], list[str]]:
    """({relative path: Document | str | Image | {member: ...}}, notes), read in a confined
    parser (recursa.documents.confine)."""
    from recursa.documents import confine
    return confine.load_folder(root)


def read_tree(root: Path) -> tuple[dict[str, Any], list[str]]:
    """`load_tree` in this process (what the confined parser runs)."""
    notes: list[str] = []
    return dict(iter_tree(root, notes)), notes


def iter_tree(root: Path, notes: list[str], label: str | None = None, *,
              skip: Mapping[str, str] | None = None,
              reading: Callable[[str], object] | None = None) -> Iterator[tuple[str, Any]]:
    """(relative path, value) of each file of the folder as it is read; `notes` is complete
    when the iteration ends. `label` names the folder in errors (default: `root`); `skip`:
    files not to read, with why (a note each); `reading(rel)` is called before a file is read
    (the confined parser tells the host which file it is on: one that kills it is skipped
    when the folder is read again)."""
    skipped: Counter[str] = Counter()
    binaries: list[str] = []
    found = 0
    if not _Ignores(root).available and (root / ".gitignore").exists():
        notes.append(".gitignore not applied: it needs pathspec, part of the 'docs' extra "
                     "(pip install 'recursa[docs]')")
    missing: set[str] = set()
    unread: list[str] = []
    for rel, p in walk(root, skipped, unread):
        try:
            src = Source(rel, path=p)
            kind = detect(src)
            cap = limits.MAX_TEXT_FILE_BYTES if kind == "text" else limits.MAX_MEMBER_BYTES
            if p.stat().st_size > cap:
                skipped[f"larger than {limits.mb(cap)}"] += 1
                notes.append(f"{rel}: skipped: {limits.mb(p.stat().st_size)} is over the "
                             f"{limits.mb(cap)} limit for one file in a folder")
                continue
        except OSError:
            skipped["unreadable"] += 1
            notes.append(f"{rel}: unreadable (skipped)")
            continue
        if kind == "binary":
            skipped["binary"] += 1
            binaries.append(rel)
            continue
        if skip and rel in skip:
            skipped["unreadable documents"] += 1
            notes.append(f"{rel}: skipped: {skip[rel]}")
            continue
        if reading is not None:
            reading(rel)
        try:
            value = load_source(src, notes, cap=cap)
        except MissingExtra as e:
            skipped["needing the docs extra"] += 1
            missing.add(str(e).split(": ", 1)[1])
            continue
        except images.ImageError as e:
            skipped["bad images"] += 1
            notes.append(f"{rel}: skipped: {e}")
            continue
        except DocumentError as e:
            what = "binary" if "looks binary" in str(e) else "unreadable documents"
            skipped[what] += 1
            if what == "binary":
                binaries.append(rel)
            else:
                notes.append(f"{rel}: skipped: {str(e).removeprefix(rel + ': ')}")
            continue
        except OSError:
            skipped["unreadable"] += 1
            notes.append(f"{rel}: unreadable (skipped)")
            continue
        found += 1
        yield rel, value
    notes[:0] = sorted(missing) + [
        f"{rel}: not read (a symlink out of the folder, not a regular file, or over "
        f"{limits.mb(limits.MAX_IGNORE_FILE_BYTES)})" for rel in unread]
    if binaries:
        shown = ", ".join(binaries[:8]) + (" ..." if len(binaries) > 8 else "")
        notes.insert(0, f"binary files skipped: {shown}")
    if skipped:
        notes.insert(0, "skipped files: " + ", ".join(f"{n} {k}" for k, n in skipped.items()))
    if not found:
        raise DocumentError(f"directory {label or root} holds no readable text, document or "
                            "image files" + (f" ({notes[0]})" if notes else ""))
