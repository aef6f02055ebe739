"""The local runtime: a portable llama-server build, proven on an emulated CPU without AVX-512/AMX.

`test_runs_on_a_cpu_without_avx512_or_amx` runs the very binary recursa uses under qemu-user with
`-cpu Haswell` (AVX2, FMA, F16C; no AVX-512, no AMX), loads a real model and generates two
tokens. A control program with one AVX-512 instruction must die there with SIGILL, so the test
would catch a build that uses instructions the user's CPU or OS lacks, whatever CPU runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
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
