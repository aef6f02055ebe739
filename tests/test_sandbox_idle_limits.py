"""Limits hold between cells: a thread or child process that a cell left running cannot pass
the workspace's disk cap or the tree's memory cap while the session is idle. The host watch runs
from start to close; it stops the worker, and the next cell restarts it and says why."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import sandbox_asuser
from helpers_procs import alive
from helpers_sandbox import MECHS, MODES, run, started
from recursa.sandbox.local import disk_usage

# 32 MiB written by a thread after its cell returned, in files of 1 MiB (no one file passes
# the per-file limit, which is the workspace cap).
LATE_WRITER = (
    "import threading, time\n"
    "def fill():\n"
    "    time.sleep(0.3)\n"
    "    for i in range(32):\n"
    "        with open(f'late{i}.bin', 'wb') as f:\n"
    "            f.write(b'\\0' * (1 << 20)); f.flush(); time.sleep(0.02)\n"
    "threading.Thread(target=fill, daemon=True).start()\n"
    "kept = 1\n"
    "print('cell returned')")

# Four children of 100 MB each, started by a cell that returns at once; together over 300 MB.
LATE_CHILDREN = (
    "import subprocess, sys\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5); "
    "b = bytearray(100 * 2**20); time.sleep(60)']) for _ in range(4)]\n"
    "kept = 1\n"
    "print('cell returned')")


@pytest.mark.parametrize("mode", MODES)
async def test_the_disk_cap_holds_between_cells(mode, tmp_path):
    sb = await started(tmp_path, isolation=mode, disk_mb=10, file_size_mb=64)
    try:
        cell = await run(sb, LATE_WRITER)
        assert cell.stdout == "cell returned\n" and not cell.restarted, cell
        await asyncio.sleep(3)   # idle: nobody runs a cell
        assert sb.workspace is not None
        if sb.forked:
            # a 10 MB tmpfs: the kernel stopped the writer at the cap (ENOSPC); nothing had
            # to be stopped, the session goes on
            nxt = await run(sb, "import os\nprint('next', 'kept' in globals(), "
                                "sum(map(os.path.getsize, os.listdir('.'))) <= 10 << 20)")
            assert nxt.stdout == "next True True\n" and not nxt.restarted, nxt
            return
        used = disk_usage(sb.workspace, limit=1 << 40)
        assert used is not None and used < 10 << 20, f"{used} bytes in the workspace"
        nxt = await run(sb, "print('next', 'kept' in globals())")
        assert nxt.stdout == "next False\n", nxt
        assert nxt.restarted and "kept" in nxt.lost_variables
        assert "between cells" in nxt.stderr and "10 MB limit" in nxt.stderr, nxt.stderr
        again = await run(sb, "print('again')")
        assert again.stdout == "again\n" and not again.restarted and again.stderr == ""
    finally:
        await sb.close()


@pytest.mark.parametrize("mode", MODES)
async def test_the_disk_cap_is_enforced_not_polled(mode, tmp_path):
    """98 MB written as fast as the worker can into a 50 MB workspace: with bubblewrap (a
    zygote's capped tmpfs) the write past the cap fails and nothing more than the cap is ever
    there; no file may be larger than the cap anywhere (RLIMIT_FSIZE)."""
    sb = await started(tmp_path, isolation=mode, disk_mb=50)
    try:
        cell = await run(sb, "import os\nblock = b'x' * (1 << 20)\nn = 0\n"
                             "try:\n"
                             "    for i in range(98):\n"
                             "        with open(f'f{i}', 'wb') as f:\n"
                             "            f.write(block)\n"
                             "        n += 1\n"
                             "except OSError as e:\n"
                             "    print(e.strerror)\n"
                             "print(n, sum(os.path.getsize(f) for f in os.listdir('.')) >> 20)\n"
                             "for f in os.listdir('.'):\n"
                             "    os.unlink(f)\n"
                             "try:\n"
                             "    open('one', 'wb').write(b'y' * (60 << 20))\n"
                             "except OSError as e:\n"
                             "    print('one file:', e.strerror)\n", timeout=60)
        if mode == "bwrap":
            assert sb.forked, sb.isolation
            assert not cell.restarted and cell.error is None, cell
            lines = cell.stdout.splitlines()
            assert lines[0] == "No space left on device", cell.stdout
            written, held = map(int, lines[1].split())
            assert written <= 50 and held <= 50, cell.stdout
            assert lines[2].startswith("one file:"), cell.stdout
        assert "workspace 50 MB" in sb.isolation and "file size 50 MB" in sb.isolation
    finally:
        await sb.close()


@pytest.mark.parametrize(("cgroups", "how"), MECHS)
async def test_the_memory_cap_holds_between_cells(cgroups, how, tmp_path):
    sb = await started(tmp_path, memory_mb=300, cgroups=cgroups)
    try:
        cell = await run(sb, LATE_CHILDREN)
        assert cell.stdout == "cell returned\n" and not cell.restarted, cell
        before = set(sb.processes())
        await asyncio.sleep(4)
        left = [p for p in before if alive(p)]
        assert not left, f"the tree over its limit still runs while idle: {left}"
        nxt = await run(sb, "print('next')")
        assert nxt.stdout == "next\n" and nxt.restarted, nxt
        assert "between cells" in nxt.stderr or "between cells" in (nxt.error or ""), nxt
        assert "300 MB memory limit" in nxt.stderr + (nxt.error or ""), nxt
    finally:
        await sb.close()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run the tests as another uid")
def test_frames_and_idle_limits_hold_as_an_unprivileged_user(tmp_path):
    """This module and the frame attacks again as an unprivileged uid: the zygote in a user
    namespace, no uid of its own, no cgroups (the host watch follows the run's pid)."""
    why = sandbox_asuser.usable()
    if why:
        pytest.skip(f"cannot run as an unprivileged user: {why}")
    here = Path(__file__).resolve().parent
    out = sandbox_asuser.run_pytest(
        [str(here / "test_sandbox_idle_limits.py"), str(here / "test_sandbox_frames.py")],
        "not unprivileged_user")
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    for name in ("test_the_disk_cap_holds_between_cells",
                 "test_the_memory_cap_holds_between_cells",
                 "test_a_frame_of_nested_empty_objects_is_refused_before_parsing"):
        assert f"{name}" in out.stdout and "FAILED" not in out.stdout, tail
