"""The local model runtime: llama.cpp's `llama-server`, prebuilt where it can be, else built here.

Two kinds, chosen by `runtime_kind()`:

- `prebuilt` (Linux x86-64 with an `x86-64-v3` CPU, the common case): llama.cpp's server from the
  pinned `xllamacpp` wheel, fetched and unpacked in seconds (`prebuilt.py`).
- `source` (older x86 CPUs, other architectures and systems, or `RECURSA_RUNTIME=source`): a
  portable `llama-server` compiled here from pinned llama.cpp sources, minutes of CPU once.

Why a build of our own, and not the `llama-cpp-python` wheel: that wheel is built from source
with the build machine's native CPU flags, and pip caches it by the sdist alone, so a wheel built
where AVX-512 or AMX works is reused where the CPU advertises them but the OS or hypervisor does
not enable them, and the model dies with SIGILL. Here the sources are the llama.cpp tree vendored
in the pinned `llama-cpp-python` sdist (fetched over HTTP from the package index and SHA-256
checked before anything reads it: `runtime_fetch.py`; it is never built or imported as a
package); they are compiled once per user into the recursa cache with an explicit instruction-set
profile and no `-march=native`, and the result is keyed by source hash and profile, so no cache
can hand a binary built for another CPU to this one.

Profiles (x86-64): `x86-64-v3` (Haswell and later: AVX2, FMA, F16C, BMI2; the default where the
CPU has those), `x86-64-v2` (SSE4.2 only). AVX-512 and AMX are never used (neither does the
prebuilt wheel): llama.cpp's run-time CPU check reads CPUID only, not whether the OS enabled the
registers, so a binary with them is not safe to hand out. Other architectures build llama.cpp's
portable default.

The model runs in that server process, outside the host (see `llama_server.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import prebuilt
from .fetch import file_lock
from .runtime_fetch import ENV_INDEX, INDEX_URL, Pinned, RuntimeError_, download, verify

__all__ = ["ENV_INDEX", "INDEX_URL", "RuntimeError_"]

log = logging.getLogger("recursa.models")

# llama.cpp as vendored in llama-cpp-python 0.3.36 (ggml 0.25.3)
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_SIZE = 76_589_250
SDIST = Pinned(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SIZE, SDIST_SHA256,
               what="the llama.cpp sources")
VENDOR_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

BINARY = "llama-server"
ENV_BINARY = "RECURSA_LLAMA_SERVER"     # use this binary instead (a CUDA build, a distro package)
ENV_DIR = "RECURSA_RUNTIME_DIR"
ENV_PROFILE = "RECURSA_CPU_PROFILE"
ENV_KIND = "RECURSA_RUNTIME"            # prebuilt | source: which llama-server to use
KINDS = ("prebuilt", "source")

_COMMON = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=OFF", "-DGGML_CPU_ALL_VARIANTS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
    # no web UI download, no TLS: the server only listens on loopback for recursa
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
]
_NO_WIDE = ["-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF",
            "-DGGML_AVX512_BF16=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
            "-DGGML_AMX_BF16=OFF", "-DGGML_AVX_VNNI=OFF"]
PROFILES: dict[str, list[str]] = {
    "x86-64-v3": ["-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
                  "-DGGML_F16C=ON", "-DGGML_BMI2=ON", *_NO_WIDE],
    "x86-64-v2": ["-DGGML_SSE42=ON", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF",
                  "-DGGML_F16C=OFF", "-DGGML_BMI2=OFF", *_NO_WIDE],
    "generic": [],     # not x86: llama.cpp's own portable defaults (GGML_NATIVE=OFF)
}
_V3_FLAGS = {"avx", "avx2", "fma", "f16c", "bmi2"}

ProgressFn = Callable[[str], None]


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def default_profile() -> str:
    env = os.environ.get(ENV_PROFILE)
    if env:
        if env not in PROFILES:
            raise RuntimeError_(f"{ENV_PROFILE}={env!r}: known profiles are "
                                f"{', '.join(PROFILES)}")
        return env
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "generic"
    return "x86-64-v3" if _V3_FLAGS <= cpu_flags() else "x86-64-v2"


def runtime_root() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "recursa" / "runtime"


def runtime_kind(profile: str | None = None, kind: str | None = None) -> str:
    """`prebuilt` where the prebuilt server runs (Linux x86-64, profile x86-64-v3), else
    `source`; `kind` (or $RECURSA_RUNTIME) asks for one."""
    profile = profile or default_profile()
    if profile not in PROFILES:
        raise RuntimeError_(f"unknown CPU profile {profile!r}; known: {', '.join(PROFILES)}")
    want = (kind or os.environ.get(ENV_KIND) or "").strip().lower()
    if want and want not in KINDS:
        raise RuntimeError_(f"{ENV_KIND}={want!r}: the runtimes are {', '.join(KINDS)}")
    why = prebuilt.unsupported(profile)
    if want == "prebuilt" and why:
        raise RuntimeError_(f"the prebuilt llama.cpp server cannot run here: {why}")
    return "source" if want == "source" or why else "prebuilt"


def build_dir_name(profile: str) -> str:
    key = hashlib.sha256(json.dumps([SDIST_SHA256, _COMMON, PROFILES[profile]]).encode())
    return f"llama.cpp-{SDIST_VERSION}-{profile}-{key.hexdigest()[:10]}"


def binary_path(profile: str | None = None, kind: str | None = None) -> Path:
    """The server to start for `profile` once it is there (whether or not it is): the source
    build's binary, or this Python's launcher of the prebuilt one."""
    profile = profile or default_profile()
    if runtime_kind(profile, kind) == "prebuilt":
        return prebuilt.launcher_path(runtime_root())
    return runtime_root() / build_dir_name(profile) / BINARY


def _info_path(binary: Path) -> Path:
    return binary.with_name("build.json")


def is_built(profile: str | None = None, kind: str | None = None) -> bool:
    profile = profile or default_profile()
    if runtime_kind(profile, kind) == "prebuilt":
        return prebuilt.is_installed(runtime_root())
    b = binary_path(profile, "source")
    return b.is_file() and _info_path(b).is_file()


def find_server(*, build: bool = True, progress: ProgressFn | None = None) -> Path:
    """The llama-server to run: $RECURSA_LLAMA_SERVER, else the prebuilt one where it runs,
    else our portable build (fetched or built now, once, when `build` is true)."""
    env = os.environ.get(ENV_BINARY)
    if env:
        p = Path(env).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise RuntimeError_(f"{ENV_BINARY}={env}: not an executable file")
        return p
    if is_built():
        return prebuilt.launcher(runtime_root()) if runtime_kind() == "prebuilt" \
            else binary_path()
    if not build:
        raise RuntimeError_(f"the local runtime is not there yet ({binary_path()}): run "
                            "`recursa runtime build` (make demo / make test do this)")
    return prepare(progress=progress)


def prepare(profile: str | None = None, *, kind: str | None = None, force: bool = False,
            sdist: str | os.PathLike[str] | None = None,
            wheel: str | os.PathLike[str] | None = None,
            progress: ProgressFn | None = None) -> Path:
    """Make the runtime of `kind` (see runtime_kind) ready: fetch the prebuilt server, or build
    one from source (`sdist`: a local copy of the sources). Returns what to run."""
    profile = profile or default_profile()
    if sdist:
        kind = "source"
    if runtime_kind(profile, kind) == "prebuilt":
        return prebuilt.install(runtime_root(), wheel=wheel, force=force, progress=progress)
    if wheel:
        raise RuntimeError_("--wheel is the prebuilt server's; this runtime is built from source")
    return build_server(profile, force=force, sdist=sdist, progress=progress)


def _tool(name: str) -> str | None:
    """A build tool from PATH or from this interpreter's environment (the `cmake` and `ninja`
    PyPI packages of the `local` extra install their binaries there)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)


def _download_sdist(dest: Path, say: ProgressFn) -> Path:
    """Fetch the pinned sdist into `dest` and check it. Only bytes move: nothing in the tarball
    runs or is read before its SHA-256 matched (pip would run its build backend first)."""
    return download(SDIST, dest, say,
                    local_copy_hint="pass a local copy with `recursa runtime build --sdist PATH`")


def _verify_sdist(tarball: Path) -> None:
    """Refuse any tarball but the pinned one, before anything reads or extracts it."""
    verify(SDIST, tarball)


def _extract_vendor(tarball: Path, dest: Path) -> Path:
    with tarfile.open(tarball) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(VENDOR_PREFIX)]
        tf.extractall(dest, members=members, filter="data")
    return dest / VENDOR_PREFIX


def cmake_args(profile: str) -> list[str]:
    return [*_COMMON, *PROFILES[profile]]


def build_server(profile: str | None = None, *, force: bool = False,
                 sdist: str | os.PathLike[str] | None = None,
                 progress: ProgressFn | None = None) -> Path:
    """Build `llama-server` for `profile` into the runtime cache (once; a file lock makes
    concurrent callers wait) and return its path."""
    profile = profile or default_profile()
    if profile not in PROFILES:
        raise RuntimeError_(f"unknown CPU profile {profile!r}; known: {', '.join(PROFILES)}")
    out = binary_path(profile, "source")

    def say(msg: str) -> None:
        log.info("runtime: %s", msg)
        if progress:
            progress(msg)

    out.parent.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent):
        if not force and is_built(profile, "source"):
            return out
        cmake, ninja = _tool("cmake"), _tool("ninja")
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if not cmake or not cxx:
            raise RuntimeError_("building the local runtime needs cmake and a C++ compiler: "
                                "pip install 'recursa[local]' brings cmake; install a compiler "
                                "with `apt-get install build-essential` (or set "
                                f"{ENV_BINARY} to a llama-server you have)")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="recursa-build-") as tmp:
            t = Path(tmp)
            if sdist:
                tarball = Path(sdist)
                _verify_sdist(tarball)
            else:
                tarball = _download_sdist(t, say)
            src = _extract_vendor(tarball, t / "src")
            build = t / "build"
            gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []
            jobs = str(len(os.sched_getaffinity(0)))
            say(f"building {BINARY} for CPU profile {profile} ({jobs} jobs; a few minutes)")
            for cmd in ([cmake, "-S", str(src), "-B", str(build), *gen, *cmake_args(profile)],
                        [cmake, "--build", str(build), "--target", BINARY, "-j", jobs]):
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    tail = (proc.stdout + proc.stderr).strip()[-2000:]
                    raise RuntimeError_(f"building {BINARY} failed ({' '.join(cmd[:3])} ...): "
                                        f"{tail}")
            built = build / "bin" / BINARY
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp_out = out.with_name(BINARY + ".tmp")
            shutil.copy2(built, tmp_out)
            check = subprocess.run([str(tmp_out), "--version"], capture_output=True, text=True,
                                   timeout=60)
            if check.returncode != 0:
                raise RuntimeError_(f"the built {BINARY} does not run (exit {check.returncode}):"
                                    f" {check.stderr.strip()[-500:]}")
            os.replace(tmp_out, out)
        info = {"kind": "source", "profile": profile, "cmake_args": cmake_args(profile),
                "source": f"{SDIST_NAME}=={SDIST_VERSION} vendor/llama.cpp",
                "source_sha256": SDIST_SHA256, "built_s": round(time.monotonic() - t0, 1),
                "version": (check.stdout + check.stderr).strip().splitlines()[:2],
                "machine": platform.machine()}
        _info_path(out).write_text(json.dumps(info, indent=1))
        say(f"built {out} in {info['built_s']:.0f} s")
        return out


def build_info(profile: str | None = None, kind: str | None = None
               ) -> dict[str, object] | None:
    """What build.json says of the runtime: its kind, source and hash, the time it took."""
    profile = profile or default_profile()
    if runtime_kind(profile, kind) == "prebuilt":
        return prebuilt.build_info(runtime_root())
    try:
        info = json.loads(_info_path(binary_path(profile, "source")).read_text())
    except (OSError, ValueError):
        return None
    return {"kind": "source", **info}     # builds from before the prebuilt one say no kind
