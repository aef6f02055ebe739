"""The local runtime: a portable llama-server build, proven on an emulated CPU without AVX-512/AMX.

`test_runs_on_a_cpu_without_avx512_or_amx` runs the very binary recursa uses under qemu-user with
`-cpu Haswell` (AVX2, FMA, F16C; no AVX-512, no AMX), loads a real model and generates two
tokens. A control program with one AVX-512 instruction must die there with SIGILL, so the test
would catch a build that uses instructions the user's CPU or OS lacks, whatever CPU runs it.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from recursa.models import runtime
from recursa.models.fetch import fetch_model


# ------------------------------------------------------------------ fast
def test_no_profile_uses_native_flags_avx512_or_amx():
    for name in runtime.PROFILES:
        args = runtime.cmake_args(name)
        assert "-DGGML_NATIVE=OFF" in args
        on = {a for a in args if a.endswith("=ON")}
        assert not any(("AVX512" in a or "AMX" in a) for a in on), (name, on)
        assert not any("native" in a.lower() for a in args if "GGML_NATIVE" not in a)


def test_profile_follows_the_cpu_and_keys_the_cache(monkeypatch):
    monkeypatch.delenv(runtime.ENV_PROFILE, raising=False)
    monkeypatch.setattr(runtime.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(runtime, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma", "f16c",
                                                       "bmi2", "avx512f", "amx_tile"})
    assert runtime.default_profile() == "x86-64-v3"
    monkeypatch.setattr(runtime, "cpu_flags", lambda: {"sse4_2", "avx"})
    assert runtime.default_profile() == "x86-64-v2"
    monkeypatch.setattr(runtime.platform, "machine", lambda: "aarch64")
    assert runtime.default_profile() == "generic"
    names = {runtime.build_dir_name(p) for p in runtime.PROFILES}
    assert len(names) == len(runtime.PROFILES)        # a build for one profile is never reused


def test_bad_profile_and_bad_binary_are_clear_errors(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.ENV_PROFILE, "pentium")
    with pytest.raises(runtime.RuntimeError_, match="known profiles"):
        runtime.default_profile()
    monkeypatch.delenv(runtime.ENV_PROFILE)
    monkeypatch.setenv(runtime.ENV_BINARY, str(tmp_path / "nope"))
    with pytest.raises(runtime.RuntimeError_, match="not an executable"):
        runtime.find_server()
    monkeypatch.delenv(runtime.ENV_BINARY)
    monkeypatch.setenv(runtime.ENV_DIR, str(tmp_path / "empty"))
    with pytest.raises(runtime.RuntimeError_, match="recursa runtime build"):
        runtime.find_server(build=False)


# ------------------------------------------------------------------ the sources
def _tampered_sdist(marker: Path) -> bytes:
    """A tarball named like the pinned sdist whose every way to run code leaves `marker`: the
    in-tree build backend that `pip download` would run, and the vendored CMakeLists.txt."""
    top = "llama_cpp_python-0.3.36/"
    files = {
        "PKG-INFO": "Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                          'backend-path = ["."]\n',
        "backend.py": f"open({str(marker)!r}, 'w').write('the build backend ran')\n",
        "vendor/llama.cpp/CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\n"
                                           "project(tampered NONE)\n"
                                           f'file(WRITE "{marker}" "cmake ran")\n',
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(top + name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _Index(http.server.BaseHTTPRequestHandler):
    """A package index with the simple API (JSON or HTML page) serving one tarball."""
    tarball = b""
    json_page = True
    served: list[str] = []

    def do_GET(self) -> None:
        type(self).served.append(self.path)
        if self.path == f"/simple/{runtime.SDIST_NAME}/":
            files = [{"filename": runtime.SDIST_FILE, "url": f"/files/{runtime.SDIST_FILE}",
                      "hashes": {}}]
            if self.json_page:
                body, ctype = json.dumps({"files": files}).encode(), \
                    "application/vnd.pypi.simple.v1+json"
            else:
                body = (f'<a href="../../files/{runtime.SDIST_FILE}#sha256=00">'
                        f"{runtime.SDIST_FILE}</a>").encode()
                ctype = "text/html"
        elif self.path == f"/files/{runtime.SDIST_FILE}":
            body, ctype = self.tarball, "application/gzip"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("source", ["index-json", "index-html", "local-copy"])
def test_a_tampered_sdist_is_refused_before_anything_in_it_runs(source, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    tarball = _tampered_sdist(marker)
    monkeypatch.setenv(runtime.ENV_DIR, str(tmp_path / "runtime"))
    monkeypatch.setenv("CXX", shutil.which("true") or "/bin/true")  # no compiler is reached
    kw: dict[str, object] = {}
    server = None
    if source == "local-copy":
        kw["sdist"] = tmp_path / runtime.SDIST_FILE
        kw["sdist"].write_bytes(tarball)
    else:
        handler = type("Index", (_Index,), {"tarball": tarball, "served": [],
                                            "json_page": source == "index-json"})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setenv(runtime.ENV_INDEX, f"http://127.0.0.1:{server.server_port}/simple")
    try:
        with pytest.raises(runtime.RuntimeError_, match="does not match the pinned"):
            runtime.build_server("x86-64-v2", **kw)  # type: ignore[arg-type]
    finally:
        if server:
            server.shutdown()
            server.server_close()
    assert not marker.exists(), marker.read_text()
    assert not runtime.is_built("x86-64-v2")
    if server:   # the refusal came from the served bytes, fetched whole
        assert handler.served == [f"/simple/{runtime.SDIST_NAME}/",
                                  f"/files/{runtime.SDIST_FILE}"]


@pytest.mark.slow
def test_the_pinned_sdist_downloads_from_pypi_and_matches(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.ENV_INDEX, raising=False)
    said: list[str] = []
    got = runtime._download_sdist(tmp_path, said.append)
    assert got.stat().st_size == runtime.SDIST_SIZE
    assert "pypi.org" in said[0]


# ------------------------------------------------------------------ emulated CPU
def _qemu() -> str:
    q = shutil.which("qemu-x86_64")
    if q is None:
        if os.geteuid() == 0:
            pytest.fail("qemu-user is missing; `make test` installs it (apt-get install qemu-user)")
        pytest.skip("needs qemu-user (sudo apt-get install qemu-user)")
    return q


def _haswell(qemu: str, *argv: str, **kw):
    return subprocess.Popen([qemu, "-cpu", "Haswell", *argv], **kw)


@pytest.mark.slow
def test_the_emulated_cpu_really_lacks_avx512(tmp_path):
    """The control: an AVX-512 instruction dies with SIGILL under the emulator."""
    qemu = _qemu()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    src = tmp_path / "avx512.c"
    src.write_text('int main(void){__asm__ volatile("vpxord %zmm0,%zmm0,%zmm0");return 0;}\n')
    exe = tmp_path / "avx512"
    subprocess.run([cc, str(src), "-o", str(exe)], check=True)
    p = _haswell(qemu, str(exe), stderr=subprocess.DEVNULL)
    assert p.wait(60) == -signal.SIGILL


@pytest.mark.slow
@pytest.mark.model
def test_runs_on_a_cpu_without_avx512_or_amx(tmp_path):
    qemu = _qemu()
    binary = runtime.find_server()
    model = fetch_model("smollm2-135m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "wb")
    proc = _haswell(qemu, str(binary), "-m", str(model), "--host", "127.0.0.1", "--port",
                    str(port), "-c", "512", "-np", "1", "-t", "2", "--no-warmup", "--no-webui",
                    stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            rc = proc.poll()
            assert rc is None, (f"llama-server died on the emulated Haswell CPU with {rc} "
                                f"(-4 is SIGILL): {(tmp_path / 'server.log').read_text()[-1500:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "no health after 300 s under emulation"
                time.sleep(0.5)
        req = urllib.request.Request(base + "/v1/chat/completions", headers={
            "Content-Type": "application/json"}, data=json.dumps({
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode())
        with urllib.request.urlopen(req, timeout=600) as r:
            body = json.loads(r.read())
        assert body["usage"]["completion_tokens"] >= 1
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        log.close()


def test_build_info_is_recorded_when_built():
    if not runtime.is_built():
        pytest.skip("runtime not built here")
    info = runtime.build_info()
    assert info and info["profile"] == runtime.default_profile()
    assert info["source_sha256"] == runtime.SDIST_SHA256
    assert Path(runtime.binary_path()).is_file()
