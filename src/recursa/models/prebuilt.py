"""The prebuilt runtime: llama.cpp's server from the pinned `xllamacpp` wheel, in seconds.

The wheel holds llama.cpp (its HTTP server included) statically linked into one Python
extension, built for a fixed CPU level: AVX, AVX2, FMA, F16C, BMI2 (the `x86-64-v3` profile), no
AVX-512, no AMX, so it runs on the CPUs the source build's `x86-64-v3` profile serves and dies
with SIGILL on older ones: it is used only where that is the profile, on Linux x86-64 with glibc
(manylinux2014: 2.17 or later). It needs the system's libgomp.so.1 and libstdc++.

It is fetched like the sources (`runtime_fetch.py`: HTTP from the index, SHA-256 checked before
anything reads it) and unpacked into `<runtime dir>/xllamacpp-<version>-.../lib`; pip never
installs it and the host never imports it: the model runs in a server process of its own
(`prebuilt_server.py`, which takes llama-server's options). What recursa starts as its
`llama-server` is a small shell launcher beside it that runs that script with this Python; a
launcher per interpreter, so two virtualenvs sharing the runtime directory each run their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from .fetch import file_lock
from .runtime_fetch import Pinned, ProgressFn, RuntimeError_, download, verify

WHEEL = Pinned(
    project="xllamacpp", version="2026.10.11549",
    filename="xllamacpp-2026.10.11549-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    size=33_827_498,
    sha256="c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261",
    what="llama.cpp's prebuilt server")
PACKAGE = "xllamacpp/"          # the only part of the wheel we unpack
LIBRARY = "xllamacpp/xllamacpp.abi3.so"
PROFILE = "x86-64-v3"           # the instruction set the wheel's code was compiled for
MIN_GLIBC = (2, 17)
SHIM = Path(__file__).with_name("prebuilt_server.py")

log = logging.getLogger("recursa.models")


def unsupported(profile: str) -> str | None:
    """Why the prebuilt server cannot run here, or None when it can."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"it is built for Linux on x86-64 (this is {sys.platform} {platform.machine()})"
    if profile != PROFILE:
        return f"it needs an {PROFILE} CPU (AVX2, FMA, F16C, BMI2); the profile here is {profile}"
    libc, version = platform.libc_ver()
    try:
        have = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        have = ()
    if libc != "glibc" or have < MIN_GLIBC:
        return f"it needs glibc 2.17 or later (this is {libc or 'another C library'} {version})"
    return None


def install_dir(root: Path) -> Path:
    return root / f"xllamacpp-{WHEEL.version}-{PROFILE}-{WHEEL.sha256[:10]}"


def lib_dir(root: Path) -> Path:
    return install_dir(root) / "lib"


def info_path(root: Path) -> Path:
    return install_dir(root) / "build.json"


def is_installed(root: Path) -> bool:
    return (lib_dir(root) / LIBRARY).is_file() and info_path(root).is_file()


def command(root: Path) -> list[str]:
    """How to run the prebuilt server with this Python (llama-server's options follow). `-I`:
    no user site, no environment variables, and not the script's own directory on sys.path;
    `-S`: no site-packages either, whose .pth files would run in the server."""
    if not sys.executable:
        raise RuntimeError_("cannot find this Python's executable to run the prebuilt server")
    return [sys.executable, "-I", "-S", str(SHIM), str(lib_dir(root))]


def _launcher_text(root: Path) -> str:
    return ("#!/bin/sh\n# llama.cpp's server from the prebuilt xllamacpp wheel, run by the Python"
            " below (written by recursa)\n" f"exec {shlex.join(command(root))} \"$@\"\n")


def launcher_path(root: Path) -> Path:
    key = hashlib.sha256(_launcher_text(root).encode()).hexdigest()[:10]
    return install_dir(root) / "bin" / f"llama-server-{key}"


def launcher(root: Path) -> Path:
    """This interpreter's launcher, written when missing (its name is its content's hash)."""
    path = launcher_path(root)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(_launcher_text(root))
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return path


def _extract(wheel: Path, dest: Path) -> None:
    """The package directory only (not the .dist-info: nothing may find it as installed)."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith(PACKAGE) and not m.endswith("/")]
        if LIBRARY not in members:
            raise RuntimeError_(f"{wheel} holds no {LIBRARY}")
        for m in members:
            zf.extract(m, dest)     # zipfile drops absolute paths and '..' from member names


def install(root: Path, *, wheel: str | os.PathLike[str] | None = None, force: bool = False,
            progress: ProgressFn | None = None) -> Path:
    """Fetch, check and unpack the pinned wheel into `root` (once; a file lock makes concurrent
    callers wait), prove it loads, and return this interpreter's launcher."""
    def say(msg: str) -> None:
        log.info("runtime: %s", msg)
        if progress:
            progress(msg)

    d = install_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(d):
        if not force and is_installed(root):
            return launcher(root)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".recursa-prebuilt-", dir=root) as tmp:
            t = Path(tmp)
            if wheel:
                got = Path(wheel)
                verify(WHEEL, got)
            else:
                got = download(WHEEL, t, say, local_copy_hint="pass a local copy with "
                               "`recursa runtime build --wheel PATH`")
            _extract(got, t / "lib")
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            os.replace(t / "lib", lib_dir(root))
        exe = launcher(root)
        check = subprocess.run([str(exe), "--version"], capture_output=True, text=True,
                               timeout=120)
        if check.returncode != 0:
            err = check.stderr.strip()[-800:]
            hint = (" Install the OpenMP runtime (`apt-get install libgomp1`)."
                    if "libgomp" in err else "")
            raise RuntimeError_(f"the prebuilt llama.cpp server does not load (exit "
                                f"{check.returncode}): {err}{hint} RECURSA_RUNTIME=source "
                                "builds llama.cpp from source instead.")
        info = {"kind": "prebuilt", "profile": PROFILE,
                "source": f"{WHEEL.project}=={WHEEL.version} wheel", "file": WHEEL.filename,
                "source_sha256": WHEEL.sha256, "fetched_s": round(time.monotonic() - t0, 1),
                "version": check.stdout.strip().splitlines()[:1],
                "machine": platform.machine()}
        info_path(root).write_text(json.dumps(info, indent=1))
        say(f"prebuilt llama.cpp server ready in {info['fetched_s']:.0f} s: {lib_dir(root)}")
        return exe


def build_info(root: Path) -> dict[str, object] | None:
    try:
        return json.loads(info_path(root).read_text())
    except (OSError, ValueError):
        return None
