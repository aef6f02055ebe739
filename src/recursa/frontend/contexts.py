"""`--context`, as `run`, `chat` and `batch` read it: once or more, each a file, a directory,
`-` (stdin) or a pipe (`<(cmd)`, a named FIFO).

One path is handed to the library as a Path (a big document streams into the sandbox); a pipe
or stdin is read here, once, up to the document loader's cap. Several load as one context, a
dict {name: contents} in the shape a directory loads as: a file under its name, a directory as
its own {relative path: contents} under its name, stdin as "stdin", an anonymous pipe
(/dev/fd/N) as "pipe-N" (N: its place among the --context options). A source the model quotes
then names the file it is in. Only a pipe named on the command line is read: a FIFO or device
inside a directory is still skipped by the folder walk (recursa.documents.tree).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from recursa.frontend.options import OptionError

STDIN = "-"


def read_contexts(args: Sequence[str] | None, *, flag: str = "--context",
                  stdin: bool = True, say: Callable[[str], Any] | None = None) -> Any:
    """The context the `flag` options name: None when none was given; one: a Path, or the bytes
    of stdin or a pipe; several: a dict {name: Path or loaded contents}. Nothing is sent to a
    model before this has read them: a bad one is an OptionError naming it. `stdin=False`: the
    command reads something else from stdin (chat reads its questions there)."""
    if not args:
        return None
    given = [_given(arg, i, flag, stdin) for i, arg in enumerate(args, 1)]
    _refuse_repeats(given, flag)
    if len(given) == 1:
        return given[0].value
    names = _names(given)
    out: dict[str, Any] = {}
    for g, name in zip(given, names, strict=True):
        if isinstance(g.value, bytes):    # read as a file of that name would be (a PDF, CSV...)
            from recursa.documents import confine
            value, notes = confine.load_bytes(g.value, name)
            for note in notes:
                if say:
                    say(f"{flag} {g.arg}: {note}")
            out[name] = value
        else:
            out[name] = g.value
    return out


@dataclass(frozen=True)
class _Given:
    arg: str                 # as typed
    index: int               # its place among the options, from 1
    value: Path | bytes      # a file or directory, or what a pipe gave
    pipe: bool


def _given(arg: str, index: int, flag: str, stdin: bool) -> _Given:
    if arg == STDIN:
        if not stdin:
            raise OptionError(f"{flag} -: this command reads its questions from stdin; give "
                              f"{flag} a file, a directory or a pipe such as <(cmd)")
        return _Given(arg, index, read_capped(sys.stdin.buffer, f"{flag} -"), True)
    path = Path(arg)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:      # before any model is fetched or called
        raise OptionError(f"{flag} {arg}: that file or directory does not exist") from None
    except OSError as e:
        raise OptionError(f"{flag} {arg}: cannot read it ({e.strerror or e})") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return _Given(arg, index, path, False)
    if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise OptionError(f"{flag} {arg}: neither a file, a directory nor a pipe (a socket "
                          "or a block device is no context)")
    # a pipe (`<(cmd)` is /dev/fd/N) or a character device, named on the command line: read
    # once, here (it cannot be read again to check the answer's sources)
    try:
        with open(path, "rb") as f:
            data = read_capped(f, f"{flag} {arg}")
    except OSError as e:
        raise OptionError(f"{flag} {arg}: cannot read it ({e.strerror or e})") from None
    return _Given(arg, index, data, True)


def read_capped(f: BinaryIO, what: str) -> bytes:
    """All of a stream, refused past the cap on one document the loader keeps
    (recursa.documents.limits.MAX_DOCUMENT_BYTES): a stream has no size to check first."""
    from recursa.documents import limits
    cap = limits.MAX_DOCUMENT_BYTES
    chunks: list[bytes] = []
    n = 0
    while chunk := f.read(min(1 << 20, cap + 1 - n)):
        chunks.append(chunk)
        n += len(chunk)
        if n > cap:
            raise OptionError(f"{what}: more than {limits.mb(cap)} came through it, over the "
                              "limit for one document (MAX_DOCUMENT_BYTES in "
                              "recursa.documents.limits)")
    return b"".join(chunks)


def _refuse_repeats(given: list[_Given], flag: str) -> None:
    seen: dict[str, str] = {}
    for g in given:
        key = STDIN if g.arg == STDIN else \
            str(g.index) if g.pipe else os.path.realpath(g.arg)  # a pipe is read once each
        if key in seen:
            raise OptionError(f"{flag} {g.arg}: given twice (as {flag} {seen[key]} too)")
        seen[key] = g.arg


def _names(given: list[_Given]) -> list[str]:
    """Each context's key: its file or directory name; the path as given where two share a
    name; "stdin"; "pipe-N" for an anonymous pipe."""
    def short(g: _Given) -> str:
        if g.arg == STDIN:
            return "stdin"
        if g.pipe and os.path.abspath(g.arg).startswith(("/dev/", "/proc/")):
            return f"pipe-{g.index}"
        return Path(os.path.abspath(g.arg)).name or g.arg
    names = [short(g) for g in given]
    clash = {n for n in names if names.count(n) > 1}
    names = [os.path.normpath(g.arg) if n in clash else n for g, n in zip(given, names,
                                                                         strict=True)]
    if len(set(names)) < len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise OptionError(f"two contexts would both be named {dup!r}; give them by paths "
                          "that differ")
    return names
