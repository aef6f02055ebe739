"""The local sandbox's pipes on uvloop (the loop of uvicorn[standard], so of many apps that
embed recursa). A transport's pipe fds belong to the loop once handed over: uvloop closes them
in libuv a loop iteration after the transport's close(). Closing them ourselves first freed
the numbers while libuv still held them; the next socket or pipe the process opened got one,
libuv's deferred close then closed that, and `recursa serve` on uvloop aborted (SIGABRT in
libuv) under 64 concurrent runs."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from helpers_sandbox import Recorder, payload_for
from recursa.sandbox import LocalSandbox

uvloop = pytest.importorskip("uvloop")

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run, "uvloop": uvloop.run}
# how the worker starts: forked by the zygote, spawned per run, or a pre-started spare adopted
STARTS = {"zygote": {"zygote": True}, "spawned": {"zygote": False, "prewarm": 0},
          "adopted": {"zygote": False, "prewarm": 1}}


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


async def start(tmp_path: Path, **opts: Any) -> LocalSandbox:
    sb = LocalSandbox(**opts)
    await sb.start(payload_for(tmp_path, "ctx"), Recorder())
    assert sb.session is not None
    return sb


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("how", STARTS)
def test_fds_opened_after_a_worker_is_killed_stay_open(tmp_path, loop, how):
    """Right after the transport is killed, new pipes (which get the lowest free numbers, so
    any the transport gave up) must not be closed behind their owner's back."""
    async def main() -> list[int]:
        sb = await start(tmp_path, **STARTS[how])
        transport = sb.session._transport   # type: ignore[union-attr]
        await transport.kill()
        new = [fd for _ in range(4) for fd in os.pipe()]
        for _ in range(5):   # the loop's deferred close callbacks run
            await asyncio.sleep(0)
        closed = [fd for fd in new if not is_open(fd)]
        for fd in new:
            if is_open(fd):
                os.close(fd)
        await sb.close()
        return closed

    assert LOOPS[loop](main()) == []


@pytest.mark.parametrize("how", STARTS)
def test_the_loop_can_watch_fds_opened_after_a_worker_is_killed(tmp_path, how):
    """The same, as the loop sees it: sockets opened right after the kill, watched by uvloop
    with no await in between (as an accepted connection is), are read normally; before the
    fix uvloop refused them ("File descriptor N is used by transport")."""
    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        sb = await start(tmp_path, **STARTS[how])
        await sb.session._transport.kill()   # type: ignore[union-attr]
        pairs = [socket.socketpair() for _ in range(3)]
        got: list[bytes] = []
        try:
            for a, b in pairs:
                for s in (a, b):
                    loop.add_reader(s.fileno(), lambda s=s: got.append(s.recv(1)))
            for a, b in pairs:
                a.send(b"x")
                b.send(b"y")
            for _ in range(200):
                if len(got) == 6:
                    break
                await asyncio.sleep(0.01)
        finally:
            for a, b in pairs:
                for s in (a, b):
                    loop.remove_reader(s.fileno())
                    s.close()
            await sb.close()
        return got

    assert sorted(uvloop.run(main())) == [b"x"] * 3 + [b"y"] * 3


def test_concurrent_runs_on_uvloop_leave_no_fd_behind(tmp_path):
    """32 sandboxes started, used and closed at once, three times over, on uvloop: every cell
    answers and the process keeps no fd of a closed run."""
    async def one(i: int) -> str:
        sb = LocalSandbox()
        try:
            own = tmp_path / str(i)
            own.mkdir(exist_ok=True)
            await sb.start(payload_for(own, f"ctx-{i}"), Recorder())
            cell = await sb.run("print(context)", timeout=30, max_output_chars=1000)
        finally:
            await sb.close()
        return cell.stdout.strip()

    async def main() -> tuple[int, int]:
        before = 0
        for wave in range(3):
            outs = await asyncio.gather(*(one(i) for i in range(32)))
            assert outs == [f"ctx-{i}" for i in range(32)]
            if wave == 0:   # after the first, which may start the zygote (its socket, its log)
                before = len(os.listdir("/proc/self/fd"))
        return before, len(os.listdir("/proc/self/fd"))

    before, after = uvloop.run(main())
    assert after <= before
