"""LocalClient over recursa's own llama.cpp server process: plumbing, crash isolation, caches.

The `model` tests need the runtime (`recursa runtime build`) and the models (`recursa models
fetch smollm2-135m qwen2.5-coder-1.5b`); `make test` provides both. Plumbing tests use the tiny
SmolLM2-135M and assert what recursa guarantees, never one sample's exact text.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers_procs import tcp_listeners
from recursa import RLM
from recursa.base.types import ModelError
from recursa.models import llama_server, make_client
from recursa.models.fetch import fetch_model
from recursa.models.local import LocalClient
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load

QUESTION = [{"role": "user", "content": "What is 2+3? Reply with just the number."}]


# ------------------------------------------------------------------ fast, no model
async def test_missing_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RECURSA_LLAMA_SERVER", "/bin/true")   # no build needed to see this
    c = make_client(f"local:{tmp_path}/absent.gguf")
    with pytest.raises(ModelError, match="model file not found.*absent.gguf") as ei:
        await c.complete(QUESTION)
    assert not ei.value.retryable


def test_server_argv_is_a_unix_socket_and_keeps_the_token_off_the_command_line():
    cfg = llama_server.ServerConfig(binary="/x/llama-server", model="/m.gguf", n_ctx=4096,
                                    slots=3)
    argv = cfg.argv("/tmp/d/llama.sock")
    assert argv[argv.index("--host") + 1] == "/tmp/d/llama.sock" and "--port" not in argv
    with pytest.raises(ValueError, match=".sock"):
        cfg.argv("/tmp/d/llama")      # llama.cpp would take it for a host name
    assert "--api-key" not in argv
    assert argv[argv.index("-np") + 1] == "3" and "--kv-unified" in argv
    assert argv[argv.index("--kv-unified-per-slot") + 1] == "4096"


def test_signal_names():
    assert llama_server.signal_name(-signal.SIGKILL) == "SIGKILL"
    assert llama_server.signal_name(-signal.SIGILL) == "SIGILL"
    assert llama_server.signal_name(3) == "exit status 3"
    assert "RECURSA_CPU_PROFILE=x86-64-v2" in llama_server._explain(-signal.SIGILL)


# ------------------------------------------------------------------ real server
@pytest.fixture(scope="module")
def smol() -> Path:
    return fetch_model("smollm2-135m")


@pytest.fixture(autouse=True)
def _fresh_servers():
    llama_server.stop_all()      # servers other test modules left running in this process
    yield
    llama_server.stop_all()


@pytest.mark.model
async def test_server_answers_and_is_shared_by_clients(smol):
    c = LocalClient(str(smol), n_ctx=2048)
    r = await c.complete(QUESTION, temperature=0, max_tokens=8)
    assert r.text.strip() and r.cost_usd == 0.0
    assert r.usage.input_tokens > 10 and 1 <= r.usage.output_tokens <= 8
    c2 = LocalClient(str(smol), n_ctx=2048)
    await c2.complete(QUESTION, temperature=0, max_tokens=4)
    assert len(llama_server.running()) == 1          # same config: one process, loaded once
    srv = llama_server.running()[0]
    # the server is a separate process, on a Unix socket in a private directory (no TCP port
    # to race for), and refuses requests without the token
    assert srv.proc.pid != os.getpid()
    assert tcp_listeners(srv.proc.pid) == [] and Path(srv.socket_path).is_socket()
    assert Path(srv.socket_path).parent.stat().st_mode & 0o777 == 0o700
    import httpx
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=srv.socket_path)) as h:
        r = await h.post(srv.base_url + "/v1/chat/completions", json={"messages": QUESTION})
    assert r.status_code == 401
    await c.aclose()
    await c2.aclose()


@pytest.mark.model
async def test_prompt_too_long_is_a_model_error(smol):
    c = LocalClient(str(smol), n_ctx=256, slots=1)
    with pytest.raises(ModelError, match="too long for n_ctx=256") as ei:
        await c.complete([{"role": "user", "content": "word " * 1000}])
    assert not ei.value.retryable
    await c.aclose()


@pytest.mark.model
async def test_calls_run_in_parallel_slots_and_the_loop_stays_free(smol):
    c = LocalClient(str(smol), n_ctx=1024, slots=3)
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
    assert all(r.text.strip() for r in rs)
    assert ticks > elapsed / 0.01 * 0.5  # the event loop kept running during generation
    await c.aclose()


@pytest.mark.model
async def test_root_history_survives_a_batch_of_subcalls(smol):
    """The root's KV cache is not evicted by sub-calls: its next turn re-reads only new tokens."""
    c = LocalClient(str(smol), n_ctx=4096, slots=2)
    history = [{"role": "system", "content": "You write Python. " + "alpha beta gamma " * 300},
               {"role": "user", "content": "first question"}]
    first = await c.complete(history, max_tokens=4, temperature=0, ignore_eos=True)
    hist_tokens = first.usage.input_tokens
    assert hist_tokens > 800
    subs = [[{"role": "user", "content": f"sub task {i}: " + "delta epsilon " * 100}]
            for i in range(6)]
    await asyncio.gather(*(c.complete(s, max_tokens=4, temperature=0, ignore_eos=True)
                           for s in subs))
    again = await c.complete([*history, {"role": "assistant", "content": first.text},
                              {"role": "user", "content": "next"}], max_tokens=4, temperature=0,
                             ignore_eos=True)
    timings = again.raw["timings"]
    assert timings["cache_n"] >= hist_tokens - 8, timings      # history came from the cache
    assert timings["prompt_n"] < 64, timings                     # only the new turn was read
    await c.aclose()


@pytest.mark.model
async def test_subcalls_reuse_a_prefix_they_share(smol):
    """A batch whose prompts share a long instruction reads it once, not once per prompt."""
    c = LocalClient(str(smol), n_ctx=4096, slots=2)
    shared = "Instructions: " + "classify the topic of the record below carefully. " * 60
    first = await c.complete([{"role": "user", "content": shared + "Record: rivers."}],
                             max_tokens=2, temperature=0, ignore_eos=True)
    later = await c.complete([{"role": "user", "content": shared + "Record: copper."}],
                             max_tokens=2, temperature=0, ignore_eos=True)
    assert first.usage.input_tokens > 500
    assert later.raw["timings"]["cache_n"] >= first.usage.input_tokens - 16, later.raw["timings"]
    await c.aclose()


def _root_with_a_subcall(messages):
    """A scripted root whose sub-call is in flight when the model process is killed."""
    if sum(m["role"] == "assistant" for m in messages) == 0:
        return "```repl\nanswer['content'] = 'partial'\nr = llm_query('Count to 300.')\n```"
    return "```repl\nFINAL('unexpected')\n```"


def _kill_when_busy(srv: llama_server.LlamaServer) -> None:
    """In a thread: SIGKILL the model process as soon as a slot is generating."""
    import http.client
    import json
    import threading

    def run() -> None:
        for _ in range(1200):
            try:
                status, body = srv.request("GET", "/slots", timeout=2)
                if status == 200 and any(s.get("is_processing") for s in json.loads(body)):
                    break
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        os.kill(srv.proc.pid, signal.SIGKILL)
    threading.Thread(target=run, daemon=True).start()


@pytest.mark.model
def test_model_process_killed_mid_run_ends_the_run_with_an_error(smol, tmp_path):
    sub = LocalClient(str(smol), n_ctx=2048, slots=1, name="local:smol-under-test",
                      default_options={"max_tokens": 2000, "temperature": 0})
    asyncio.run(sub.load())
    _kill_when_busy(llama_server.running()[0])
    rlm = RLM(model=ReplayClient(_root_with_a_subcall), sub_model=sub, max_iterations=3,
              trace_path=tmp_path / "t.jsonl")
    res = rlm.completion("q", context="x")
    # the failed sub-call came back to the code as an error string; the run went on and ended
    run = load(tmp_path / "t.jsonl")
    assert run.status == res.status
    subcalls = [n for n in run.walk() if n.kind == "subcall"]
    assert subcalls and "SIGKILL" in str(subcalls[0].data.get("error", "")), subcalls
    assert "local:smol-under-test" in str(subcalls[0].data.get("error", ""))
    assert res.usage["root"].usage.output_tokens > 0      # the spend is kept
    # the next call starts a fresh server
    r = asyncio.run(sub.complete(QUESTION, max_tokens=4))
    assert r.text.strip()


@pytest.mark.model
def test_root_model_killed_mid_run_gives_status_error_and_keeps_the_trace(smol, tmp_path):
    root = LocalClient(str(smol), n_ctx=2048, slots=1, name="local:smol-root",
                       default_options={"max_tokens": 3000, "temperature": 0.0})
    asyncio.run(root.load())
    _kill_when_busy(llama_server.running()[0])
    rlm = RLM(model=root, max_iterations=2, trace_path=tmp_path / "t.jsonl")
    res = rlm.completion("Write a very long essay about rivers.", context="x" * 100)
    assert res.status == "error", (res.status, res.answer)
    assert "local:smol-root" in res.error and "SIGKILL" in res.error
    run = load(tmp_path / "t.jsonl")
    assert run.status == "error"


@pytest.mark.model
def test_truncated_gguf_fails_cleanly(smol, tmp_path):
    bad = tmp_path / "truncated.gguf"
    with open(smol, "rb") as f:
        bad.write_bytes(f.read(2_000_000))
    rlm = RLM(model=f"local:{bad}", max_iterations=2, trace_path=tmp_path / "t.jsonl")
    res = rlm.completion("q", context="x")
    assert res.status == "error"
    assert "truncated.gguf" in res.error and "died" in res.error
    assert load(tmp_path / "t.jsonl").status == "error"


@pytest.mark.model
def test_the_server_dies_with_a_killed_host(smol, tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, sys
        from recursa.models.local import LocalClient
        from recursa.models import llama_server
        c = LocalClient({str(smol)!r}, n_ctx=1024, slots=1)
        asyncio.run(c.load())
        print(llama_server.running()[0].proc.pid, flush=True)
        sys.stdin.read()
    """)
    host = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    pid = int(host.stdout.readline())
    os.kill(pid, 0)                        # running
    host.kill()
    host.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the llama.cpp server outlived its killed host")


@pytest.mark.model
async def test_default_model_answers_arithmetic():
    """The 1.5B default: a question any sample gets right."""
    c = make_client("local:qwen2.5-coder-1.5b")
    r = await c.complete(QUESTION, temperature=0, max_tokens=8)
    assert "5" in r.text and r.model == "local:qwen2.5-coder-1.5b"
    await c.aclose()
