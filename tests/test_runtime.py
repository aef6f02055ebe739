"""The local runtime: the prebuilt llama.cpp server or a portable build of our own, proven on an
emulated CPU without AVX-512/AMX.

`test_runs_on_a_cpu_without_avx512_or_amx` runs the server recursa uses (the prebuilt one where
it runs, and the source build when it is there) under qemu-user with `-cpu Haswell` (AVX2, FMA,
F16C; no AVX-512, no AMX), loads a real model and generates two tokens. A control program with
one AVX-512 instruction must die there with SIGILL, so the test would catch code that uses
instructions the user's CPU or OS lacks, whatever CPU runs it.
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
import zipfile
from pathlib import Path

import pytest

from recursa.base.types import ModelError
from recursa.models import llama_server, prebuilt, prebuilt_server, runtime
from recursa.models.fetch import fetch_model
from recursa.models.local import LocalClient


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


def _cpu(monkeypatch, machine: str, flags: set[str]) -> None:
    monkeypatch.delenv(runtime.ENV_PROFILE, raising=False)
    monkeypatch.delenv(runtime.ENV_KIND, raising=False)
    monkeypatch.setattr(runtime.platform, "machine", lambda: machine)
    monkeypatch.setattr(prebuilt.platform, "machine", lambda: machine)
    monkeypatch.setattr(runtime, "cpu_flags", lambda: flags)


def test_the_prebuilt_server_is_used_only_where_it_runs(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(prebuilt.sys, "platform", "linux")
    monkeypatch.setattr(prebuilt.platform, "libc_ver", lambda: ("glibc", "2.36"))
    _cpu(monkeypatch, "x86_64", {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
    assert runtime.runtime_kind() == "prebuilt"
    assert runtime.binary_path() == prebuilt.launcher_path(tmp_path)
    monkeypatch.setenv(runtime.ENV_KIND, "source")        # asked for the source build
    assert runtime.runtime_kind() == "source"
    assert runtime.binary_path().parent.name == runtime.build_dir_name("x86-64-v3")
    assert runtime.runtime_kind(kind="prebuilt") == "prebuilt"
    monkeypatch.setenv(runtime.ENV_KIND, "binary")
    with pytest.raises(runtime.RuntimeError_, match="prebuilt, source"):
        runtime.runtime_kind()
    # an x86-64-v2 CPU (the wheel dies there with SIGILL), other CPUs, old or other C libraries
    _cpu(monkeypatch, "x86_64", {"sse4_2", "avx"})
    assert runtime.runtime_kind() == "source"
    with pytest.raises(runtime.RuntimeError_, match="needs an x86-64-v3 CPU"):
        runtime.runtime_kind(kind="prebuilt")
    _cpu(monkeypatch, "aarch64", set())
    assert runtime.runtime_kind() == "source"
    _cpu(monkeypatch, "x86_64", {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
    monkeypatch.setattr(prebuilt.platform, "libc_ver", lambda: ("", ""))       # musl
    assert runtime.runtime_kind() == "source"
    monkeypatch.setattr(prebuilt.platform, "libc_ver", lambda: ("glibc", "2.12"))
    assert runtime.runtime_kind() == "source"


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
    """A package index with the simple API (JSON or HTML page) serving one file of one
    project."""
    project = ""
    filename = ""
    body = b""
    json_page = True
    served: list[str] = []

    def do_GET(self) -> None:
        type(self).served.append(self.path)
        if self.path == f"/simple/{self.project}/":
            files = [{"filename": self.filename, "url": f"/files/{self.filename}",
                      "hashes": {}}]
            if self.json_page:
                body, ctype = json.dumps({"files": files}).encode(), \
                    "application/vnd.pypi.simple.v1+json"
            else:
                body = (f'<a href="../../files/{self.filename}#sha256=00">'
                        f"{self.filename}</a>").encode()
                ctype = "text/html"
        elif self.path == f"/files/{self.filename}":
            body, ctype = self.body, "application/octet-stream"
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


def _serve_index(monkeypatch, project: str, filename: str, body: bytes, json_page: bool
                 ) -> tuple[http.server.ThreadingHTTPServer, type[_Index]]:
    handler = type("Index", (_Index,), {"project": project, "filename": filename, "body": body,
                                        "served": [], "json_page": json_page})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(runtime.ENV_INDEX, f"http://127.0.0.1:{server.server_port}/simple")
    return server, handler


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
        server, handler = _serve_index(monkeypatch, runtime.SDIST_NAME, runtime.SDIST_FILE,
                                       tarball, source == "index-json")
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


def _tampered_wheel(marker: Path) -> bytes:
    """A zip named like the pinned xllamacpp wheel whose package, if imported, leaves
    `marker`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("xllamacpp/__init__.py", f"open({str(marker)!r}, 'w').write('imported')\n")
        zf.writestr(prebuilt.LIBRARY, b"\x7fELF not really")
    return buf.getvalue()


@pytest.mark.parametrize("source", ["index-json", "index-html", "local-copy"])
def test_a_tampered_wheel_is_refused_before_anything_in_it_runs(source, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    wheel = _tampered_wheel(marker)
    root = tmp_path / "runtime"
    server = None
    kw: dict[str, object] = {}
    if source == "local-copy":
        kw["wheel"] = tmp_path / prebuilt.WHEEL.filename
        kw["wheel"].write_bytes(wheel)
    else:
        server, handler = _serve_index(monkeypatch, prebuilt.WHEEL.project,
                                       prebuilt.WHEEL.filename, wheel, source == "index-json")
    try:
        with pytest.raises(runtime.RuntimeError_, match="does not match the pinned"):
            prebuilt.install(root, **kw)  # type: ignore[arg-type]
    finally:
        if server:
            server.shutdown()
            server.server_close()
    assert not marker.exists()
    assert not prebuilt.is_installed(root)
    assert not prebuilt.lib_dir(root).exists()          # nothing was unpacked
    assert [p.name for p in root.iterdir()] == [prebuilt.install_dir(root).name + ".lock"]
    if server:
        assert handler.served == [f"/simple/{prebuilt.WHEEL.project}/",
                                  f"/files/{prebuilt.WHEEL.filename}"]


# ------------------------------------------------------------------ the prebuilt server's options
def test_the_prebuilt_server_takes_every_option_recursa_passes():
    cfg = llama_server.ServerConfig(binary="/x/llama-server", model="/m.gguf", n_ctx=4096,
                                    slots=3, threads=2, cache_ram_mib=512,
                                    extra_args=("--mmproj", "/p.gguf", "--ctx-size=20000"))
    argv = cfg.argv("/d/llama.sock")
    settings = prebuilt_server.parse(argv[1:])
    assert dict(settings) == {
        "model.path": "/m.gguf", "hostnames": ["/d/llama.sock"], "n_parallel": 3,
        "kv_unified": True, "kv_unified_per_slot": 4096, "cpuparams.n_threads": 2,
        "cpuparams_batch.n_threads": 2, "cache_ram_mib": 512, "ui": False, "use_jinja": True,
        "warmup": False, "mmproj.path": "/p.gguf", "n_ctx": 20000}
    # every option recursa's own argv holds set something (nothing fell through)
    opts = [a for a in argv[1:] if a.startswith("-")]
    assert len(settings) == len(opts) == 13


class _Params:
    """The fields of xllamacpp.CommonParams that configure() touches, with its defaults."""

    def __init__(self) -> None:
        from types import SimpleNamespace
        self.model = SimpleNamespace(path="")
        self.cpuparams = SimpleNamespace(n_threads=-1)
        self.n_parallel, self.n_ctx, self.kv_unified_per_slot = 1, 0, 0
        self.api_keys: list[str] = []


def test_the_prebuilt_server_sizes_the_shared_pool_like_llama_server():
    p = _Params()
    prebuilt_server.configure(p, prebuilt_server.parse(
        ["-m", "/m.gguf", "-np", "3", "--kv-unified-per-slot", "4096", "-t", "2"]), "tok")
    assert (p.model.path, p.cpuparams.n_threads, p.n_ctx, p.api_keys) == \
        ("/m.gguf", 2, 3 * 4096, ["tok"])
    p = _Params()      # -c wins, as in llama-server
    prebuilt_server.configure(p, prebuilt_server.parse(
        ["-np", "3", "--kv-unified-per-slot", "4096", "-c", "5000"]), None)
    assert (p.n_ctx, p.api_keys) == (5000, [])


@pytest.mark.parametrize("argv, error", [
    (["--flash-attn", "on"], "unsupported option '--flash-attn'"),
    (["-m"], "-m needs a value"),
    (["-np", "three"], "-np 'three': not a valid value"),
    (["--no-webui=1"], "unsupported option '--no-webui=1'"),
])
def test_the_prebuilt_server_refuses_what_it_does_not_support(argv, error):
    with pytest.raises(prebuilt_server.UsageError, match=error) as ei:
        prebuilt_server.parse(argv)
    if "unsupported" in error:
        assert "RECURSA_RUNTIME=source" in str(ei.value)


def test_an_unsupported_option_stops_the_server_with_its_name(tmp_path):
    """Through the real launcher (in a directory whose path has a space) and LlamaServer: the
    server process exits at once, and the error shows the option."""
    root = tmp_path / "run time"
    exe = prebuilt.launcher(root)
    assert exe == prebuilt.launcher_path(root) and os.access(exe, os.X_OK)
    assert prebuilt.launcher(root) == exe                  # one launcher per interpreter
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    srv = llama_server.LlamaServer(llama_server.ServerConfig(
        binary=str(exe), model=str(model), extra_args=("--lora", "x.gguf")))
    with pytest.raises(ModelError, match=r"exit status 2(.|\n)*unsupported option '--lora'"):
        srv.start(timeout=60)


@pytest.mark.slow
def test_the_pinned_sdist_downloads_from_pypi_and_matches(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.ENV_INDEX, raising=False)
    said: list[str] = []
    got = runtime._download_sdist(tmp_path, said.append)
    assert got.stat().st_size == runtime.SDIST_SIZE
    assert "pypi.org" in said[0]


def _prebuilt_here() -> Path:
    """The prebuilt server's launcher, fetched if need be; skips where it does not run."""
    why = prebuilt.unsupported(runtime.default_profile())
    if why:
        pytest.skip(f"no prebuilt server here: {why}")
    return runtime.prepare(kind="prebuilt")


@pytest.mark.slow
def test_the_pinned_wheel_downloads_from_pypi_and_matches(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.ENV_INDEX, raising=False)
    said: list[str] = []
    exe = prebuilt.install(tmp_path, progress=said.append)
    assert "pypi.org" in said[0] and prebuilt.is_installed(tmp_path)
    assert subprocess.run([str(exe), "--version"], capture_output=True, text=True,
                          check=True).stdout.startswith(f"xllamacpp {prebuilt.WHEEL.version}")
    assert not list(tmp_path.glob(".recursa-prebuilt-*"))         # no download left behind


def test_the_prebuilt_library_has_no_avx512_or_amx():
    """The whole library, not only the code one run reaches (the emulated test)."""
    root = runtime.runtime_root()
    objdump = shutil.which("objdump")
    if not prebuilt.is_installed(root) or objdump is None:
        pytest.skip("needs the prebuilt runtime (recursa runtime build) and objdump")
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn",
                          str(prebuilt.lib_dir(root) / prebuilt.LIBRARY)],
                         capture_output=True, text=True, check=True).stdout
    assert "ymm" in out                                   # AVX2 code: the x86-64-v3 profile
    for mnemonic in ("zmm", "tileloadd", "ldtilecfg", "tdpbssd"):
        assert mnemonic not in out, mnemonic


@pytest.mark.model
async def test_the_prebuilt_server_answers_like_llama_server(monkeypatch):
    exe = _prebuilt_here()
    monkeypatch.delenv(runtime.ENV_BINARY, raising=False)
    monkeypatch.delenv(runtime.ENV_KIND, raising=False)
    llama_server.stop_all()
    c = LocalClient(str(fetch_model("smollm2-135m")), n_ctx=1024, slots=2, n_threads=2)
    try:
        srv = await c.load()
        assert srv.config.binary == str(exe)                 # what recursa runs by default
        r = await c.complete([{"role": "user", "content": "Say hi."}], max_tokens=4,
                             temperature=0.0)
        assert r.text.strip() and r.usage.output_tokens >= 1
        status, body = srv.request("GET", "/props")
        props = json.loads(body)
        assert status == 200 and props["total_slots"] == 2
        assert props["default_generation_settings"]["n_ctx"] == 1024
        # the bearer token is checked, as llama-server does
        conn = llama_server._UnixHTTPConnection(srv.socket_path, 10)
        conn.request("GET", "/props")
        assert conn.getresponse().status == 401
        conn.close()
        proc = srv.proc
        assert proc is not None
        srv.stop()                                           # SIGTERM: a clean, prompt exit
        assert proc.returncode == 0
    finally:
        await c.aclose()
        llama_server.stop_all()


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
@pytest.mark.parametrize("kind", ["prebuilt", "source"])
def test_runs_on_a_cpu_without_avx512_or_amx(kind, tmp_path):
    qemu = _qemu()
    if kind == "prebuilt":      # the Python process that loads the library is the server
        _prebuilt_here()
        server = prebuilt.command(runtime.runtime_root())
    elif runtime.is_built(kind="source"):
        server = [str(runtime.binary_path(kind="source"))]
    elif runtime.runtime_kind() == "source":
        server = [str(runtime.find_server())]
    else:
        pytest.skip("the source build is not here (`recursa runtime build --source`); the "
                    "prebuilt server is what runs by default on this machine")
    model = fetch_model("smollm2-135m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "wb")
    proc = _haswell(qemu, *server, "-m", str(model), "--host", "127.0.0.1", "--port",
                    str(port), "-c", "512", "-np", "1", "-t", "2", "--no-warmup", "--no-webui",
                    stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            rc = proc.poll()
            assert rc is None, (f"the {kind} server died on the emulated Haswell CPU with {rc} "
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


@pytest.mark.parametrize("kind", runtime.KINDS)
def test_build_info_is_recorded_when_built(kind):
    try:
        built = runtime.is_built(kind=kind)
    except runtime.RuntimeError_ as e:      # no prebuilt server for this machine
        pytest.skip(str(e))
    if not built:
        pytest.skip(f"the {kind} runtime is not here")
    info = runtime.build_info(kind=kind)
    assert info and info["kind"] == kind and info["profile"] == runtime.default_profile()
    pinned = prebuilt.WHEEL.sha256 if kind == "prebuilt" else runtime.SDIST_SHA256
    assert info["source_sha256"] == pinned
    if kind == "source":
        assert runtime.binary_path(kind=kind).is_file()
