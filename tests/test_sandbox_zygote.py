"""Workers forked by the zygote: one zygote serves every run, and each run still gets its own
workspace, /tmp, context, pid and network namespaces, no capabilities and no view of any other
run; as root its own uid, without root its own user namespace (the host user's uid outside).

Run as root, `test_the_zygote_tests_pass_as_an_unprivileged_user` runs this module again as an
unprivileged uid (tests/sandbox_asuser.py), so both paths are tested on a root machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sandbox_asuser
from helpers_sandbox import HAVE_BWRAP, Recorder, payload_for, run
from recursa.sandbox import LocalSandbox, forkserver
from recursa.sandbox.local import nproc_per_userns
from recursa.sandbox.transport import descendants

ROOT = os.geteuid() == 0
RUN_UID = 1000   # zygote.RUN_UID: a run's uid inside its own user namespace (not root)
pytestmark = pytest.mark.skipif(
    not (HAVE_BWRAP and (ROOT or nproc_per_userns())),
    reason="the zygote needs bubblewrap, and without root Linux 5.14+ (RLIMIT_NPROC per user "
           "namespace)")


async def started(tmp_path, context: str = "ctx", **opts) -> LocalSandbox:
    sb = LocalSandbox(**opts)
    try:
        await sb.start(payload_for(tmp_path, context), Recorder())
    except BaseException:
        await sb.close()
        raise
    return sb


def the_zygote(sb: LocalSandbox) -> forkserver.ZygoteHost:
    return forkserver.zygote_host(sb.config, sb.config.zygote_command)


async def test_one_zygote_forks_every_run(tmp_path):
    a = await started(tmp_path)
    host = the_zygote(a)
    pid = host.get().pid
    b = await started(tmp_path)
    try:
        assert a.forked and b.forked and not a.prewarmed
        assert "forked by a zygote" in a.isolation
        if ROOT:
            assert f"uid {a.uid}" in a.isolation and a.uid != b.uid
        else:
            assert "user namespace of its own" in a.isolation and a.uid is None
        assert host.get().pid == pid
        assert a.workspace != b.workspace
        for sb in (a, b):   # the zygote told the host where each run's init is
            init = sb.session._transport.pid   # type: ignore[union-attr]
            assert init and init != pid and os.path.exists(f"/proc/{init}")
        for sb in (a, b):
            cell = await run(sb, "import os\nprint(os.getpid(), os.getuid(), len(context))")
            assert cell.stdout.split() == ["2", str(sb.uid if ROOT else RUN_UID), "3"], cell
    finally:
        await asyncio.gather(a.close(), b.close())
    assert not os.path.exists(a.workspace) and not os.path.exists(b.workspace)


PROBE = """
import os, socket
with open('/workspace/mine', 'w') as f:
    f.write(str(os.getuid()))
with open('/tmp/mine', 'w') as f:
    f.write(str(os.getuid()))
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())
procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(1)
abstract = socket.socket(socket.AF_UNIX)
abstract.bind('\\0recursa-zygote-test')
print({'ws': sorted(os.listdir('/workspace')), 'tmp': sorted(os.listdir('/tmp')),
       'runs': os.listdir('/recursa/runs'), 'procs': procs, 'port': srv.getsockname()[1],
       'capeff': status['CapEff'].strip(), 'capbnd': status['CapBnd'].strip(),
       'nnp': status['NoNewPrivs'].strip(), 'uid': os.getuid()})
"""

CONNECT = """
import socket
out = []
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    out.append('tcp reached')
except OSError as e:
    out.append('tcp ' + type(e).__name__)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('\\0recursa-zygote-test')
    out.append('abstract reached')
except OSError as e:
    out.append('abstract ' + type(e).__name__)
print(out)
"""


async def test_concurrent_runs_see_nothing_of_each_other(tmp_path):
    a, b = await asyncio.gather(started(tmp_path, "a"), started(tmp_path, "b"))
    try:
        pa, pb = [eval((await run(sb, PROBE)).stdout) for sb in (a, b)]
        for sb, p in ((a, pa), (b, pb)):
            if ROOT:
                assert p["uid"] == sb.uid and p["uid"] >= 200000
            else:
                assert p["uid"] == RUN_UID
            assert p["ws"] == ["mine"] and p["tmp"] == ["mine"]   # the other's files absent
            assert p["runs"] == []                                 # every run's dirs hidden
            assert p["procs"] == [1, 2]                            # own pid namespace
            assert int(p["capeff"], 16) == 0 and int(p["capbnd"], 16) == 0
            assert p["nnp"] == "1"
        # the other run's listening socket (same port numbers, its own loopback) is out of
        # reach, and so is its abstract unix socket (per network namespace)
        cell = await run(b, CONNECT.format(port=pa["port"]))
        assert "tcp reached" not in cell.stdout and "abstract reached" not in cell.stdout, cell
        # the workspace is a tmpfs in the zygote's namespace (the disk cap): read it there
        assert (await run(a, "open('/workspace/mine').read()")).value == repr(str(pa["uid"]))
    finally:
        await asyncio.gather(a.close(), b.close())


async def test_a_run_cannot_signal_or_see_the_zygote(tmp_path):
    sb = await started(tmp_path)
    try:
        cell = await run(sb, "import os, signal\n"
                             "for pid in (1, 0, -1):\n"
                             "    try:\n"
                             "        os.kill(pid, signal.SIGKILL); print('killed', pid)\n"
                             "    except OSError as e:\n"
                             "        print(type(e).__name__)\n")
        # kill(-1) from a non-root uid reaches only its own processes: itself
        assert "killed 1" not in cell.stdout
        assert the_zygote(sb).get().alive
    finally:
        await sb.close()


async def test_a_dead_zygote_is_replaced_and_the_run_restarts(tmp_path):
    sb = await started(tmp_path, "the context")
    try:
        await run(sb, "kept = 1")
        z = the_zygote(sb).get()
        for pid in (*descendants(z.pid), z.pid):
            with contextlib.suppress(ProcessLookupError):   # gone with its parent already
                os.kill(pid, signal.SIGKILL)
        cell = await run(sb, "print(len(context))")
        assert cell.restarted and "kept" in cell.lost_variables, cell
        assert cell.stdout == "" or cell.stdout.strip() == "11"
        again = await run(sb, "print(len(context))")
        assert again.stdout.strip() == "11" and not again.restarted
        assert the_zygote(sb).get().pid != z.pid
    finally:
        await sb.close()


async def test_a_zygote_that_cannot_start_falls_back_to_a_worker_per_run(tmp_path, monkeypatch,
                                                                         caplog):
    # A configuration of its own (tmp_mb), so the shared zygote of the others is untouched.
    from recursa.sandbox import local
    monkeypatch.setattr(local.WorkerConfig, "zygote_command",
                        lambda self, runs, fd: ["/bin/false"])
    sb = await started(tmp_path, tmp_mb=77)
    try:
        assert not sb.forked and not sb.use_zygote
        assert "forked by a zygote" not in sb.isolation
        assert "zygote is not usable" in caplog.text
        cell = await run(sb, "print(len(context))")
        assert cell.stdout.strip() == "3"
    finally:
        await sb.close()
        local._NO_ZYGOTE.discard(sb.config)


KILLED = textwrap.dedent("""
    import asyncio, sys
    from recursa.sandbox import LocalSandbox
    from recursa.base.types import ContextPayload

    async def handler(kind, args):
        return ""

    async def main():
        sb = LocalSandbox(disk_mb=None)   # a workspace the host sees (not a capped tmpfs)
        await sb.start(ContextPayload(path=sys.argv[1], kind="text", sha256="-",
                                      size_bytes=1), handler)
        print(sb.workspace, sb._cgroup.dirs if sb._cgroup else [], flush=True)
        await sb.run("open('started', 'w').write('1')\\nimport time\\ntime.sleep(300)",
                     timeout=600, max_output_chars=100)

    asyncio.run(main())
""")


def test_a_killed_hosts_runs_and_groups_are_swept_by_the_next_process(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "host.py"
    script.write_text(KILLED)
    ctx = payload_for(tmp_path, "c")
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": src}
    host = subprocess.Popen([sys.executable, str(script), ctx.path], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        workspace, *groups = host.stdout.readline().split(" ", 1)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(workspace, "started")):
            assert time.monotonic() < deadline, "no cell ran"
            time.sleep(0.05)
    finally:
        host.kill()
        host.wait()
    runs = [p for p in tmp.iterdir() if p.name.startswith(f"recursa-runs-{host.pid}-")]
    assert len(runs) == 1 and workspace.startswith(str(runs[0]))
    group_dirs = eval(groups[0]) if groups else []
    sweeper = ("from recursa.base.tempdirs import owned_tempdir, sweep_stale\n"
               "from recursa.sandbox.treelimits import cgroup_host\n"
               "print(len(sweep_stale())); cgroup_host()")
    out = subprocess.run([sys.executable, "-c", sweeper], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert not runs[0].exists()
    deadline = time.monotonic() + 10   # the zygote died with its host, the run with it
    while any(os.path.exists(os.path.dirname(d)) for d in group_dirs):
        assert time.monotonic() < deadline, group_dirs
        time.sleep(0.1)


async def test_idle_zygotes_of_other_configurations_are_stopped(tmp_path):
    open_sb = await started(tmp_path, tmp_mb=41)   # its zygote has a run: never stopped
    zygotes = []
    try:
        for mb in range(42, 42 + forkserver.MAX_IDLE + 3):
            sb = await started(tmp_path, tmp_mb=mb)
            zygotes.append(the_zygote(sb).get())
            await sb.close()
        alive = [z for z in zygotes if z.alive]
        assert len(alive) <= forkserver.MAX_IDLE + 1
        assert zygotes[-1].alive and not zygotes[0].alive
        assert the_zygote(open_sb).get().alive
        cell = await run(open_sb, "print(len(context))")
        assert cell.stdout.strip() == "3" and not cell.restarted
    finally:
        await open_sb.close()


# ------------------------------------------------------------------ without root
not_root = pytest.mark.skipif(ROOT, reason="the user-namespace zygote is the non-root path "
                                           "(run as root, the test below runs it unprivileged)")


@not_root
async def test_a_run_has_its_own_user_namespace_and_cannot_regain_capabilities(tmp_path):
    sb = await started(tmp_path)
    try:
        assert sb.userns and sb.forked
        cell = await run(sb, textwrap.dedent("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())
            out = {k: st[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapAmb',
                                              'NoNewPrivs')}
            out['uid_map'] = open('/proc/self/uid_map').read().split()
            out['userns'] = libc.unshare(0x10000000) == 0      # CLONE_NEWUSER
            out['setgroups'] = open('/proc/self/setgroups').read().strip()
            for path in ('/dev/shm/x', '/dev/x', '/recursa/x', '/usr/x'):
                try:
                    open(path, 'w')
                    out[path] = 'written'
                except OSError as e:
                    out[path] = type(e).__name__
            print(out)
        """))
        out = eval(cell.stdout)
        for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
            assert int(out[k], 16) == 0, out
        assert out["NoNewPrivs"] == "1" and out["setgroups"] == "deny"
        assert out["uid_map"] == [str(RUN_UID), "0", "1"], out   # one uid: the zygote's
        assert out["userns"] is False, out                      # no nested user namespace
        assert not [p for p in out if p.startswith("/") and out[p] == "written"], out
        # the host knows the run's processes (for the memory watch): its init and worker
        procs = sb.processes()
        assert len(procs) == 2 and all(os.path.exists(f"/proc/{p}") for p in procs)
    finally:
        await sb.close()


THREADS = """
import threading, time
stop = threading.Event()
n = 0
try:
    for _ in range({n}):
        threading.Thread(target=stop.wait, daemon=True).start()
        n += 1
except RuntimeError:
    pass
print(n)
"""


@not_root
async def test_process_limits_count_each_run_alone(tmp_path):
    # RLIMIT_NPROC per user namespace: one run holding its whole allowance leaves another
    # run's untouched, though both are the same host user.
    a, b = await asyncio.gather(started(tmp_path, max_processes=12),
                                started(tmp_path, max_processes=12))
    try:
        assert "processes 12 (RLIMIT_NPROC of its own user namespace)" in a.isolation or \
            "cgroup" in a.tree_limits
        held = int((await run(a, THREADS.format(n=100))).stdout)
        assert 5 <= held < 12          # init + worker + its threads stay under the limit
        other = int((await run(b, THREADS.format(n=5))).stdout)
        assert other == 5
    finally:
        await asyncio.gather(a.close(), b.close())


@pytest.mark.slow
@pytest.mark.skipif(not ROOT, reason="only root can run the tests as another uid")
def test_the_zygote_tests_pass_as_an_unprivileged_user(tmp_path):
    """This module (and the isolation tests), again as an unprivileged uid: the zygote in a
    user namespace, a nested one per run, no cgroups (the host-side watch)."""
    why = sandbox_asuser.usable()
    if why:
        pytest.skip(f"cannot run as an unprivileged user: {why}")
    here = Path(__file__).resolve().parent
    out = sandbox_asuser.run_pytest(
        [str(here / "test_sandbox_zygote.py"), str(here / "test_sandbox_isolation.py")],
        "not unprivileged_user")
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert "the zygote needs" not in out.stdout, tail        # the zygote tests were not skipped
    for name in ("test_concurrent_runs_see_nothing_of_each_other",
                 "test_a_run_has_its_own_user_namespace_and_cannot_regain_capabilities",
                 "test_process_limits_count_each_run_alone", "test_bwrap_hides_host_files"):
        assert f"{name} PASSED" in out.stdout, tail
