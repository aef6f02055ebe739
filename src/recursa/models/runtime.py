"""The local model runtime: a portable `llama-server` built from pinned llama.cpp sources.

Why a build of our own, and not the `llama-cpp-python` wheel: that wheel is built from source
with the build machine's native CPU flags, and pip caches it by the sdist alone, so a wheel built
where AVX-512 or AMX works is reused where the CPU advertises them but the OS or hypervisor does
not enable them, and the model dies with SIGILL. Here the sources are the llama.cpp tree vendored
in the pinned `llama-cpp-python` sdist (fetched over HTTP from the package index and SHA-256
checked before anything reads it; pip never handles it, since `pip download` of an sdist runs
its build backend, and it is never built or imported as a package); they are compiled once per
user into the recursa cache with an explicit instruction-set profile and no `-march=native`, and
the result is keyed by source hash and profile, so no cache can hand a binary built for another
CPU to this one.

Profiles (x86-64): `x86-64-v3` (Haswell and later: AVX2, FMA, F16C, BMI2; the default where the
CPU has those), `x86-64-v2` (SSE4.2 only). AVX-512 and AMX are never used: llama.cpp's run-time
CPU check reads CPUID only, not whether the OS enabled the registers, so a binary with them is
not safe to hand out. Other architectures build llama.cpp's portable default.

The model runs in that server process, outside the host (see `llama_server.py`).
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urljoin

from recursa.base.types import RecursaError

from ._http import httpx
from .fetch import file_lock, sha256_file

log = logging.getLogger("recursa.models")

# llama.cpp as vendored in llama-cpp-python 0.3.36 (ggml 0.25.3)
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_SIZE = 76_589_250
INDEX_URL = "https://pypi.org/simple"   # PEP 503/691 simple API; $PIP_INDEX_URL for a mirror
ENV_INDEX = "PIP_INDEX_URL"
VENDOR_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

BINARY = "llama-server"
ENV_BINARY = "RECURSA_LLAMA_SERVER"     # use this binary instead (a CUDA build, a distro package)
ENV_DIR = "RECURSA_RUNTIME_DIR"
ENV_PROFILE = "RECURSA_CPU_PROFILE"

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


class RuntimeError_(RecursaError):
    """The local runtime could not be built, found or started."""


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


def build_dir_name(profile: str) -> str:
    key = hashlib.sha256(json.dumps([SDIST_SHA256, _COMMON, PROFILES[profile]]).encode())
    return f"llama.cpp-{SDIST_VERSION}-{profile}-{key.hexdigest()[:10]}"


def binary_path(profile: str | None = None) -> Path:
    """Where the server binary for `profile` lives once built (whether or not it is there)."""
    return runtime_root() / build_dir_name(profile or default_profile()) / BINARY


def _info_path(binary: Path) -> Path:
    return binary.with_name("build.json")


def is_built(profile: str | None = None) -> bool:
    b = binary_path(profile)
    return b.is_file() and _info_path(b).is_file()


def find_server(*, build: bool = True, progress: ProgressFn | None = None) -> Path:
    """The llama-server binary to run: $RECURSA_LLAMA_SERVER, else our portable build (built
    now, once, when `build` is true)."""
    env = os.environ.get(ENV_BINARY)
    if env:
        p = Path(env).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise RuntimeError_(f"{ENV_BINARY}={env}: not an executable file")
        return p
    b = binary_path()
    if is_built():
        return b
    if not build:
        raise RuntimeError_(f"the local runtime is not built yet ({b}): run "
                            "`recursa runtime build` (make demo / make test do this)")
    return build_server(progress=progress)


def _tool(name: str) -> str | None:
    """A build tool from PATH or from this interpreter's environment (the `cmake` and `ninja`
    PyPI packages of the `local` extra install their binaries there)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)


def _sdist_url(client: httpx.Client, index: str) -> str:
    """The pinned sdist's download URL, from the index's simple API page for the project (its
    JSON form where the index has one, else the HTML one)."""
    page = f"{index.rstrip('/')}/{SDIST_NAME}/"
    r = client.get(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, "
                                            "text/html;q=0.1"})
    r.raise_for_status()
    if "json" in r.headers.get("content-type", ""):
        links = [str(f.get("url", "")) for f in r.json().get("files", [])
                 if f.get("filename") == SDIST_FILE]
    else:
        links = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', r.text)]
    for link in links:
        url = urljoin(str(r.url), link.split("#", 1)[0])
        if url.rsplit("/", 1)[-1] == SDIST_FILE:
            return url
    raise RuntimeError_(f"{page} lists no {SDIST_FILE}")


def _download_sdist(dest: Path, say: ProgressFn) -> Path:
    """Fetch the pinned sdist into `dest` and check it. Only bytes move: nothing in the tarball
    runs or is read before its SHA-256 matched (pip would run its build backend first)."""
    from .tls import shared_ssl_context
    index = os.environ.get(ENV_INDEX) or INDEX_URL
    say(f"downloading the llama.cpp sources ({SDIST_NAME}=={SDIST_VERSION} sdist, "
        f"{SDIST_SIZE / 1e6:.0f} MB) from {index}")
    got = dest / SDIST_FILE
    try:
        with httpx.Client(verify=shared_ssl_context(), follow_redirects=True,
                          timeout=httpx.Timeout(60.0)) as client:
            url = _sdist_url(client, index)
            with client.stream("GET", url) as r, open(got, "wb") as f:
                r.raise_for_status()
                n = 0
                for block in r.iter_bytes(1 << 20):
                    n += len(block)
                    if n > SDIST_SIZE:    # not the pinned file: no need to take more of it
                        break
                    f.write(block)
    except httpx.HTTPError as e:
        got.unlink(missing_ok=True)
        raise RuntimeError_(f"downloading {SDIST_FILE} from {index} failed: {e} (set "
                            f"{ENV_INDEX} to a mirror, or pass a local copy with "
                            "`recursa runtime build --sdist PATH`)") from None
    _verify_sdist(got)
    return got


def _verify_sdist(tarball: Path) -> None:
    """Refuse any tarball but the pinned one, before anything reads or extracts it."""
    digest = sha256_file(tarball) if tarball.is_file() else "(no such file)"
    if digest != SDIST_SHA256:
        raise RuntimeError_(f"{tarball}: sha256 {digest} does not match the pinned "
                            f"{SDIST_FILE} ({SDIST_SHA256}); refusing to build it")


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
    out = binary_path(profile)

    def say(msg: str) -> None:
        log.info("runtime: %s", msg)
        if progress:
            progress(msg)

    out.parent.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent):
        if not force and is_built(profile):
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
        info = {"profile": profile, "cmake_args": cmake_args(profile),
                "source": f"{SDIST_NAME}=={SDIST_VERSION} vendor/llama.cpp",
                "source_sha256": SDIST_SHA256, "built_s": round(time.monotonic() - t0, 1),
                "version": (check.stdout + check.stderr).strip().splitlines()[:2],
                "machine": platform.machine()}
        _info_path(out).write_text(json.dumps(info, indent=1))
        say(f"built {out} in {info['built_s']:.0f} s")
        return out


def build_info(profile: str | None = None) -> dict[str, object] | None:
    p = _info_path(binary_path(profile))
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
