"""`recursa serve` (the real command) with the default local sandbox under concurrent load."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serve_process import recursa_serve

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_waves_of_concurrent_requests_on_local_sandboxes_are_all_answered(tmp_path: Path,
                                                                          loop: str):
    """Three waves of 64 requests, each a new conversation (a session that is later evicted
    and closed). Under uvloop (uvicorn's default when installed) this aborted the server in the
    second wave while the sandbox closed pipe fds uvloop still owned."""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    # the benchmark's scripted model (2 root turns, a batch of 8 sub-calls) in its own process
    upstream = subprocess.Popen([sys.executable, str(BENCH / "_serve.py"), "--latency", "0.1"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert upstream.stdout is not None
    upstream_url = json.loads(upstream.stdout.readline())["base_url"]
    try:
        with recursa_serve("--model", "openai:scripted", "--base-url", upstream_url,
                           "--sandbox", "local", "--max-runs", "64", "--allow-no-auth",
                           "--loop", loop, "--log-level", "warning") as (base, proc):
            results = asyncio.run(waves(base))
            assert proc.poll() is None, proc.output()
    finally:
        assert upstream.stdin is not None
        upstream.stdin.close()
        upstream.wait(10)
    assert all(r == 1 for wave in results for r in wave), results


async def waves(base: str) -> list[list[int | str]]:
    """Three waves of 64 requests at once; 1 for each right answer, else what came back."""
    async with httpx.AsyncClient(base_url=base + "/v1", timeout=120) as http:
        async def one(w: int, k: int) -> int | str:
            body = {"model": "recursa", "context": "x" * 2000, "messages": [
                {"role": "user", "content": f"ROOTQ-tag-{k}: which run is this?"}]}
            try:
                r = await http.post("/chat/completions", json=body)
            except httpx.HTTPError as e:
                return repr(e)
            if r.status_code != 200:
                return r.status_code
            return 1 if r.json()["choices"][0]["message"]["content"].strip() == \
                f"run-{k}" else r.text[:200]
        return [await asyncio.gather(*(one(w, k) for k in range(64)))
                for w in range(3)]
