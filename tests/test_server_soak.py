"""`recursa serve` (the real command, the isolated local sandbox) under long use: a client that
disconnects mid-stream cancels its run and frees its sandbox's process; hundreds of requests and
sessions leave the server's file descriptors, threads, child processes and memory where they
were when warm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("uvicorn")

from serve_process import recursa_serve  # noqa: E402

if not Path("/proc/self/status").exists():
    pytest.skip("reads the server's figures from /proc", allow_module_level=True)

# One reply for every turn: a context starting with SLOW keeps its cell busy for a minute.
SCRIPT = {"cycle": ["```repl\nimport time\nif str(context).startswith('SLOW'):\n"
                    "    time.sleep(60)\nFINAL('n=' + str(len(context)))\n```"]}


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (the sandbox's zygote, bwrap, workers)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - out
        out |= frontier
    return out


def figures(pid: int) -> dict[str, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(status["Threads"]),
            "children": len(descendants(pid)), "rss_mb": int(status["VmRSS"].split()[0]) // 1024}


def wait_until(cond: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def health(base: str) -> dict[str, Any]:
    return dict(httpx.get(base + "/health", timeout=10).json())


def serve(tmp: Path, *extra: str) -> Any:
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return recursa_serve("--model", f"replay-file:{script}", "--sandbox", "local", "--no-token",
                         "--log-level", "warning", *extra, start_timeout=90)


def ask(context: str, question: str = "How long?") -> dict[str, Any]:
    return {"model": "recursa", "context": context,
            "messages": [{"role": "user", "content": question}]}


@pytest.mark.slow
def test_a_client_that_disconnects_mid_stream_cancels_its_run_and_frees_its_sandbox(
        tmp_path: Path) -> None:
    with serve(tmp_path) as (base, proc):
        # a first answered request starts the sandbox's zygote, which stays
        r = httpx.post(base + "/v1/chat/completions", json=ask("warm"), timeout=60)
        assert r.json()["choices"][0]["message"]["content"] == "n=4", r.text
        before = descendants(proc.pid)
        sessions = health(base)["sessions"]
        with httpx.stream("POST", base + "/v1/chat/completions",
                          json={**ask("SLOW" + "x" * 100), "stream": True}, timeout=60) as s:
            lines = s.iter_lines()
            for line in lines:   # the run's progress, up to its first turn starting
                if '"line":"turn 1"' in line:
                    break
            assert wait_until(lambda: len(descendants(proc.pid) - before) > 0, 20), \
                "the run's sandbox process never appeared"
            time.sleep(1.0)        # the cell is sleeping now, not starting
            run_procs = descendants(proc.pid) - before
            assert health(base)["running"] == 1
        # the client is gone: the run is cancelled (not left sleeping for a minute), its slot
        # freed, its sandbox's processes gone, and a first question's session not kept
        t0 = time.monotonic()
        assert wait_until(lambda: health(base)["running"] == 0, 10), "the run was not cancelled"
        cancelled = time.monotonic() - t0
        # (0.2 s here; the bound is loose because closing a session may wait up to 10 s for a
        # cancelled question's clean-up: recursa/core/session.py `_aclose_inner`)
        assert wait_until(lambda: not (descendants(proc.pid) & run_procs), 30), \
            f"the sandbox's processes outlived the run: {descendants(proc.pid) & run_procs}"
        gone = time.monotonic() - t0
        assert health(base)["sessions"] == sessions
        print(f"\ndisconnect: run cancelled after {cancelled:.2f} s, its {len(run_procs)} "
              f"sandbox processes gone after {gone:.2f} s")
        assert proc.poll() is None, proc.output()


async def _traffic(base: str, rounds: int, concurrency: int,
                   reused: list[bool]) -> list[str]:
    """`rounds` conversations, `concurrency` at a time: a question, its follow-up in the same
    session, a streamed question, and every tenth round a stream abandoned mid-run. Returns
    what went wrong (empty: all answered as expected); `reused` gets whether each follow-up
    found its session (it may not, if its TTL struck first on a loaded machine)."""
    problems: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base + "/v1", timeout=120) as http:
        async def one_round(k: int) -> None:
            async with gate:
                ctx = f"doc-{k} " + "y" * (k % 50)
                r = await http.post("/chat/completions", json=ask(ctx))
                answer = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 \
                    else None
                if answer != f"n={len(ctx)}":
                    problems.append(f"round {k}: {r.status_code} {r.text[:200]}")
                    return
                follow = ask(ctx)
                follow["messages"] += [{"role": "assistant", "content": answer},
                                       {"role": "user", "content": "And again?"}]
                r = await http.post("/chat/completions", json=follow)
                if r.status_code != 200:
                    problems.append(f"round {k} follow-up: {r.status_code} {r.text[:200]}")
                else:
                    reused.append(r.json()["recursa"]["session"]["reused"])
                async with http.stream("POST", "/chat/completions",
                                       json={**ask(ctx + "!"), "stream": True}) as s:
                    text = "".join([line async for line in s.aiter_lines()])
                if "[DONE]" not in text:
                    problems.append(f"round {k} stream: {text[-200:]}")
                if k % 10 == 0:
                    async with http.stream("POST", "/chat/completions",
                                           json={**ask("SLOW" + ctx), "stream": True}) as s:
                        async for line in s.aiter_lines():
                            if '"line":"turn 1"' in line:
                                break          # and hang up while its cell sleeps
        await asyncio.gather(*(one_round(k) for k in range(rounds)))
    return problems


@pytest.mark.slow
def test_soak_hundreds_of_requests_and_sessions_leave_no_leaks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rounds, concurrency, ttl = 100, 6, 3.0
    reused: list[bool] = []
    with serve(tmp_path, "--sessions", "8", "--session-ttl", str(ttl), "--max-runs", "16") \
            as (base, proc):
        def settled() -> dict[str, int]:
            """The idle server's figures, once its sessions have timed out and their
            sandboxes' processes are gone."""
            assert wait_until(lambda: health(base)["sessions"] == 0
                              and health(base)["running"] == 0, 60)
            # closed sandboxes' processes exit a moment later (their sessions close in threads,
            # ~1.5 s here): wait for one reading to hold 3 s
            last, since = figures(proc.pid), time.monotonic()
            deadline = since + 60
            while time.monotonic() - since < 3.0 and time.monotonic() < deadline:
                time.sleep(0.1)
                now = figures(proc.pid)
                if now != last:
                    last, since = now, time.monotonic()
            return last

        assert not asyncio.run(_traffic(base, 10, concurrency, []))          # warm up
        warm = settled()
        peak: dict[str, int] = {}
        done = threading.Event()

        def sample() -> None:   # the busy server's highs, and the pool never over its bound
            while not done.wait(0.25):
                with contextlib.suppress(OSError, ValueError, httpx.HTTPError):
                    now = {**figures(proc.pid), "sessions": health(base)["sessions"]}
                    for k, v in now.items():
                        peak[k] = max(peak.get(k, 0), v)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        try:
            problems = asyncio.run(_traffic(base, rounds, concurrency, reused))
        finally:
            elapsed = time.monotonic() - t0
            done.set()
            sampler.join(10)
        after = settled()

        def near(f: dict[str, int]) -> bool:
            return (f["fds"] <= warm["fds"] + 4 and f["threads"] <= warm["threads"] + 4
                    and f["children"] <= warm["children"]
                    and f["rss_mb"] <= warm["rss_mb"] * 1.25 + 16)
        # a leak stays; a closed session's worker still exiting (seen taking up to ~10 s:
        # session close waits for a cancelled question's clean-up) goes: give it 30 s
        t1 = time.monotonic()
        while not near(after) and time.monotonic() - t1 < 30:
            time.sleep(0.5)
            after = figures(proc.pid)
        back_s = time.monotonic() - t1
        assert proc.poll() is None, proc.output()
    requests = rounds * 3 + rounds // 10
    with capsys.disabled():
        print(f"\nsoak through `recursa serve` (local sandbox): {requests} requests, "
              f"{rounds * 2 + rounds // 10} sessions ({sum(reused)} follow-ups continued "
              f"theirs), {elapsed:.1f} s; warm -> after: "
              + ", ".join(f"{k} {warm[k]} -> {after[k]}" for k in warm)
              + f" ({back_s:.1f} s after settling)"
              + "; peak while busy: " + ", ".join(f"{k} {v}" for k, v in peak.items()))
    assert not problems, problems[:5]
    assert peak["sessions"] <= 8, peak
    assert sum(reused) >= 0.9 * rounds, f"only {sum(reused)} follow-ups continued a session"
    assert near(after), (warm, after)
