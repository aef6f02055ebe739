"""Parse documents in a confined process, never in the one that holds the API keys.

PDFium, lxml, openpyxl, pyarrow and the other parsers are native code reading bytes someone
else wrote. Each load (a file, bytes, a whole folder or archive) runs them in one process of its
own (recursa.documents.parse_worker), started the way the local sandbox starts a worker:

  * bubblewrap where it works (`WorkerConfig.program_command`): a clean environment (no keys),
    no network, its own pid/ipc/uts/user namespaces, no capabilities, the seccomp filter, and a
    filesystem of /usr, the interpreter, the parser libraries and recursa (read-only), the input
    (read-only), one output directory and a size-capped /tmp. Elsewhere (no bubblewrap, not
    Linux) the same process without bubblewrap: clean environment, rlimits, seccomp where it
    can, but the host's files and network in reach;
  * caps: memory of its whole process tree (a control group where the host can make one, else
    the host's watch of resident memory; address space per process), CPU seconds, wall-clock
    seconds, and the size of everything it writes (RLIMIT_FSIZE): `ParseCaps`, from
    recursa.documents.limits (PARSE_*; environment RECURSA_PARSE_MEMORY_MB, ...);
  * it writes the context's JSON to a file of the output directory and a short status to its
    stdout (a file too); the host reads the status, then the value, as the caller needs it.

Plain text and images never reach a parser (their headers are read here, as before); everything
else does. RECURSA_DOCUMENT_SANDBOX picks how: "auto" (bubblewrap if it works here, else the
unconfined process), "bwrap" (refuse without it), "limits", or "off" (parse in this process:
only for files you trust, or to debug a parser).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import logging
import os
import shutil
import signal
import site
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recursa.base import images
from recursa.base.tempdirs import owned_tempdir
from recursa.documents import limits
from recursa.documents.errors import DocumentError, MissingExtra
from recursa.documents.load import check_size, load_source
from recursa.documents.model import revive
from recursa.documents.source import Source, detect

if TYPE_CHECKING:
    from recursa.documents.build import DocStats

log = logging.getLogger("recursa.documents")

ENV_MODE = "RECURSA_DOCUMENT_SANDBOX"
MODES = ("auto", "bwrap", "limits", "off")
# what a format's parser needs besides recursa: the directories that hold these are shown to
# the parser (read-only), nothing else of the host's sys.path
LIBRARIES = ("pypdfium2", "docx", "pptx", "openpyxl", "et_xmlfile", "ebooklib", "selectolax",
             "pyarrow", "pathspec", "markdown_it", "mdurl", "lxml", "PIL", "typing_extensions")
NO_PARSER = frozenset({"text", "image", "binary", "legacy-office"})   # read here, as before
PROCESSES = 512           # processes and threads of a parser (pyarrow starts one per core)
STATUS_BYTES = 256 * 1024**2
MAX_SKIPS = 3             # files of a folder skipped for killing the parser before it gives up
_IN, _OUT = "/recursa/in", "/recursa/out"
MB = 1024 * 1024

# the parser's first lines: make the parser libraries and recursa importable, then run it
BOOT = ("import json, site, sys\n"
        "for p in json.loads(sys.argv[1]):\n"
        "    site.addsitedir(p)\n"
        "from recursa.documents.parse_worker import main\n"
        "sys.exit(main(json.loads(sys.argv[2])))\n")


@dataclass(frozen=True)
class ParseCaps:
    """What one confined parse may use (its whole process tree)."""

    memory_mb: int = field(default_factory=lambda: limits.PARSE_MEMORY_MB)
    cpu_seconds: int = field(default_factory=lambda: limits.PARSE_CPU_SECONDS)
    seconds: float = field(default_factory=lambda: float(limits.PARSE_SECONDS))
    output_mb: int = field(default_factory=lambda: limits.PARSE_OUTPUT_MB)

    def rlimits(self, *, cgroup: bool) -> dict[str, int]:
        # Under a control group, which holds the tree's resident memory to the cap, address
        # space may be twice it (thread stacks and allocator arenas reserve more than they
        # use); without one the host's watch of resident memory is a poll, so the address
        # space of each process is held to the cap itself
        space = (2 if cgroup else 1) * self.memory_mb * MB
        return {"as": space, "cpu": self.cpu_seconds, "fsize": self.output_mb * MB, "core": 0}


@dataclass
class Loaded:
    """A file as a context value (`value`), or, streamed into the caller's file, its numbers
    (`stats`); with the notes of what was odd while reading it."""

    value: Any = None
    notes: list[str] = field(default_factory=list)
    stats: DocStats | None = None


# ------------------------------------------------------------------ the public loaders
def load_file(path: Path, name: str | None = None, *, cap: int | None = None,
              stream_to: Path | None = None, caps: ParseCaps | None = None) -> Loaded:
    """One file: a Document, {member: value} for an archive, an Image or text. With
    `stream_to`, a document of a streamed format (PDF, Office, CSV, ...) is written there as
    the sandbox's payload JSON and only its DocStats come back."""
    src = Source(name or path.name, path=path)
    real = os.path.realpath(path)
    if not stat.S_ISREG(os.stat(real).st_mode):   # a FIFO or a device is never opened
        raise DocumentError(f"{src.name}: not a regular file (a device, FIFO or socket)")
    check_size(src, limits.MAX_DOCUMENT_BYTES if cap is None else cap)
    kind = detect(src, deep=False)
    notes: list[str] = []
    if kind in NO_PARSER:
        return Loaded(load_source(src, notes, cap=cap or limits.MAX_DOCUMENT_BYTES), notes)
    how = mode()
    if how == "off":
        return _here_file(src, cap, stream_to)
    inside = f"{_IN}/file{_suffix(src.name)}" if how == "bwrap" else real
    req = {"op": "file", "path": inside, "name": src.name, "cap": cap,
           "stream": stream_to is not None}
    return _confined(how, req, src.name, [(real, inside)], caps, stream_to)


def load_bytes(data: bytes, name: str, *, caps: ParseCaps | None = None
               ) -> tuple[Any, list[str]]:
    """A file's bytes (an upload, a piped context) as `load_file` reads a file."""
    src = Source(name, data=data)
    check_size(src, limits.MAX_DOCUMENT_BYTES)
    notes: list[str] = []
    how = mode()
    if how == "off" or detect(src, deep=False) in NO_PARSER:
        return load_source(src, notes), notes
    work = Path(owned_tempdir("recursa-upload-"))
    try:
        inp = work / f"input{_suffix(name)}"
        fd = os.open(inp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        inside = f"{_IN}/file{_suffix(name)}" if how == "bwrap" else str(inp)
        req = {"op": "file", "path": inside, "name": name, "cap": None, "stream": False}
        got = _confined(how, req, name, [(str(inp), inside)], caps, None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return got.value, got.notes


def load_folder(root: Path, *, caps: ParseCaps | None = None) -> tuple[dict[str, Any], list[str]]:
    """A folder: {relative path: value}, honouring .gitignore (recursa.documents.tree)."""
    how = mode()
    if how == "off":
        from recursa.documents.tree import read_tree
        return read_tree(root)
    real = os.path.realpath(root)
    inside = f"{_IN}/root" if how == "bwrap" else real
    req = {"op": "tree", "path": inside, "name": str(root)}
    got = _confined(how, req, f"directory {root}", [(real, inside)], caps, None)
    return got.value, got.notes


def _suffix(name: str) -> str:
    """The file's extension, for the path the parser opens (openpyxl insists on .xlsx)."""
    ext = Path(name).suffix
    return ext if ext[1:].isalnum() and len(ext) <= 16 else ""


# ------------------------------------------------------------------ how
def mode() -> str:
    """How documents are parsed here: "bwrap", "limits" or "off" (RECURSA_DOCUMENT_SANDBOX;
    "auto", the default, is bubblewrap where it can make a sandbox, else "limits"). A bubblewrap
    that fails is probed again next time (isolation.py keeps only successes)."""
    want = (os.environ.get(ENV_MODE) or "auto").strip().lower()
    if want not in MODES:
        raise ValueError(f"{ENV_MODE} must be one of {', '.join(MODES)}, not {want!r}")
    if want in ("limits", "off"):
        return want
    from recursa.sandbox.isolation import find_bwrap, require_isolation, unavailable_reason
    if want == "bwrap":
        require_isolation()
        return "bwrap"
    bw = find_bwrap() if sys.platform == "linux" else None
    if bw is None:
        return "limits"
    why = unavailable_reason(bw)
    if why is None:
        return "bwrap"
    if bw not in _warned:
        _warned.add(bw)
        log.warning("recursa: documents are parsed without bubblewrap (%s)", why)
    return "limits"


_warned: set[str] = set()


def python_paths() -> list[str]:
    """The directories of sys.path (in its order) that hold recursa or a parser library, and
    the site-packages: what the parser imports from. Nothing else (a script's own folder, the
    current directory) is shown to it."""
    return list(_python_paths(tuple(sys.path)))


@functools.lru_cache(maxsize=4)
def _python_paths(path: tuple[str, ...]) -> tuple[str, ...]:
    sites: list[str] = getattr(site, "getsitepackages", list)()   # absent in old virtualenvs
    want = {os.path.realpath(p) for p in sites if os.path.isdir(p)}
    for top in ("recursa", *LIBRARIES):
        spec = importlib.util.find_spec(top)
        for where in (spec.submodule_search_locations or []) if spec else []:
            want.add(os.path.realpath(os.path.dirname(where)))
    ordered = [os.path.realpath(p) for p in path if p and os.path.isdir(p)]
    return tuple(dict.fromkeys([p for p in ordered if p in want] + sorted(want)))


# ------------------------------------------------------------------ in this process ("off")
def _here_file(src: Source, cap: int | None, stream_to: Path | None) -> Loaded:
    from recursa.documents.load import stream_file
    notes: list[str] = []
    if stream_to is not None and src.path is not None:
        with stream_to.open("w", encoding="utf-8", errors="replace") as f:
            stats = stream_file(src.path, f, name=src.name)
        if stats is not None:
            return Loaded(notes=list(stats.notes), stats=stats)
        stream_to.unlink(missing_ok=True)
    return Loaded(load_source(src, notes, cap=cap or limits.MAX_DOCUMENT_BYTES), notes)


# ------------------------------------------------------------------ the confined process
class ParserProcess:
    """One confined parser process: its directory, command, caps and what ended it. `boot` is
    the Python it runs (BOOT: recursa.documents.parse_worker; tests run probes the same way);
    `binds` are (host path, path inside) shown read-only; `how` is "bwrap" or "limits"."""

    def __init__(self, how: str, caps: ParseCaps, binds: list[tuple[str, str]],
                 boot: str = BOOT):
        self.how, self.caps, self.boot = how, caps, boot
        self.work = Path(owned_tempdir("recursa-parse-"))
        self.out = self.work / "out"
        self.out.mkdir(mode=0o700)
        self.binds = binds
        self.reason: str | None = None       # why the host stopped it
        self._stopped = threading.Event()

    def command(self, args: dict[str, Any]) -> tuple[list[str], dict[str, str] | None, str]:
        from recursa.sandbox.local import WorkerConfig, base_python
        python = base_python()
        paths = python_paths()
        if self.how == "limits":
            tmp = self.work / "tmp"
            tmp.mkdir(mode=0o700)
            env = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
                   "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.work),
                   "TMPDIR": str(tmp)}
            return ([python, "-I", "-S", "-c", self.boot, json.dumps(paths), json.dumps(args)], env,
                    str(self.work))
        from recursa.sandbox.isolation import find_bwrap
        tmp_mb = limits.MAX_MEMBER_BYTES // MB + 64   # a SQLite member is read from a file
        config = WorkerConfig(mode="bwrap", python=python, bwrap=find_bwrap(), limits=(),
                              tmp_mb=tmp_mb, drop_uid=False, pillow=None)
        inside = [f"/recursa/lib/{i}" for i in range(len(paths))]
        ro = [*zip(paths, inside, strict=True), *self.binds]
        argv = config.program_command(
            ["-I", "-S", "-c", self.boot, json.dumps(inside), json.dumps(args)],
            ro=ro, rw=[(str(self.out), _OUT)])
        return argv, {}, str(self.work)

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._stopped.set()

    def run(self, request: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str]:
        """Start, wait, stop: (exit status, the status it wrote or None, its stderr tail)."""
        from recursa.sandbox.transport import kill_tree
        from recursa.sandbox.treelimits import WATCH, cgroup_host
        (self.work / "request.json").write_text(json.dumps(request))
        group = None
        fds: list[int] = []
        host = cgroup_host()
        if host is not None:
            try:
                group = host.new_group(self.caps.memory_mb * MB, PROCESSES)
                fds = group.open_procs()
            except OSError:   # e.g. the parent group vanished: the host's watch instead
                if group is not None:
                    group.remove()
                group = None
        args = {"rlimits": self.caps.rlimits(cgroup=group is not None), "cgroup_fds": fds,
                "confine": "require" if self.how == "bwrap" else "try",
                "out": _OUT if self.how == "bwrap" else str(self.out)}
        argv, env, cwd = self.command(args)
        key = None
        proc = None
        try:
            with open(self.work / "request.json", "rb") as stdin, \
                    open(self.work / "status.json", "wb") as stdout, \
                    open(self.work / "stderr.txt", "wb") as stderr:
                proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                        env=env, cwd=cwd, start_new_session=True,
                                        pass_fds=fds)
            for fd in fds:
                os.close(fd)
            fds = []
            if group is None:   # no control group: the host watches the tree's memory
                key = WATCH.watch(self.caps.memory_mb * MB,
                                  lambda rss: self.stop("memory"), root=proc.pid)
            deadline = time.monotonic() + self.caps.seconds
            while True:
                try:
                    proc.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if self._stopped.is_set():
                    break
                if group is not None and group.over_memory():
                    self.stop("memory")
                    break
                if time.monotonic() > deadline:
                    self.stop("time")
                    break
            if group is not None and self.reason is None and group.over_memory():
                self.reason = "memory"
        finally:
            for fd in fds:
                os.close(fd)
            if key is not None:
                WATCH.unwatch(key)
            if proc is not None:
                kill_tree(proc.pid, alive=proc.poll() is None)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
            if group is not None:
                group.remove()
        rc = proc.returncode if proc is not None and proc.returncode is not None else -9
        if self.how == "bwrap" and rc > 128:   # bubblewrap exits 128+N for a signal N
            rc = 128 - rc
        return rc, self._status(), self._stderr_tail()

    def _status(self) -> dict[str, Any] | None:
        try:
            data = _read_regular(self.work / "status.json", STATUS_BYTES)
            got = json.loads(data) if data else None
        except (OSError, ValueError):
            return None
        return got if isinstance(got, dict) else None

    def _stderr_tail(self) -> str:
        try:
            with open(self.work / "stderr.txt", "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 2000))
                return f.read().decode("utf-8", errors="replace").strip()
        except OSError:
            return ""

    def current(self) -> str | None:
        """The file of a folder (member of an archive) it was reading when it stopped."""
        try:
            return _read_regular(self.out / "current", 64 * 1024).decode("utf-8") or None
        except (OSError, UnicodeDecodeError):
            return None

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _read_regular(path: Path, cap: int) -> bytes:
    """The bytes of a file the parser wrote: a regular file (not a symlink it left there) of
    at most `cap` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
            raise OSError(f"{path.name}: not a regular file of at most {cap:,} bytes")
        return f.read(st.st_size)   # the parser is gone: the file no longer grows


def _confined(how: str, request: dict[str, Any], name: str, binds: list[tuple[str, str]],
              caps: ParseCaps | None, stream_to: Path | None) -> Loaded:
    """Run the parser on `request`. In a folder or an archive, a file that kills it (a cap,
    a crash) is skipped with a note and the rest read again, up to MAX_SKIPS files, within the
    one wall-clock budget."""
    caps = caps or ParseCaps()
    if stream_to is None:   # all it writes comes back into this process
        caps = dataclasses.replace(caps, output_mb=min(caps.output_mb, limits.loaded_output_mb()))
    deadline = time.monotonic() + caps.seconds
    skip: dict[str, str] = {}
    while True:
        left = max(1.0, deadline - time.monotonic())
        run = ParserProcess(how, dataclasses.replace(caps, seconds=left), binds)
        try:
            rc, status, err = run.run({**request, "limits": limits.values(), "skip": skip})
            if status is not None and status.get("ok"):
                return _loaded(run, status, name, caps, stream_to)
            culprit = run.current()
            fatal = status is None or run.reason is not None or \
                status.get("type") in ("MemoryError", "OutputLimit")
            if fatal and culprit and culprit not in skip and len(skip) < MAX_SKIPS and \
                    time.monotonic() < deadline:
                why = str(_failure(culprit, caps, run.reason, rc, status, err))
                skip[culprit] = why.removeprefix(f"{culprit}: ")
                continue
            raise _failure(name, caps, run.reason, rc, status, err)
        finally:
            run.cleanup()


def _loaded(run: ParserProcess, status: dict[str, Any], name: str, caps: ParseCaps,
            stream_to: Path | None) -> Loaded:
    notes = [str(n) for n in status.get("notes") or []]
    result = run.out / "result.json"
    if status.get("stats") is not None:
        from recursa.documents.build import DocStats
        try:
            stats = DocStats(**status["stats"])
        except TypeError as e:
            raise DocumentError(f"{name}: the confined parser's status cannot be read "
                                f"({e})") from None
        if stream_to is None:
            raise DocumentError(f"{name}: the parser streamed what was not asked for")
        _take_file(result, stream_to, caps)
        return Loaded(notes=notes, stats=stats)
    return Loaded(_read_value(result, name, caps), notes)


def _take_file(result: Path, dest: Path, caps: ParseCaps) -> None:
    """Move the parser's output to `dest`, once sure it is a regular file within the cap."""
    fd = os.open(result, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > caps.output_mb * MB:
            raise DocumentError(f"{dest.name}: the parser's output is not a regular file "
                                "within its cap")
    finally:
        os.close(fd)
    shutil.move(result, dest)


def _hook(d: dict[str, Any]) -> Any:
    if d.get(images.MARKER) == 1:
        return images.Image.from_wire(d)
    return revive(d)


def _read_value(result: Path, name: str, caps: ParseCaps) -> Any:
    held = min(caps.output_mb, limits.loaded_output_mb())
    with contextlib.suppress(OSError):     # a streamed load that came back as a value
        if result.stat().st_size > held * MB:
            raise DocumentError(_over_output(name, held))
    try:
        data = _read_regular(result, held * MB)
        return json.loads(data, object_hook=_hook)
    except (OSError, ValueError, TypeError, images.ImageError) as e:
        raise DocumentError(f"{name}: the confined parser's output cannot be read ({e})") \
            from None


_ERRORS: dict[str, type[Exception]] = {"MissingExtra": MissingExtra,
                                       "ImageError": images.ImageError}


def _over_output(name: str, output_mb: int) -> str:
    why = ("recursa.documents.limits.PARSE_OUTPUT_MB, env RECURSA_PARSE_OUTPUT_MB"
           if output_mb != limits.loaded_output_mb() or output_mb >= limits.PARSE_OUTPUT_MB
           else
           "what a load keeps in this process: 4 bytes a character of "
           f"recursa.documents.limits.MAX_LOADED_CHARS ({limits.MAX_LOADED_CHARS:,})")
    return f"{name}: its text is over the {output_mb:,} MB the parser may write ({why})"


def _failure(name: str, caps: ParseCaps, reason: str | None, rc: int,
             status: dict[str, Any] | None, err: str) -> Exception:
    """The error a failed parse raises: the parser's own (a DocumentError naming the file), or
    the cap that stopped it, or how it died."""
    if reason == "memory":
        return DocumentError(f"{name}: parsing it needed more than its {caps.memory_mb:,} MB "
                             "of memory, so it was stopped (recursa.documents.limits."
                             "PARSE_MEMORY_MB, env RECURSA_PARSE_MEMORY_MB)")
    if reason == "time":
        return DocumentError(f"{name}: parsing it took longer than {caps.seconds:g} s, so it "
                             "was stopped (recursa.documents.limits.PARSE_SECONDS, env "
                             "RECURSA_PARSE_SECONDS)")
    if status is not None:
        kind, message = str(status.get("type") or ""), str(status.get("message") or "")
        if kind == "MemoryError":
            return DocumentError(f"{name}: parsing it needed more than its "
                                 f"{caps.memory_mb:,} MB of memory (recursa.documents.limits."
                                 "PARSE_MEMORY_MB, env RECURSA_PARSE_MEMORY_MB)")
        if kind == "OutputLimit":
            return DocumentError(_over_output(name, caps.output_mb))
        return _ERRORS.get(kind, DocumentError)(message)
    if "MemoryError" in err[-300:]:
        return DocumentError(f"{name}: parsing it needed more than its {caps.memory_mb:,} MB "
                             "of memory (recursa.documents.limits.PARSE_MEMORY_MB, env "
                             "RECURSA_PARSE_MEMORY_MB)")
    if rc < 0 and -rc == signal.SIGXCPU:
        return DocumentError(f"{name}: parsing it took more than {caps.cpu_seconds:,} s of CPU, "
                             "so it was stopped (recursa.documents.limits.PARSE_CPU_SECONDS, "
                             "env RECURSA_PARSE_CPU_SECONDS)")
    if rc < 0 and -rc == signal.SIGXFSZ:
        return DocumentError(_over_output(name, caps.output_mb))
    from recursa.sandbox.transport import describe_exit
    tail = err.splitlines()[-1][:300] if err else ""
    return DocumentError(f"{name}: the document parser failed on it ({describe_exit(rc)}"
                         + (f": {tail}" if tail else "") + "): a corrupt or hostile file?")
