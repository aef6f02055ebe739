"""Turn a user's context (str, list, dict, file, directory) into a sandbox payload + description.

The payload is one file the worker reads once; the description is all the root model ever sees of
the context: type, size, structure and a short preview.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa.base import images
from recursa.base.types import ContextError, ContextPayload
from recursa.documents.errors import DocumentError
from recursa.documents.model import Document, has_documents, to_wire
from recursa.documents.source import Source, detect
from recursa.documents.tree import load_tree

PREVIEW_CHARS = 400


def estimate_tokens(chars: int) -> int:
    """About four characters a token for English text and code; used for display and budgets."""
    return (chars + 3) // 4


@dataclass
class Prepared:
    payload: ContextPayload
    description: str
    chars: int
    notes: list[str] = field(default_factory=list)  # problems met while loading (skipped files)


def load_path(path: Path) -> tuple[Any, list[str]]:
    """Read a file (-> a Document for PDF, Office, EPUB, HTML, Markdown, CSV, ... files; an
    Image; a dict by member path for a zip/tar archive; else its text as str) or a directory
    (-> {relative path: value}, honouring .gitignore). Returns (value, notes)."""
    if not path.exists():
        raise ContextError(f"context path does not exist: {path}")
    if path.is_file():
        got = _load_file(path)
        return got.value, got.notes
    if not path.is_dir():
        raise ContextError(f"context path is neither a file nor a directory: {path}")
    return load_tree(path)


def _load_file(path: Path, stream_to: Path | None = None) -> Any:
    """confine.load_file: a document is parsed in a confined process, never here."""
    from recursa.documents import confine
    try:
        return confine.load_file(path, stream_to=stream_to)
    except OSError as e:
        raise ContextError(f"cannot read context file {path}: {e.strerror or e}") from e


def load_inner_paths(value: Any) -> Any:
    """Paths inside a list/dict context: image files stay for images.normalize, any other
    file (or directory) is read as load_path reads it."""
    if isinstance(value, os.PathLike):
        p = Path(value)
        if not p.exists():
            raise ContextError(f"context path does not exist: {p}")
        if not p.is_dir() and not p.is_file():   # a FIFO or a device is never opened
            raise ContextError(f"context path is neither a file nor a directory: {p}")
        if p.is_dir() or detect(Source(p.name, path=p), deep=False) != "image":
            return load_path(p)[0]
        return value
    if isinstance(value, dict):
        return {k: load_inner_paths(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [load_inner_paths(v) for v in value]
    return value


def _spread(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    # here: a text context, the usual one, needs none of it
    import statistics
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
    # recursa.documents.describe (and .build) load only for a document or a collection: a
    # text context, the usual one, needs neither (~2 ms of a run's start-up)
    lines: list[str] = []
    if source:
        lines.append(f"source: {source}")
    if isinstance(value, Document):
        from recursa.documents import describe as doc_describe
        from recursa.documents.build import DocStats
        lines += doc_describe.describe_document(DocStats.of(value))
    elif isinstance(value, str):
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
        is_tree = source is not None and source.startswith(("directory", "archive"))
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
    if isinstance(value, list | dict):
        from recursa.documents import describe as doc_describe
        lines += doc_describe.describe_collection(value)
    if isinstance(value, images.Image):
        lines.append(f"type: Image, one {value.format} image, {value.width}x{value.height} "
                     f"pixels, {value.nbytes:,} bytes")
    elif not isinstance(value, str | list | dict):
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
        if path.is_file():
            got = _prepare_streamed(path, workdir)
            if isinstance(got, Prepared):
                return got
            context, notes = got.value, got.notes
        else:
            context, notes = load_path(path)
        source = (f"directory {path.name}/" if path.is_dir() else
                  f"archive {path.name}" if isinstance(context, dict) else f"file {path.name}")
    elif isinstance(context, list | tuple | dict):
        context = load_inner_paths(context)
    if context is None:
        raise ContextError("no context given: pass context=<str | list | dict | Path>")
    context, found = images.normalize(context)   # images anywhere -> images.Image
    if isinstance(context, bytes):   # e.g. `--context -`: a piped PDF is read as a PDF
        from recursa.documents import confine
        context, read_notes = confine.load_bytes(context, "context bytes")
        notes += read_notes
        if isinstance(context, list | dict):
            context, more = images.normalize(context)
            found += more
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
    if isinstance(context, str) and not isinstance(context, Document):
        path = workdir / "context.txt"
        data = context.encode("utf-8", errors="surrogatepass")
        kind = "text"
    else:
        path = workdir / "context.json"
        try:
            wire = to_wire(context) if has_documents(context) else context
            data = json.dumps(wire, ensure_ascii=False,
                              default=images.json_default).encode("utf-8", errors="replace")
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


def _prepare_streamed(path: Path, workdir: Path) -> Any:
    """A document file (PDF, Office, CSV, ...) written into the payload as it is read, one page
    or a few thousand rows at a time (by the confined parser), so a big file is never held in
    memory whole: its Prepared. Any other file: what confine.load_file made of it."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "context.json"
    try:
        got = _load_file(path, stream_to=out)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    stats = got.stats
    if stats is None:
        out.unlink(missing_ok=True)
        return got
    if stats.chars == 0:
        out.unlink(missing_ok=True)
        raise DocumentError(f"{path.name}: no text could be read from it"
                            + (f" ({stats.notes[0]})" if stats.notes else ""))
    h = hashlib.sha256()
    with out.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    payload = ContextPayload(path=str(out), kind="json", sha256=h.hexdigest(),
                             size_bytes=out.stat().st_size)
    from recursa.documents import describe as doc_describe
    lines = [f"source: file {path.name}", *doc_describe.describe_document(stats)]
    lines += [f"note: {n}" for n in stats.notes[:10]]
    return Prepared(payload=payload, description="\n".join(lines), chars=stats.chars,
                    notes=list(stats.notes))
