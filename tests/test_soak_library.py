"""Soak: hundreds of runs and sessions in one process leave nothing behind (issue 21, item 7).

A scripted model (`replay:`: the loop's work, not a model's) drives the real local sandbox with
traces and the response cache on, through every path a long-lived host takes: runs one after
another and four at once, sessions of two questions, a cell that raises, a run cancelled while
its cell sleeps. Afterwards open file descriptors, threads, descendant processes, recursa temp
directories and memory must be back near the warm baseline; the bounds are tight enough that a
file descriptor, thread or process leaked per run (or per session) fails the test, and memory is
compared between the two halves of the soak, so a steady leak shows even under the allocator's
warm-up. The figures are printed (pytest -s) and recorded in docs/security.md.
"""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers_scripted import is_root, repl
from recursa import RLM
from recursa.models.replay import ReplayClient

SOAK_SECONDS = 50.0          # the whole soak stops here even on a slow machine
TARGET_ROUNDS = 60           # a round: 4 runs at once, 1 run alone, 1 session of 2 questions
MIN_ROUNDS = 20              # fewer than this in SOAK_SECONDS says nothing: fail

FIRST = repl("r = llm_query('one: ' + str(context)[:20])\n"
             "bs = llm_batch(['a', 'b', 'c'])\n"
             "print(len(r), len(bs))")
LAST = repl("x = [i * i for i in range(2000)]\nFINAL('ok ' + str(len(x)))")


def respond(messages):
    if not is_root(messages):
        return "sub:" + messages[-1]["content"][:40]
    query = next(m["content"] for m in messages if m["role"] == "user")
    turn = sum(m["role"] == "assistant" for m in messages)
    if "RAISE" in query and turn == 0:
        return repl("raise ValueError('a cell that fails')")
    if "SLEEP" in query:
        return repl("import time\ntime.sleep(30)")
    return FIRST if turn == 0 else LAST


# ------------------------------------------------------------------ what the process holds
def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith("Threads:")).split()[1])


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith("VmRSS:")).split()[1]) / 1024


def descendants() -> int:
    """Processes below this one (workers, zygotes, their children)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            parent[int(name)] = int(data[data.rindex(b")") + 2:].split()[1])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - mine
        mine |= frontier
    return len(mine)


def recursa_tempdirs() -> int:
    """recursa's temp directories that name this process as their owner (tempdirs.py)."""
    tag = f"-{os.getpid()}-"
    return sum(1 for n in os.listdir(tempfile.gettempdir())
               if n.startswith("recursa-") and tag in n)


def snapshot() -> dict[str, float]:
    gc.collect()
    return dict(fds=open_fds(), threads=os_threads(), py_threads=threading.active_count(),
                children=descendants(), tempdirs=recursa_tempdirs(), rss_mib=round(rss_mib(), 1))


def settle(base: dict[str, float], slack: dict[str, float], seconds: float = 10.0
           ) -> dict[str, float]:
    """Sample until every count is within its slack of `base` (closing is partly
    asynchronous: a worker's exit is reaped, a runner thread joins) or the time is up."""
    deadline = time.monotonic() + seconds
    while True:
        now = snapshot()
        if all(now[k] <= base[k] + slack[k] for k in slack) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


# ------------------------------------------------------------------ the soak
@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_hundreds_of_runs_and_sessions_leave_nothing_behind(tmp_path: Path):
    client = ReplayClient(respond)
    rlm = RLM(model=client, sandbox="local", trace_dir=tmp_path / "traces",
              cache=tmp_path / "responses.sqlite", cache_nondeterministic=True)
    context = "some context about alpha and beta\n" * 40
    counts = dict(runs=0, sessions=0, questions=0, errors=0, cancelled=0)

    async def four_at_once(i: int) -> None:
        rs = await asyncio.gather(*(rlm.acompletion(f"question {i}.{k}", context)
                                    for k in range(4)))
        assert all(r.answer == "ok 2000" for r in rs), [(r.answer, r.error) for r in rs]
        counts["runs"] += 4

    async def cancelled(i: int) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rlm.acompletion(f"SLEEP {i}", context), 0.5)
        counts["cancelled"] += 1

    def round_(i: int) -> None:
        asyncio.run(four_at_once(i))
        r = rlm.completion(f"alone {i}" if i % 5 else f"RAISE {i}", context, max_iterations=4)
        assert r.answer == "ok 2000", (r.answer, r.error)
        counts["runs"] += 1
        counts["errors"] += i % 5 == 0
        with rlm.session(context) as s:
            for q in range(2):
                assert s.completion(f"session {i} q{q}").answer == "ok 2000"
                counts["questions"] += 1
        counts["sessions"] += 1
        if i % 10 == 0:
            asyncio.run(cancelled(i))
        client.calls.clear()       # the scripted model's own record, not the library's

    for i in range(3):               # warm: the zygote, spare workers, pools, caches, imports
        round_(i)
    base = snapshot()
    t0 = time.monotonic()
    half = TARGET_ROUNDS // 2
    done = 0
    mid: dict[str, float] = {}
    while done < TARGET_ROUNDS and time.monotonic() - t0 < SOAK_SECONDS:
        round_(3 + done)
        done += 1
        if not mid and (done == half or time.monotonic() - t0 > SOAK_SECONDS / 2):
            mid = snapshot()      # the halfway mark, in rounds or in time on a slow machine
    elapsed = time.monotonic() - t0
    mid = mid or snapshot()
    slack = dict(fds=4, threads=2, py_threads=1, children=1, tempdirs=1)
    end = settle(base, slack)
    rlm_cache = rlm.cache
    assert rlm_cache is not None

    print(f"\nsoak: {done} rounds in {elapsed:.1f} s: {counts['runs']} runs "
          f"({counts['errors']} with a failing cell), {counts['cancelled']} cancelled, "
          f"{counts['sessions']} sessions ({counts['questions']} questions)")
    for name, snap in (("warm", base), ("half", mid), ("end", end)):
        print(f"  {name:5} " + "  ".join(f"{k} {v}" for k, v in snap.items()))

    assert done >= MIN_ROUNDS, f"only {done} rounds in {SOAK_SECONDS} s: the soak says nothing"
    for k, extra in slack.items():
        assert end[k] <= base[k] + extra, (k, base[k], end[k])
    # memory: the second half must not keep growing (a leak of 50 KB a run: +7 MiB at 150 runs)
    assert end["rss_mib"] - mid["rss_mib"] <= 6.0, (mid["rss_mib"], end["rss_mib"])
    assert end["rss_mib"] - base["rss_mib"] <= 24.0, (base["rss_mib"], end["rss_mib"])
    traces = list((tmp_path / "traces").glob("*.jsonl"))
    assert len(traces) >= counts["runs"]          # each run wrote its trace (and closed it)
