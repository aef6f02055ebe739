"""A folder or repository as a context: {relative path: value}, honouring its .gitignore files
(pathspec, with git's rules: deeper files win, `!` re-includes) and .git/info/exclude, skipping
VCS and tool folders, binaries (counted in a note) and files that fail to load (each named)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recursa.base import images
from recursa.documents import limits
from recursa.documents.errors import DocumentError, MissingExtra
from recursa.documents.load import load_source
from recursa.documents.source import Source, detect

SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".tox", ".idea", ".vscode"}
MAX_TEXT_FILE_BYTES = 50 * 1024 * 1024


class _Ignores:
    def __init__(self, root: Path):
        self.specs: list[tuple[str, Any]] = []
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
        try:
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return
        self.specs.append((rel_dir, self._pathspec.GitIgnoreSpec.from_lines(lines)))

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


def walk(root: Path, skipped: Counter[str] | None = None) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file under `root` that a folder context takes: VCS, tool
    and hidden folders and what the .gitignore files exclude are left out (counted in
    `skipped`). Symlinks and other non-regular files are the caller's to check."""
    skipped = Counter() if skipped is None else skipped
    ign = _Ignores(root)
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
            yield rel, here / n


def load_tree(root: Path) -> tuple[dict[str, Any], list[str]]:
    """({relative path: Document | str | Image | {member: ...}}, notes)."""
    files: dict[str, Any] = {}
    notes: list[str] = []
    skipped: Counter[str] = Counter()
    binaries: list[str] = []
    if not _Ignores(root).available and (root / ".gitignore").exists():
        notes.append(".gitignore not applied: it needs pathspec, part of the 'docs' extra "
                     "(pip install 'recursa[docs]')")
    missing: set[str] = set()
    for rel, p in walk(root, skipped):
        try:
            if p.is_symlink() or not p.is_file():
                continue
            src = Source(rel, path=p)
            kind = detect(src)
            cap = MAX_TEXT_FILE_BYTES if kind == "text" else limits.MAX_MEMBER_BYTES
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
        try:
            files[rel] = load_source(src, notes, cap=cap)
        except MissingExtra as e:
            skipped["needing the docs extra"] += 1
            missing.add(str(e).split(": ", 1)[1])
        except images.ImageError as e:
            skipped["bad images"] += 1
            notes.append(f"{rel}: skipped: {e}")
        except DocumentError as e:
            what = "binary" if "looks binary" in str(e) else "unreadable documents"
            skipped[what] += 1
            if what == "binary":
                binaries.append(rel)
            else:
                notes.append(f"{rel}: skipped: {str(e).removeprefix(rel + ': ')}")
        except OSError:
            skipped["unreadable"] += 1
            notes.append(f"{rel}: unreadable (skipped)")
    notes[:0] = sorted(missing)
    if binaries:
        shown = ", ".join(binaries[:8]) + (" ..." if len(binaries) > 8 else "")
        notes.insert(0, f"binary files skipped: {shown}")
    if skipped:
        notes.insert(0, "skipped files: " + ", ".join(f"{n} {k}" for k, n in skipped.items()))
    if not files:
        raise DocumentError(f"directory {root} holds no readable text, document or image files"
                            + (f" ({notes[0]})" if notes else ""))
    return files, notes
