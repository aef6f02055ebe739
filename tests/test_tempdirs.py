"""Owned temporary directories: a SIGKILLed host leaves its sandbox, spare and context dirs
behind; the next process's sweep removes them, and never a live process's (nor a reused pid's
new owner's, nor anything that merely looks like ours)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from helpers_sandbox import MODES
from helpers_wait import wait_until
from recursa.base import tempdirs
from recursa.base.tempdirs import identity, owned_tempdir, start_sweep, sweep_stale

SRC = str(Path(__file__).resolve().parent.parent / "src")
ROOT = os.geteuid() == 0
linux = pytest.mark.skipif(identity()[2] == tempdirs._UNKNOWN,
                           reason="needs /proc to tell who owns a directory")


def owned_by(d: Path, pid: int) -> list[str]:
    return sorted(p.name for p in d.iterdir() if re.match(rf"recursa-[a-z]+-{pid}-", p.name))


def env_with_tmp(d: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RECURSA_PREWARM"}
    # the layout of spares (recursa-ws-*, -wctx-*); a zygote's runs are covered in
    # test_sandbox_zygote.py
    env.update(TMPDIR=str(d), PYTHONPATH=SRC, RECURSA_ZYGOTE="0")
    return env


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------ names
def test_the_name_says_who_owns_it(tmp_path):
    pid, start, scope = identity()
    d = owned_tempdir("recursa-ws-", dir=str(tmp_path))
    name = os.path.basename(d)
    assert name.startswith(f"recursa-ws-{pid}-{start}-{scope}-")
    assert tempdirs._NAME.match(name)
    assert os.stat(d).st_mode & 0o777 == 0o700
    with pytest.raises(ValueError):
        owned_tempdir("mine-", dir=str(tmp_path))


def test_the_sweep_starts_once_per_process_and_directory(tmp_path):
    t = start_sweep(str(tmp_path))
    assert t is not None
    t.join(10)
    assert start_sweep(str(tmp_path)) is None


# ------------------------------------------------------------------ a killed host
KILLED = textwrap.dedent("""
    import sys
    from recursa import RLM
    from recursa.models.replay import ReplayClient
    from recursa.sandbox import LocalSandbox

    code = "```repl\\nimport time\\nopen('started', 'w').write('1')\\ntime.sleep(300)\\n```"
    RLM(model=ReplayClient(lambda m: code), sandbox=lambda: LocalSandbox(isolation=sys.argv[1]),
        cell_timeout=600).completion("q", context="the context")
""")

SWEEPER = textwrap.dedent("""
    import json, threading
    from recursa.base.tempdirs import owned_tempdir
    mine = owned_tempdir("recursa-ctx-")     # the first one starts the sweep
    for t in threading.enumerate():
        if t.name == "recursa-tmp-sweep":
            t.join(60)
    print(json.dumps(mine))
""")


@linux
@pytest.mark.parametrize("mode", MODES)
def test_a_killed_hosts_dirs_are_swept_by_the_next_process(mode, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "host.py"
    script.write_text(KILLED)
    host = subprocess.Popen([sys.executable, str(script), mode], env=env_with_tmp(tmp))
    try:
        assert wait_until(lambda: list(tmp.glob("recursa-ws-*/started"))), "no cell ran"
    finally:
        host.kill()
        host.wait()
    left = owned_by(tmp, host.pid)
    kinds = {n.split("-")[1] for n in left}
    # the run's context, the sandbox's workspace (+ its context dir under bwrap) and a spare's
    assert kinds == ({"ctx", "ws", "wctx"} if mode == "bwrap" else {"ctx", "ws"}), left
    assert len([n for n in left if n.startswith("recursa-ws-")]) == 2, left   # + the spare

    out = subprocess.run([sys.executable, "-c", SWEEPER], env=env_with_tmp(tmp),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert owned_by(tmp, host.pid) == []
    # the sweeper's own directory (it exited without removing it) is all that is left
    assert [p.name for p in tmp.iterdir()] == [os.path.basename(json.loads(out.stdout))]


# ------------------------------------------------------------------ live processes
HOLD = textwrap.dedent("""
    import asyncio, json, os, sys
    from recursa.sandbox import LocalSandbox
    from recursa.base.tempdirs import owned_tempdir, sweep_stale
    from recursa.base.types import ContextPayload

    async def handler(kind, args):
        return ""

    async def main(mode):
        ctx = owned_tempdir("recursa-ctx-")
        path = os.path.join(ctx, "context.txt")
        with open(path, "w") as f:
            f.write("held")
        sb = LocalSandbox(isolation=mode, prewarm=1)
        await sb.start(ContextPayload(path=path, kind="text", sha256="-", size_bytes=4), handler)
        cell = await sb.run("open('alive', 'w').write('1')", timeout=30, max_output_chars=100)
        assert cell.error is None, cell.error
        print(json.dumps(sb.workspace), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        print(json.dumps(sweep_stale()), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        cell = await sb.run("print(open('alive').read() + context)", timeout=30,
                            max_output_chars=100)
        print(json.dumps(cell.stdout), flush=True)
        await sb.close()

    asyncio.run(main(sys.argv[1]))
""")


def _hold(script: Path, mode: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, str(script), mode], env=env_with_tmp(tmp),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line, "the host did not start"
    return p, json.loads(line)


@linux
@pytest.mark.parametrize("mode", MODES)
def test_live_processes_dirs_are_never_swept(mode, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    procs: list[subprocess.Popen] = []
    try:
        dead, _ = _hold(script, mode, tmp)
        procs.append(dead)
        dead.kill()
        dead.wait()
        stale = owned_by(tmp, dead.pid)
        assert stale
        a, ws_a = _hold(script, mode, tmp)
        procs.append(a)
        b, ws_b = _hold(script, mode, tmp)
        procs.append(b)
        live = {p.pid: owned_by(tmp, p.pid) for p in (a, b)}
        assert all(len(v) >= 3 for v in live.values()), live   # ctx, ws, spare ws (+ wctx)
        removed = []
        for p in (a, b):   # each sweeps while the other one is alive
            p.stdin.write("\n")
            p.stdin.flush()
            removed += json.loads(p.stdout.readline())
        assert {os.path.basename(r) for r in removed} <= set(stale)
        assert owned_by(tmp, dead.pid) == []     # by the background sweeps or these
        for pid, names in live.items():
            assert owned_by(tmp, pid) == names
        for ws in (ws_a, ws_b):
            assert os.path.exists(os.path.join(ws, "alive"))
        for p in (a, b):   # and the sandboxes still work
            p.stdin.write("\n")
            p.stdin.flush()
            assert json.loads(p.stdout.readline()) == "1held\n"
            assert p.wait(30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# ------------------------------------------------------------------ what is judged stale
def _mk(d: Path, name: str, content: bool = True) -> Path:
    p = d / name
    p.mkdir()
    if content:
        (p / "sub").mkdir()
        (p / "sub" / "f").write_text("x")
        (p / "g").write_text("y")
    return p


@linux
def test_a_reused_pid_is_told_from_its_owner(tmp_path):
    pid, start, scope = identity()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        other = tempdirs._starttime(sleeper.pid)
        assert other is not None
        gone = dead_pid()
        keep = [
            _mk(tmp_path, f"recursa-ws-{sleeper.pid}-{other}-{scope}-aaaaaaaa"),   # its owner
            _mk(tmp_path, f"recursa-ws-{pid}-{start}-{scope}-bbbbbbbb"),           # ourselves
            # an owner that could not read its start time: only its death would tell
            _mk(tmp_path, f"recursa-ws-{sleeper.pid}-0-{scope}-cccccccc"),
            # another boot or pid namespace: its pids are not ours to judge
            _mk(tmp_path, f"recursa-ws-{gone}-{start}-0123abcd-dddddddd"),
        ]
        drop = [
            _mk(tmp_path, f"recursa-ws-{sleeper.pid}-{int(other) + 1}-{scope}-eeeeeeee"),
            _mk(tmp_path, f"recursa-wctx-{pid}-{int(start) - 1}-{scope}-ffffffff"),
            _mk(tmp_path, f"recursa-ctx-{gone}-{start}-{scope}-gggggggg"),
            _mk(tmp_path, f"recursa-ctx-{gone}-0-{scope}-hhhhhhhh", content=False),
        ]
        removed = sweep_stale(str(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(removed) == sorted(str(p) for p in drop)
    assert all(p.exists() and (p / "sub" / "f").exists() for p in keep)
    assert not any(p.exists() for p in drop)


@linux
def test_lookalikes_symlinks_and_foreign_owners_are_untouched(tmp_path):
    _, start, scope = identity()
    gone = dead_pid()
    good = f"recursa-ws-{gone}-{start}-{scope}-abcdefgh"
    outside = _mk(tmp_path, "outside")
    lookalikes = [
        _mk(tmp_path, "recursa-ws-abcdefgh"),                              # no owner in it
        _mk(tmp_path, f"recursa-ws-{gone}-{start}-{scope}"),               # no random part
        _mk(tmp_path, good + "-x"),
        _mk(tmp_path, good + ".d"),
        _mk(tmp_path, "x" + good),
        _mk(tmp_path, good.replace("-ws-", "-WS-")),
        _mk(tmp_path, good.replace("-ws-", "-docker-", 1)[:-1]),
        _mk(tmp_path, f"recursa-ws-0{gone}-{start}-{scope}-abcdefgh"),
        _mk(tmp_path, f"recursa-ws-{gone}-{start}-{scope.upper()}-abcdefgh"),
        _mk(tmp_path, f"other-ws-{gone}-{start}-{scope}-abcdefgh"),
    ]
    link = tmp_path / f"recursa-ws-{gone}-{start}-{scope}-symlink_"
    link.symlink_to(outside)
    plain = tmp_path / f"recursa-ctx-{gone}-{start}-{scope}-a_file__"
    plain.write_text("not a directory")
    stale = _mk(tmp_path, good)
    (stale / "escape").symlink_to(outside)            # a symlink inside is removed, not followed
    (stale / "sub" / "escape").symlink_to(outside / "sub")
    foreign = None
    if ROOT:   # as root: another user's directory (not a worker uid) is not ours
        foreign = _mk(tmp_path, f"recursa-ws-{gone}-{start}-{scope}-foreign_")
        os.chown(foreign, 12345, 12345)

    assert sweep_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists()
    assert (outside / "sub" / "f").read_text() == "x" and (outside / "g").read_text() == "y"
    assert all((p / "sub" / "f").exists() for p in lookalikes)
    assert link.is_symlink() and plain.read_text() == "not a directory"
    if foreign is not None:
        assert foreign.exists()


@linux
@pytest.mark.skipif(not ROOT, reason="chowns to a worker uid")
def test_as_root_a_workspace_chowned_to_a_worker_uid_is_swept(tmp_path):
    _, start, scope = identity()
    ws = _mk(tmp_path, f"recursa-ws-{dead_pid()}-{start}-{scope}-workeruid")
    ws = ws.rename(tmp_path / ws.name[:-1])   # 8 random characters
    for p in (ws, ws / "sub", ws / "sub" / "f", ws / "g"):
        os.chown(p, tempdirs.WORKER_UID_MIN + 7, tempdirs.WORKER_UID_MIN + 7)
    os.chmod(ws / "sub", 0)
    assert sweep_stale(str(tmp_path)) == [str(ws)]


def test_the_sweep_never_raises(tmp_path, monkeypatch):
    assert sweep_stale(str(tmp_path / "missing")) == []

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(tempdirs, "_stale", boom)
    _, start, scope = identity()
    _mk(tmp_path, f"recursa-ws-{dead_pid()}-{start}-{scope}-abcdefgh")
    assert sweep_stale(str(tmp_path)) == []
    monkeypatch.setattr(threading, "Thread", boom)
    assert start_sweep(str(tmp_path / "elsewhere")) is None


def test_the_sweep_is_bounded_in_time(tmp_path):
    _, start, scope = identity()
    d = _mk(tmp_path, f"recursa-ws-{dead_pid()}-{start}-{scope}-abcdefgh")
    assert sweep_stale(str(tmp_path), time_limit=-1) == [] and d.exists()
    assert sweep_stale(str(tmp_path)) == [str(d)]
