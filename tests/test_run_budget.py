"""One memory and process budget per run and per process (recursa.sandbox.budgets): a run's
child runs share its caps and wait for room instead of all starting; the process's sandboxes
commit their caps against totals that fit the machine, and `recursa serve`'s idle sessions
make room for new runs before a run waits."""

from __future__ import annotations

import asyncio
import glob
import os
import threading
import time
from pathlib import Path

import pytest

from helpers_sandbox import HAVE_BWRAP, needs_cgroups, started
from helpers_scripted import SYSTEM_MARK, repl, root_script
from helpers_wait import wait_until
from recursa import RLM
from recursa.base.types import SandboxError
from recursa.models.replay import ReplayClient
from recursa.sandbox import LocalSandbox
from recursa.sandbox.budgets import HOST, MB, HostBudget, Member, RunTree, machine_memory
from recursa.server.sessions import SessionPool

needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap not usable here")


@pytest.fixture
def totals():
    """Set the process's totals for one test, then back to the defaults."""
    def set_(memory_mb: int, processes: int = 1024) -> None:
        HOST.configure(memory=memory_mb * MB, processes=processes)
    yield set_
    HOST.configure()


class GroupPeak:
    """The peak of the memory charged to this process's sandboxes, summed over the groups
    right under its cgroup parent (a run tree's group holds its sandboxes')."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        pattern = f"/sys/fs/cgroup/**/recursa-{os.getpid()}-*/*/memory.usage_in_bytes"
        while not self._stop.is_set():
            total = 0
            for f in glob.glob(pattern, recursive=True):
                try:
                    with open(f) as fh:
                        total += int(fh.read())
                except (OSError, ValueError):
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._t.join(5)
        return self.peak


def fan_out(n: int, mb: int) -> ReplayClient:
    """Root: `n` child runs in one rlm_batch; each child holds `mb` MB for a second."""
    root = f"r = rlm_batch([f'child {{i}}' for i in range({n})])\nFINAL(' | '.join(r))"
    child = (f"import time\nb = bytearray({mb} << 20)\nfor i in range(0, len(b), 4096):\n"
             "    b[i] = 1\ntime.sleep(1)\nFINAL('ok')")

    def respond(messages):
        if SYSTEM_MARK not in messages[0]["content"]:
            return "leaf"
        return repl(child if "child " in messages[1]["content"] else root)
    return ReplayClient(respond)


# ------------------------------------------------------------------ a run's children
@needs_bwrap
@needs_cgroups
def test_ten_children_of_a_run_stay_inside_its_memory_cap():
    """Ten children of a run capped at 256 MB, each holding 100 MB: before, each child had
    its own 256 MB cap and all ten ran at once (~1 GB); now they share the run's 256 MB (the
    kernel holds it) and wait for room, and every one still answers."""
    peak = GroupPeak()
    t0 = time.monotonic()
    res = RLM(model=fan_out(10, 100), sandbox="local", max_depth=1, cell_timeout=60,
              sandbox_options={"memory_mb": 256}).completion("q", context="ctx")
    wall = time.monotonic() - t0
    held = peak.stop()
    assert res.status == "final", (res.status, res.error)
    assert res.answer == " | ".join(["ok"] * 10), res.answer
    assert 100 * MB < held <= 256 * MB, f"{held / MB:.0f} MB held by the run's sandboxes"
    assert wall < 120


def test_children_beyond_the_budget_wait_for_room():
    """A run at 512 MB whose children each use 200 MB: the first child of a parent always
    starts; the next waits while the run has no room for another child's reserve, and starts
    when a child ends."""
    used = {"root": 40 * MB}
    tree = RunTree(512 * MB, None, usage=lambda: sum(used.values()))
    root = Member("root", None, usage=lambda: used["root"])
    tree.join(root)
    order: list[str] = []

    async def child(name: str, hold: float) -> None:
        async with tree.slot(root):
            order.append(f"{name} in")
            used[name] = 200 * MB
            m = Member(name, root, usage=lambda: used.get(name, 0))
            tree.join(m)
            await asyncio.sleep(hold)
            tree.leave(m)
            del used[name]
            order.append(f"{name} out")

    async def main() -> None:
        await asyncio.gather(child("a", 0.6), child("b", 0.6), child("c", 0.1))

    asyncio.run(main())
    # a starts at once; b too (40 + 200 + two 128 MB reserves fit in 512? no: b waits for
    # room only once a's 200 MB is measured); c waits until one of them is out
    assert order[0] == "a in"
    c_in = order.index("c in")
    assert any(o.endswith(" out") for o in order[:c_in]), order
    assert tree.waited >= 1 and tree.peak_child >= 200 * MB


def test_nested_children_never_wait_for_each_other_in_a_circle():
    """Every slot of a full run is held by a child that waits for its own child: each
    parent may still run one child, so the run finishes."""
    tree = RunTree(256 * MB, None, usage=lambda: 250 * MB)    # always "full"
    root = Member("root", None, usage=lambda: 0)

    async def level(parent: Member, depth: int) -> int:
        async with tree.slot(parent):
            if depth == 0:
                return 1
            me = Member(f"d{depth}", parent, usage=lambda: 0)
            return 1 + await level(me, depth - 1)

    assert asyncio.run(asyncio.wait_for(level(root, 3), 10)) == 4


# ------------------------------------------------------------------ the process's totals
def test_defaults_fit_the_machine():
    """The process's totals are derived from its memory (three quarters), and a run's default
    cap lets eight runs fit: 4 concurrent runs and 16 idle sessions at 4 GB each, today's
    server defaults, asked for ~80 GB whatever the machine."""
    budget = HostBudget()
    assert budget.memory <= machine_memory() * 3 // 4 + MB
    sb = LocalSandbox(isolation="limits")
    assert sb.memory_mb is not None and 512 <= sb.memory_mb <= 4096
    assert sb.memory_mb * MB * 8 <= max(budget.memory, 8 * 512 * MB)


def test_a_run_waits_for_room_and_is_refused_with_what_holds_the_budget():
    """Runs are admitted by what the process's sandboxes use now plus a reserve for the new
    one (a quarter of its cap): one that does not fit waits for a run to end, and is refused,
    saying what holds the memory, once nothing has freed any for `wait` seconds."""
    budget = HostBudget(memory=1000 * MB, processes=100)
    used = {"a": 900 * MB, "b": 0}

    async def main() -> None:
        a = await budget.acquire(600 * MB, 10, wait=5, what="a", usage=lambda: used["a"])
        waiting = asyncio.create_task(budget.acquire(600 * MB, 10, wait=5, what="b",
                                                     usage=lambda: used["b"]))
        await asyncio.sleep(0.3)
        assert not waiting.done()                    # 900 + 150 MB > 1000: it waits ...
        budget.release(a)
        b = await asyncio.wait_for(waiting, 5)       # ... and runs once a has ended
        assert b.memory == 150 * MB and budget.open_runs() == 1
        used["b"] = 900 * MB
        with pytest.raises(SandboxError) as e:       # nothing frees: refused, clearly
            await budget.acquire(600 * MB, 10, wait=0.3, what="c")
        assert "use 900 of its 1000 MB" in str(e.value)
        assert "RECURSA_MEMORY_TOTAL_MB" in str(e.value)
        budget.release(b)
        big = await budget.acquire(50_000 * MB, 500, wait=1, what="d")  # cut to the totals
        assert (big.memory, big.processes) == (1000 * MB, 100)

    asyncio.run(main())


@needs_bwrap
def test_idle_sessions_make_room_for_a_new_run_before_it_waits(totals, tmp_path: Path):
    """`recursa serve`'s pool: three idle sessions keep their sandboxes, each holding 150 MB
    in a REPL variable; a fourth conversation needs room in a 512 MB total: the least
    recently used idle session is closed for it at once, and the new run goes ahead."""
    totals(512)
    pool = SessionPool(max_sessions=16, ttl_s=600)
    hold = "big = bytearray(150 << 20)\nfor i in range(0, len(big), 4096):\n    big[i] = 1\n"
    rlm = RLM(model=ReplayClient(root_script(repl(hold + "FINAL('ok')"))), sandbox="local",
              sandbox_options={"memory_mb": 256})
    sessions = []
    for i in range(3):
        s = rlm.session(f"context {i}")
        assert s.completion("q").answer == "ok"
        pool.put(f"k{i}", s)
        sessions.append(s)
    assert HOST.usage() > 450 * MB
    t0 = time.monotonic()
    fourth = rlm.session("context 3")
    assert fourth.completion("q").answer == "ok"
    assert time.monotonic() - t0 < 30
    assert wait_until(lambda: sessions[0].closed)
    assert "memory budget" in (sessions[0].closed_reason or "")
    assert not sessions[1].closed and not sessions[2].closed
    assert pool.reclaimed == 1 and len(pool) == 2
    # let the evicted session's close (a thread of its own) end before the others close
    assert wait_until(lambda: not any(t.name == "recursa-session-close" and t.is_alive()
                                      for t in threading.enumerate()))
    fourth.close()
    pool.close_all()
    assert wait_until(lambda: HOST.open_runs() == 0)


def test_process_budget_refuses_a_run_that_cannot_fit_even_after_waiting(totals, monkeypatch,
                                                                         tmp_path: Path):
    """A library program that keeps a session open (nothing reclaims it): a sandbox that does
    not fit beside it fails to start after RECURSA_MEMORY_WAIT seconds with nothing freed,
    saying why."""
    totals(240)
    monkeypatch.setenv("RECURSA_MEMORY_WAIT", "1")
    hold = "big = bytearray(180 << 20)\nfor i in range(0, len(big), 4096):\n    big[i] = 1\n"
    rlm = RLM(model=ReplayClient(root_script(repl(hold + "FINAL('ok')"))), sandbox="local",
              sandbox_options={"memory_mb": 280, "isolation": "limits"})
    held = rlm.session("held")
    assert held.completion("q").answer == "ok"
    assert HOST.usage() > 180 * MB
    try:
        with pytest.raises(SandboxError, match="no room for another run's sandbox after 1 s"):
            asyncio.run(started(tmp_path, memory_mb=280, isolation="limits"))
    finally:
        held.close()
    assert wait_until(lambda: HOST.open_runs() == 0)


def test_runs_outside_the_process_cgroup_count_by_their_own_usage():
    """A wasm run's host processes are not in the process's cgroup: where that cgroup measures
    the total, such a run's lease still counts its own usage beside it."""
    host = HostBudget(memory=1024 * MB, processes=100)
    host.measure_with(lambda: 300 * MB, lambda: 10)

    async def main() -> None:
        inside = await host.acquire(256 * MB, 0, wait=1, what="local", usage=lambda: 999 * MB)
        outside = await host.acquire(256 * MB, 0, wait=1, what="wasm", usage=lambda: 200 * MB,
                                     measured=False)
        assert host.usage() == 500 * MB       # the cgroup's 300 and the wasm run's 200
        host.release(inside)
        host.release(outside)
        assert host.usage() == 300 * MB

    asyncio.run(main())
