"""The confined document parser: the program recursa.documents.confine starts, once per load.

Its command line carries its set-up (`main(args)`): the control groups to join, the rlimits and
where to write. It then reads one request from stdin (the bounds in force on the host and what
to read: a file, or a folder), locks itself down (no capabilities, the seccomp filter of the
REPL worker) and only then opens the input. The context's JSON goes to `<out>/result.json`
(a document of a streamed format: the payload JSON, written page by page); a one-line status
to its stdout, which the host keeps in a file: {"ok": true, "notes": [...], "stats": ...} or
{"ok": false, "type": "DocumentError", "message": "report.pdf: ..."}.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from recursa.base import images
from recursa.base.types import ContextError
from recursa.documents import limits
from recursa.documents.errors import DocumentError, MissingExtra
from recursa.documents.load import EXTRACTORS, check_size, iter_archive, load_source, stream_file
from recursa.documents.model import to_wire
from recursa.documents.source import ARCHIVES, Source, detect


def setup(args: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Confine this process as `args` say and read the request: (request, the fd the status
    goes to). Joins the control groups, sets the rlimits, reads the request, adopts the host's
    bounds, and locks down (no capabilities, the seccomp filter) before anything is parsed."""
    from recursa.sandbox.worker import apply_limits, join_cgroups, lock_down
    join_cgroups([int(fd) for fd in args.get("cgroup_fds") or []])
    rlimits = dict(args.get("rlimits") or {})
    cpu = rlimits.pop("cpu", None)
    apply_limits(rlimits)
    if cpu:
        # SIGXCPU ends it at the cap (SIGKILL a little later if it is ignored): the host can
        # tell the CPU cap from the memory cap's SIGKILL
        import resource
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 2))
        except (ValueError, OSError):   # a lower hard limit inherited: keep to that
            apply_limits({"cpu": int(cpu)})
    status_fd = os.dup(1)
    os.dup2(2, 1)          # a library that prints cannot garble the status
    request: dict[str, Any] = json.load(sys.stdin)
    for k, v in (request.get("limits") or {}).items():
        if k.isupper() and isinstance(getattr(limits, k, None), int) and isinstance(v, int):
            setattr(limits, k, v)
    lock_down(required=args.get("confine") == "require")
    return request, status_fd


def main(args: dict[str, Any]) -> int:
    request, status_fd = setup(args)
    name = str(request.get("name") or "document")
    try:
        status = handle(request, Path(args["out"]))
    except MissingExtra as e:
        status = _error("MissingExtra", str(e))
    except images.ImageError as e:
        status = _error("ImageError", str(e))
    except (DocumentError, ContextError) as e:
        status = _error("DocumentError", str(e))
    except MemoryError:
        status = _error("MemoryError", f"{name}: out of memory")
    except OSError as e:
        if e.errno == errno.EFBIG:
            status = _error("OutputLimit", f"{name}: output over its cap")
        else:
            status = _error("DocumentError", f"{name}: cannot be read ({e.strerror or e})")
    except Exception as e:   # a parser's own error: named, never a traceback to the host
        status = _error("DocumentError", f"{name}: cannot be read ({type(e).__name__}: {e})")
    write_status(status_fd, status)
    return 0


def write_status(fd: int, status: dict[str, Any]) -> None:
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(status, ensure_ascii=False, default=str))


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "type": kind, "message": message}


def handle(request: dict[str, Any], out: Path) -> dict[str, Any]:
    """Read what `request` names into `out`/result.json; the status to report."""
    notes: list[str] = []
    result = out / "result.json"
    path = Path(str(request["path"]))
    name = str(request["name"])
    skip = {str(k): str(v) for k, v in (request.get("skip") or {}).items()}

    def reading(entry: str) -> None:   # the host skips it if it kills this process
        (out / "current").write_text(entry, encoding="utf-8")
    if request["op"] == "tree":
        from recursa.documents.tree import iter_tree
        _write_entries(result, iter_tree(path, notes, label=name, skip=skip, reading=reading))
        return {"ok": True, "notes": notes}
    src = Source(name, path=path)
    cap = int(request.get("cap") or limits.MAX_DOCUMENT_BYTES)
    check_size(src, cap)
    kind = detect(src)
    if request.get("stream") and kind in EXTRACTORS:
        with result.open("w", encoding="utf-8", errors="replace") as f:
            stats = stream_file(path, f, name=name)
        assert stats is not None
        return {"ok": True, "notes": list(stats.notes), "stats": dataclasses.asdict(stats)}
    if kind in ARCHIVES:   # member by member: one member's text in memory at a time
        _write_entries(result, iter_archive(src, kind, notes, skip=skip, reading=reading))
    else:
        value = load_source(src, notes, cap=cap)
        with result.open("w", encoding="utf-8", errors="replace") as f:
            _dump(value, f)
    return {"ok": True, "notes": notes}


def _dump(value: Any, f: TextIO) -> None:
    json.dump(to_wire(value), f, ensure_ascii=False, default=images.json_default)


def _write_entries(result: Path, entries: Iterable[tuple[str, Any]]) -> None:
    """{key: value} written one entry at a time as the entries are read."""
    with result.open("w", encoding="utf-8", errors="replace") as f:
        f.write("{")
        for i, (key, value) in enumerate(entries):
            f.write(("," if i else "") + json.dumps(key, ensure_ascii=False) + ":")
            _dump(value, f)
        f.write("}")
