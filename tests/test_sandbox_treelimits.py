"""Limits on a sandbox's whole process tree (memory, processes): through its own control group
where the host can make one, else a host-side watch of the tree's resident memory. Children
that are each under the limit but together over it fail the cell with a clear message; the
host survives and the next cell runs."""

from __future__ import annotations

import asyncio
import os

import pytest

from helpers_sandbox import MECHS, MODES, needs_cgroups, run, started
from recursa.sandbox.treelimits import WATCH

# Four children of 100 MB each (resident: bytearray zero-fills its pages), each far under the
# 300 MB limit, together over it. The cell then waits for them.
CHILDREN = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(100 * 2**20); "
    "print(1, flush=True); time.sleep(60)'], stdout=subprocess.PIPE) for _ in range({n})]\n"
    "for k in kids:\n"
    "    k.stdout.readline()\n"
    "print('all children hold their memory')\n"
    "time.sleep(30)\n"
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("cgroups", "how"), MECHS)
async def test_children_together_over_the_memory_limit_fail_the_cell(mode, cgroups, how,
                                                                       tmp_path):
    sb = await started(tmp_path, isolation=mode, memory_mb=300, cgroups=cgroups)
    try:
        assert ("host watch" in sb.isolation) is (not cgroups)
        assert ("cgroup" in sb.isolation) is cgroups
        await run(sb, "kept = 1")
        cell = await run(sb, CHILDREN.format(n=4), timeout=60)
        assert cell.restarted, cell
        assert "all children hold their memory" not in cell.stdout
        assert "300 MB memory limit" in cell.error and how in cell.error, cell.error
        assert "kept" in cell.lost_variables
        assert sb.processes(), "the worker was restarted"
        nxt = await run(sb, "print('alive', len(context))")
        assert nxt.error is None and nxt.stdout == "alive 11\n", nxt
        assert not nxt.restarted
    finally:
        await sb.close()


@pytest.mark.parametrize(("cgroups", "how"), MECHS)
async def test_children_under_the_limit_together_run_fine(cgroups, how, tmp_path):
    sb = await started(tmp_path, memory_mb=600, cgroups=cgroups)
    try:
        code = CHILDREN.format(n=2).replace("time.sleep(30)", "time.sleep(1)")
        cell = await run(sb, code, timeout=60)
        assert cell.error is None and not cell.restarted, cell
        assert "all children hold their memory" in cell.stdout
    finally:
        await sb.close()


@pytest.mark.parametrize(("cgroups", "how"), MECHS)
async def test_each_run_is_limited_on_its_own(cgroups, how, tmp_path):
    """Two runs at once, 250 MB each under a 400 MB limit: over it together, under it alone."""
    a, b = await asyncio.gather(started(tmp_path, memory_mb=400, cgroups=cgroups),
                                started(tmp_path, memory_mb=400, cgroups=cgroups))
    try:
        code = CHILDREN.format(n=2).replace("100 * 2**20", "125 * 2**20").replace(
            "time.sleep(30)", "time.sleep(1.5)")
        cells = await asyncio.gather(run(a, code, timeout=60), run(b, code, timeout=60))
        for cell in cells:
            assert cell.error is None and not cell.restarted, cell
            assert "all children hold their memory" in cell.stdout
    finally:
        await asyncio.gather(a.close(), b.close())


@needs_cgroups
@pytest.mark.parametrize("mode", MODES)
async def test_process_cap_holds_for_the_tree(mode, tmp_path):
    sb = await started(tmp_path, isolation=mode, max_processes=12)
    try:
        assert "processes 12 (cgroup" in sb.isolation
        code = ("import subprocess, sys\n"
                "ok = failed = 0\n"
                "kids = []\n"
                "for _ in range(30):\n"
                "    try:\n"
                "        kids.append(subprocess.Popen(['sleep', '30']))\n"
                "        ok += 1\n"
                "    except OSError:\n"
                "        failed += 1\n"
                "print(ok, failed)\n"
                "for k in kids:\n"
                "    k.kill(); k.wait()\n")
        cell = await run(sb, code, timeout=60)
        assert cell.error is None, cell.error
        ok, failed = map(int, cell.stdout.split())
        assert failed > 0 and ok < 12, cell.stdout
        assert "limit of 12 processes" in cell.stderr, cell.stderr
        nxt = await run(sb, "import subprocess\nprint(subprocess.run(['echo', 'hi'], "
                            "capture_output=True, text=True).stdout)")
        assert nxt.error is None and nxt.stdout.strip() == "hi", nxt
        assert "limit" not in nxt.stderr
    finally:
        await sb.close()


@needs_cgroups
async def test_the_group_is_removed_when_the_sandbox_closes(tmp_path):
    sb = await started(tmp_path)
    group = sb._cgroup
    assert group is not None and group.dirs
    assert all(os.path.isdir(d) for d in group.dirs)
    members = sb.processes()
    assert members
    await sb.close()
    assert not any(os.path.exists(d) for d in group.dirs)
    assert not [p for p in members if os.path.exists(f"/proc/{p}")]


def test_the_watch_sums_a_tree_and_fires_once():
    """The fallback watch on this very process: a limit below our own RSS fires once."""
    fired: list[int] = []
    key = WATCH.watch(1024, fired.append, root=os.getpid())
    try:
        for _ in range(100):
            if fired:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert len(fired) == 1 and fired[0] > 1024
        asyncio.run(asyncio.sleep(0.6))
        assert len(fired) == 1
    finally:
        WATCH.unwatch(key)


@needs_cgroups
async def test_a_tree_the_kernel_killed_for_memory_is_reported_as_such(tmp_path):
    """What cgroup v2 does (memory.oom.group: the kernel kills the tree before the host's
    watch looks), made to happen here: the OOM killer is turned back on for the group and the
    worker itself is the biggest process when the tree passes the limit."""
    sb = await started(tmp_path, memory_mb=250)
    try:
        assert sb._cgroup is not None
        if sb._cgroup.kind == "cgroup1":
            with open(os.path.join(sb._cgroup.memory_dir, "memory.oom_control"), "w") as f:
                f.write("0")
        sb.disk_poll = 30.0   # keep the watch out of it
        code = ("import subprocess, sys, time\n"
                "mine = bytearray(120 * 2**20)\n"
                "ks = [subprocess.Popen([sys.executable, '-c', 'b = bytearray(80 * 2**20); "
                "import time; time.sleep(60)']) for _ in range(2)]\n"
                "time.sleep(30)\n")
        cell = await run(sb, code, timeout=60)
        assert cell.restarted, cell
        assert "250 MB memory limit" in cell.error, cell.error
        nxt = await run(sb, "print('alive')")
        assert nxt.stdout == "alive\n" and nxt.error is None, nxt
    finally:
        await sb.close()
