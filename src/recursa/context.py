"""Turn a user's context (str, list, dict, file, directory) into a sandbox payload + description.

The payload is one file the worker reads once; the description is all the root model ever sees of
the context: type, size, structure and a short preview.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa import images
from recursa.types import ContextError, ContextPayload

PREVIEW_CHARS = 400
SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".tox", ".idea", ".vscode", "dist", "build"}
MAX_FILE_BYTES = 50 * 1024 * 1024


def estimate_tokens(chars: int) -> int:
    """About four characters a token for English text and code; used for display and budgets."""
    return (chars + 3) // 4


@dataclass
class Prepared:
    payload: ContextPayload
    description: str
    chars: int
    notes: list[str] = field(default_factory=list)  # problems met while loading (skipped files)


def _decode(data: bytes, name: str) -> tuple[str, int]:
    """UTF-8 text, replacing invalid bytes; binary data is refused."""
    if b"\x00" in data[:8192]:
        raise ContextError(f"{name} looks binary (it contains NUL bytes); give a text file")
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, text.count("\ufffd")


def load_path(path: Path) -> tuple[Any, list[str]]:
    """Read a file (-> str) or a directory (-> {relative path: text}). Returns (value, notes)."""
    if not path.exists():
        raise ContextError(f"context path does not exist: {path}")
    notes: list[str] = []
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ContextError(f"cannot read context file {path}: {e.strerror}") from e
        if path.suffix.lower() in images.SUFFIXES or images.sniff(data[:16]):
            return images.Image.from_bytes(data, name=path.name), notes
        text, bad = _decode(data, str(path))
        if bad:
            notes.append(f"{path.name}: {bad} invalid UTF-8 bytes replaced by U+FFFD")
        return text, notes
    if not path.is_dir():
        raise ContextError(f"context path is neither a file nor a directory: {path}")
    files: dict[str, Any] = {}
    skipped: Counter[str] = Counter()
    for root, dirs, names in os.walk(path, onerror=lambda e: skipped.update(["unreadable"])):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for n in sorted(names):
            p = Path(root) / n
            rel = p.relative_to(path).as_posix()
            try:
                if p.is_symlink() or not p.is_file():
                    continue
                if p.stat().st_size > MAX_FILE_BYTES:
                    skipped["larger than 50 MB"] += 1
                    continue
                data = p.read_bytes()
            except OSError:
                skipped["unreadable"] += 1
                notes.append(f"{rel}: unreadable (skipped)")
                continue
            if p.suffix.lower() in images.SUFFIXES or images.sniff(data[:16]):
                try:
                    files[rel] = images.Image.from_bytes(data, name=rel)
                except images.ImageError as e:
                    skipped["bad images"] += 1
                    notes.append(f"{rel}: skipped: {e}")
                continue
            try:
                text, bad = _decode(data, rel)
            except ContextError:
                skipped["binary"] += 1
                continue
            if bad:
                notes.append(f"{rel}: {bad} invalid UTF-8 bytes replaced")
            files[rel] = text
    if skipped:
        notes.insert(0, "skipped files: " + ", ".join(f"{n} {k}" for k, n in skipped.items()))
    if not files:
        raise ContextError(f"directory {path} holds no readable text or image files"
                           + (f" ({notes[0]})" if notes else ""))
    return files, notes


def _spread(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    return (f"min {min(sizes):,}, median {int(statistics.median(sizes)):,}, "
            f"max {max(sizes):,} chars")


def _preview(text: str, n: int = PREVIEW_CHARS) -> str:
    return repr(text[:n]) + (" ..." if len(text) > n else "")


def _tree_summary(files: dict[str, str], limit: int = 40) -> str:
    dirs: Counter[str] = Counter()
    exts: Counter[str] = Counter()
    for rel in files:
        dirs[rel.rsplit("/", 1)[0] if "/" in rel else "."] += 1
        exts[Path(rel).suffix or "(none)"] += 1
    lines = [f"  {d}/  ({n} files)" for d, n in sorted(dirs.items())[:limit]]
    if len(dirs) > limit:
        lines.append(f"  ... and {len(dirs) - limit} more directories")
    ext_s = ", ".join(f"{e} {n}" for e, n in exts.most_common(10))
    return "file types: " + ext_s + "\n" + "\n".join(lines)


def describe(value: Any, *, source: str | None = None, notes: list[str] | None = None) -> str:
    """What the root model sees of the context. Never the whole context."""
    lines: list[str] = []
    if source:
        lines.append(f"source: {source}")
    if isinstance(value, str):
        lines.append(f"type: str, {len(value):,} characters (~{estimate_tokens(len(value)):,} "
                     f"tokens), {value.count(chr(10)) + 1:,} lines")
        lines.append(f"preview: {_preview(value)}")
    elif isinstance(value, list):
        sizes = [len(x) if isinstance(x, str) else len(json.dumps(x, default=str)) for x in value]
        total = sum(sizes)
        types = Counter(type(x).__name__ for x in value)
        lines.append(f"type: list of {len(value):,} items ({', '.join(f'{n} {t}' for t, n in types.items())}), "
                     f"{total:,} characters in all (~{estimate_tokens(total):,} tokens)")
        lines.append(f"item sizes: {_spread(sizes)}")
        if value:
            first = value[0] if isinstance(value[0], str) else json.dumps(value[0], default=str)
            lines.append(f"context[0] preview: {_preview(first, 200)}")
    elif isinstance(value, dict):
        keys = list(value)
        sizes = [len(v) if isinstance(v, str) else len(json.dumps(v, default=str))
                 for v in value.values()]
        total = sum(sizes)
        is_tree = source is not None and source.startswith("directory")
        has_img = any(isinstance(v, images.Image) for v in value.values())
        kind = ("files (relative path -> text" + (" or Image)" if has_img else ")")
                if is_tree else "keys")
        lines.append(f"type: dict with {len(keys):,} {kind}, {total:,} characters of values "
                     f"(~{estimate_tokens(total):,} tokens)")
        lines.append(f"value sizes: {_spread(sizes)}")
        if is_tree:
            lines.append(_tree_summary(value))
        shown = ", ".join(repr(k) for k in keys[:15])
        lines.append(f"first keys: {shown}" + (" ..." if len(keys) > 15 else ""))
    elif isinstance(value, images.Image):
        lines.append(f"type: Image, one {value.format} image, {value.width}x{value.height} "
                     f"pixels, {value.nbytes:,} bytes")
    else:
        lines.append(f"type: {type(value).__name__}")
    for n in (notes or [])[:10]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, images.Image):
        return 0
    if isinstance(value, list):
        return sum(len(x) if isinstance(x, str) else len(json.dumps(x, default=str)) for x in value)
    return sum(len(v) if isinstance(v, str) else len(json.dumps(v, default=str))
               for v in value.values())


def prepare(context: Any, workdir: Path) -> Prepared:
    """Validate the context, write its payload file into `workdir`, and describe it.

    Strings are text. Paths must be given as `pathlib.Path` (or `os.PathLike`) so that a short
    text is never mistaken for a file name.
    """
    source = None
    notes: list[str] = []
    if isinstance(context, os.PathLike):
        path = Path(context)
        context, notes = load_path(path)
        source = f"directory {path.name}/" if path.is_dir() else f"file {path.name}"
    if context is None:
        raise ContextError("no context given: pass context=<str | list | dict | Path>")
    context, found = images.normalize(context)   # images anywhere -> images.Image
    if isinstance(context, bytes):
        context, bad = _decode(context, "context bytes")
        if bad:
            notes.append(f"{bad} invalid UTF-8 bytes replaced by U+FFFD")
    if isinstance(context, tuple):
        context = list(context)
    if not isinstance(context, str | list | dict | images.Image):
        raise ContextError(f"context must be str, list, dict, an image or a Path, not "
                           f"{type(context).__name__}")
    if isinstance(context, dict) and not all(isinstance(k, str) for k in context):
        raise ContextError("dict context must have str keys (it is passed to the REPL as JSON)")
    if not isinstance(context, images.Image) and len(context) == 0:
        raise ContextError("context is empty: there is nothing to answer the query over")

    workdir.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    if isinstance(context, str):
        path = workdir / "context.txt"
        data = context.encode("utf-8", errors="surrogatepass")
        kind = "text"
    else:
        path = workdir / "context.json"
        try:
            data = json.dumps(context, ensure_ascii=False,
                              default=images.json_default).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ContextError(f"context is not JSON-serialisable: {e}") from e
        kind = "json"
    h.update(data)
    path.write_bytes(data)
    payload = ContextPayload(path=str(path), kind=kind, sha256=h.hexdigest(),
                             size_bytes=len(data))
    description = "\n".join([describe(context, source=source, notes=notes),
                             *images.describe_images(found)])
    return Prepared(payload=payload, description=description, chars=_size(context), notes=notes)
