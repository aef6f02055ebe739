"""LocalSandbox with pre-started workers (`prewarm`): a spare is used, it is indistinguishable
from a fresh worker, isolation holds, and no process or directory is ever left behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from helpers_procs import alive
from helpers_sandbox import MODES, Recorder, needs_bwrap, payload_for, run
from helpers_wait import wait_until
from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.sandbox import LocalSandbox, protocol
from recursa.sandbox.local import POOL, Spare, _kill_now, _spawn
from recursa.sandbox.transport import (
    AdoptedTransport,
    close_popen_pipes,
    descendants,
    processes_with,
)

ROOT = os.geteuid() == 0
SRC = str(Path(__file__).resolve().parent.parent / "src")

@pytest.fixture(autouse=True)
def _spares_not_zygote(monkeypatch):
    # These tests are about the pool of spares, which serves the configurations the zygote
    # does not (no uid of its own); tests/test_sandbox_zygote.py covers the zygote.
    monkeypatch.setenv("RECURSA_ZYGOTE", "0")


PROBE = textwrap.dedent("""
    import os, sys, resource
    lims = {n: resource.getrlimit(getattr(resource, n)) for n in
            ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_CORE")}
    probe = {"globals": sorted(k for k in globals() if k not in ("os", "sys", "resource",
                                                               "lims")),
             "modules": sorted(m for m in sys.modules if m != "resource"),
             "env": dict(os.environ), "cwd": os.getcwd(), "limits": lims,
             "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
             "root": sorted(os.listdir("/")), "context": context}
    """)


async def started(tmp_path: Path, value, kind: str = "text", **opts) -> LocalSandbox:
    sb = LocalSandbox(**opts)
    try:
        await sb.start(payload_for(tmp_path, value, kind), Recorder())
    except BaseException:
        await sb.close()
        raise
    return sb


async def probe(sb: LocalSandbox) -> dict:
    cell = await run(sb, PROBE + "\nprobe", max_output_chars=200_000)
    assert cell.error is None, cell.error
    return eval(cell.value)


@pytest.mark.parametrize("mode", MODES)
async def test_second_start_adopts_a_prestarted_worker(mode, tmp_path):
    first = await started(tmp_path, "one", isolation=mode, prewarm=1)
    try:
        assert POOL.wait_ready(first.config, 1)
        spare_pids = POOL.pids(first.config)
        second = await started(tmp_path, "two", isolation=mode, prewarm=1)
        try:
            assert second.prewarmed
            assert second.session._transport.pid in spare_pids
            assert isinstance(second.session._transport, AdoptedTransport)
            # only the context handshake was left to do (generous bound: a loaded machine)
            assert second.session.start_s < 1.0
            assert (await run(second, "context")).value == "'two'"
            # and the pool is being refilled with another, new worker
            assert POOL.wait_ready(first.config, 1)
            assert second.session._transport.pid not in POOL.pids(first.config)
        finally:
            await second.close()
    finally:
        await first.close()


async def test_prewarm_zero_starts_on_demand_and_keeps_no_spare(tmp_path, monkeypatch):
    sb = LocalSandbox(isolation=MODES[0], prewarm=0, memory_mb=1111)
    assert POOL.count(sb.config) == 0
    await sb.start(payload_for(tmp_path, "ctx"), Recorder())
    try:
        assert not sb.prewarmed
        assert (await run(sb, "context")).value == "'ctx'"
        await asyncio.sleep(0.3)
        assert POOL.count(sb.config) == 0
    finally:
        await sb.close()
    monkeypatch.setenv("RECURSA_PREWARM", "0")
    assert LocalSandbox(isolation=MODES[0]).prewarm == 0
    monkeypatch.setenv("RECURSA_PREWARM", "3")
    assert LocalSandbox(isolation=MODES[0]).prewarm == 3
    assert LocalSandbox(isolation=MODES[0], prewarm=0).prewarm == 0


# ------------------------------------------------------------------ indistinguishable
@pytest.mark.parametrize("mode", MODES)
async def test_spare_is_indistinguishable_from_a_fresh_worker(mode, tmp_path):
    fresh = await started(tmp_path, "same", isolation=mode, prewarm=0)
    try:
        a = await probe(fresh)
    finally:
        await fresh.close()
    warm = await started(tmp_path, "same", isolation=mode, prewarm=1)
    await warm.close()
    assert POOL.wait_ready(warm.config, 1)
    spare = await started(tmp_path, "same", isolation=mode, prewarm=1)
    try:
        assert spare.prewarmed
        b = await probe(spare)
        assert spare.isolation.replace(str(spare.uid), "N") == \
            fresh.isolation.replace(str(fresh.uid), "N")
    finally:
        await spare.close()
    if mode == "limits":   # the workspace is the cwd and HOME: a private dir of each worker
        for p in (a, b):
            assert p["cwd"] == p["env"]["HOME"] == p["env"]["TMPDIR"]
            p["env"].pop("HOME"), p["env"].pop("TMPDIR"), p.pop("cwd")
            p["env"].pop("PWD", None)
    if mode == "bwrap" and ROOT:
        assert a["uid"] != b["uid"]   # each worker its own uid
        for p in (a, b):
            assert p["uid"] == p["euid"] >= 200000 and p["groups"] == []
            p.pop("uid"), p.pop("euid")
    assert a == b


@pytest.mark.parametrize("mode", MODES)
async def test_each_spare_has_fresh_globals_and_its_own_workspace(mode, tmp_path):
    seen = []
    for i in range(4):
        sb = await started(tmp_path, f"run {i}", isolation=mode, prewarm=1)
        try:
            cell = await run(sb, "sorted(k for k in globals() if not k.startswith('__'))")
            names = eval(cell.value)
            assert "leaked" not in names and "mine" not in names
            assert (await run(sb, "context")).value == repr(f"run {i}")
            cell = await run(sb, "import os\nleaked = 1\nmine = os.listdir('.')\n"
                                 "open('mark.txt', 'w').write('x')\nmine")
            assert cell.value == "[]"
            seen.append((sb.prewarmed, sb.workspace))
        finally:
            await sb.close()
        assert not os.path.exists(seen[-1][1])
        POOL.wait_ready(sb.config, 1)
    assert any(p for p, _ in seen[1:])
    assert len({w for _, w in seen}) == 4


@pytest.mark.parametrize("mode", MODES)
async def test_context_text_json_and_large(mode, tmp_path):
    # warm the pool for this config, then check every context shape through a spare
    await (await started(tmp_path, "w", isolation=mode, prewarm=1)).close()
    text = "héllo wörld ✓\n" * 3
    big = "".join(f"line {i} {'x' * 90}\n" for i in range(60_000))   # ~6 MB
    cases = [(text, "text", "len(context), context[:14]", repr((len(text), text[:14]))),
             ({"a": [1, 2.5, None], "ü": {"k": "v"}}, "json", "context['ü']['k'], context['a']",
              repr(("v", [1, 2.5, None]))),
             ([1, "two"], "json", "type(context).__name__, context", repr(("list", [1, "two"]))),
             (big, "text", "len(context), context.count('\\n'), context[-20:]",
              repr((len(big), 60_000, big[-20:])))]
    for n, (value, kind, code, expected) in enumerate(cases):
        POOL.wait_ready(LocalSandbox(isolation=mode).config, 1)
        d = tmp_path / f"case{n}"
        d.mkdir()
        sb = await started(d, value, kind, isolation=mode, prewarm=1)
        try:
            assert sb.prewarmed
            cell = await run(sb, code, max_output_chars=1000)
            assert cell.value == expected, (cell.value, cell.error)
        finally:
            await sb.close()


@needs_bwrap
async def test_context_is_copied_when_it_cannot_be_linked(tmp_path, monkeypatch):
    await (await started(tmp_path, "w", isolation="bwrap", prewarm=1)).close()
    assert POOL.wait_ready(LocalSandbox(isolation="bwrap").config, 1)

    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    payload = payload_for(tmp_path, "copied context")
    sb = LocalSandbox(isolation="bwrap", prewarm=1)
    await sb.start(payload, Recorder())
    try:
        assert sb.prewarmed
        assert (await run(sb, "context")).value == "'copied context'"
    finally:
        await sb.close()
    assert os.path.exists(payload.path)   # the original is untouched


# ------------------------------------------------------------------ isolation with a spare
@needs_bwrap
async def test_isolation_holds_in_a_prestarted_worker(tmp_path, monkeypatch):
    # The spare is started while secrets are in the host's environment.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("RECURSA_TEST_SECRET", "nope")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    sb = await started(tmp_path, "c", isolation="bwrap", prewarm=1, max_processes=16)
    try:
        await sb.close()
        assert POOL.wait_ready(sb.config, 1)   # a spare started with the secrets around
        sb = await started(tmp_path, "c", isolation="bwrap", prewarm=1, max_processes=16)
        assert sb.prewarmed
        p = await probe(sb)
        assert not set(p["root"]) & {"root", "home", "work", "srv", "opt", "var"}
        assert "OPENAI_API_KEY" not in p["env"] and "RECURSA_TEST_SECRET" not in p["env"]
        hidden = ["/root", "/work", os.getcwd(), sb.workspace]
        code = f"import os\n{{p: os.path.exists(p) for p in {hidden!r}}}"
        assert set(eval((await run(sb, code)).value).values()) == {False}
        cell = await run(sb, "import socket\ns = socket.socket()\ns.settimeout(2)\n"
                             f"s.connect(('127.0.0.1', {port}))")
        assert cell.error is not None
        assert "ConnectionRefused" in cell.error or "unreachable" in cell.error.lower()
        cell = await run(sb, "socket.getaddrinfo('example.com', 80)")
        assert cell.error is not None and "gaierror" in cell.error
        code = ("res = {}\nfor q in ['/recursa/ctx/context', '/recursa/ctx/x', '/recursa/x',"
                " '/usr/evil', '/evil']:\n"
                "    try:\n        open(q, 'a').close(); res[q] = 'written'\n"
                "    except OSError as e:\n        res[q] = type(e).__name__\nres")
        assert "written" not in (await run(sb, code)).value
        if ROOT:
            assert p["uid"] == p["euid"] == sb.uid >= 200000 and p["groups"] == []
            assert f"uid {sb.uid}" in sb.isolation
            code = ("import subprocess, sys\nps, err = [], None\n"
                    "for _ in range(40):\n"
                    "    try:\n"
                    "        ps.append(subprocess.Popen([sys.executable, '-c', "
                    "'import time; time.sleep(5)']))\n"
                    "    except OSError as e:\n"
                    "        err = type(e).__name__\n        break\n"
                    "for q in ps:\n    q.kill(); q.wait()\n"
                    "len(ps), err")
            started_n, err = eval((await run(sb, code)).value)
            assert err is not None and started_n < 16
    finally:
        server.close()
        await sb.close()


@pytest.mark.parametrize("mode", MODES)
async def test_a_spare_runs_nothing_before_init(mode, tmp_path):
    """The only message a pre-started worker accepts first is init: anything else (here an
    exec that would write a file) is refused and the worker exits without running it."""
    spec = LocalSandbox(isolation=mode).config.new_worker()
    proc = _spawn(spec)
    try:
        frame = protocol.encode({"type": "exec", "id": "x1", "max_output_chars": 100,
                                 "code": "open('pwned', 'w').write('1')"})
        out, _ = await asyncio.to_thread(proc.communicate, frame, 30)
        n = protocol.decode_length(out[:4])
        msg = protocol.decode_body(out[4:4 + n])
        assert msg["type"] == "init_error" and "expected init" in msg["error"]
        assert proc.returncode == 2
        assert os.listdir(spec.workspace) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        spec.cleanup()


# ------------------------------------------------------------------ lifecycle
@pytest.mark.parametrize("mode", MODES)
async def test_dead_or_old_spares_are_replaced(mode, tmp_path, monkeypatch):
    cfg = LocalSandbox(isolation=mode).config
    await (await started(tmp_path, "w", isolation=mode, prewarm=1)).close()
    assert POOL.wait_ready(cfg, 1)
    (victim,) = POOL.pids(cfg)
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: not alive(victim))
    sb = await started(tmp_path, "after a death", isolation=mode, prewarm=1)
    try:
        assert sb.session._transport.pid != victim
        assert (await run(sb, "context")).value == "'after a death'"
    finally:
        await sb.close()
    assert POOL.wait_ready(cfg, 1)
    assert victim not in POOL.pids(cfg)

    monkeypatch.setattr(POOL, "max_age", 0.3)
    (old,) = POOL.pids(cfg)
    with POOL._cond:
        POOL._cond.notify_all()   # let the pool see its new max age now
    assert wait_until(lambda: POOL.pids(cfg) and POOL.pids(cfg) != [old])
    assert wait_until(lambda: not alive(old))
    sb = await started(tmp_path, "x", isolation=mode, prewarm=1)
    try:
        assert sb.session._transport.pid != old
    finally:
        await sb.close()


@pytest.mark.parametrize("mode", MODES)
async def test_a_spare_that_dies_when_taken_falls_back_to_a_fresh_worker(mode, tmp_path,
                                                                         monkeypatch):
    cfg = LocalSandbox(isolation=mode).config
    await (await started(tmp_path, "w", isolation=mode, prewarm=1)).close()
    assert POOL.wait_ready(cfg, 1)
    take = POOL.take

    def take_and_kill(config, n):
        spare = take(config, n)
        if spare is not None:   # the whole worker dies, bwrap and all
            tree = [spare.proc.pid, *descendants(spare.proc.pid)]
            _kill_now(spare)
            spare.proc.wait()
            assert wait_until(lambda: not any(alive(p) for p in tree), 5)
        return spare

    monkeypatch.setattr(POOL, "take", take_and_kill)
    sb = await started(tmp_path, "fallback", isolation=mode, prewarm=1)
    try:
        assert not sb.prewarmed
        assert (await run(sb, "context")).value == "'fallback'"
    finally:
        await sb.close()


@pytest.mark.parametrize("mode", MODES)
async def test_restart_after_timeout_keeps_workspace_and_context(mode, tmp_path):
    await (await started(tmp_path, "w", isolation=mode, prewarm=1)).close()
    POOL.wait_ready(LocalSandbox(isolation=mode).config, 1)
    sb = await started(tmp_path, "keep me", isolation=mode, prewarm=1, interrupt_grace=0.3)
    try:
        assert sb.prewarmed
        await run(sb, "v = 1\nopen('f.txt', 'w').write('kept')")
        cell = await run(sb, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                             "while True:\n    pass", timeout=0.5)
        assert cell.timed_out and cell.restarted and "v" in cell.lost_variables
        cell = await run(sb, "import os\ncontext, open('f.txt').read(), os.getuid()")
        assert eval(cell.value)[:2] == ("keep me", "kept")
        if mode == "bwrap" and ROOT:
            assert eval(cell.value)[2] == sb.uid   # the same uid owns the workspace
    finally:
        await sb.close()


async def test_concurrent_starts_get_their_own_context(tmp_path):
    sbs = []
    try:
        async def one(i):
            d = tmp_path / str(i)
            d.mkdir()
            sb = LocalSandbox(isolation=MODES[0], prewarm=2)
            sbs.append(sb)
            await sb.start(payload_for(d, f"ctx-{i}"), Recorder())
            return (await run(sb, "context")).value

        for _round in range(2):
            got = await asyncio.gather(*(one(i + 10 * _round) for i in range(5)))
            assert got == [repr(f"ctx-{i + 10 * _round}") for i in range(5)]
    finally:
        for sb in sbs:
            await sb.close()


# ------------------------------------------------------------------ no leaks
def _worker_tree() -> set[int]:
    """Our descendant processes that are sandbox workers or bwrap."""
    out = set()
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (b"worker.py" in cmd or b"bwrap" in cmd) and alive(pid):
            out.add(pid)
    # A zygote other tests started lives as long as this process, by design: not a leak.
    for pid in list(out):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"zygote.py" in f.read():
                    out -= {pid, *descendants(pid)}
        except OSError:
            out.discard(pid)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_many_sync_completions_leak_nothing(mode, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # workspaces land here
    replies = ["```repl\nn = len(context)\nprint(n)\n```", "```repl\nFINAL(str(n))\n```"]
    state = {"i": 0}

    def respond(messages):
        r = replies[state["i"] % 2]
        state["i"] += 1
        return r

    rlm = RLM(model=ReplayClient(respond), sandbox=lambda: LocalSandbox(isolation=mode,
                                                                        prewarm=1),
              max_iterations=4)
    for i in range(8):   # each completion() is a new event loop
        res = rlm.completion("how long?", context="x" * (100 + i))
        assert res.answer == str(100 + i), (res.status, res.error)
    cfg = LocalSandbox(isolation=mode).config
    assert POOL.wait_ready(cfg, 1)
    time.sleep(0.3)
    # Only the pool's spares (and what runs inside them) are left.
    spare_tree = set()
    for pid in POOL.pids():
        spare_tree |= {pid, *descendants(pid)}
    assert wait_until(lambda: _worker_tree() <= spare_tree), (_worker_tree(), spare_tree)
    assert len(POOL.pids()) <= POOL.MAX_CONFIGS
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("recursa-")]
    # the spare of this config (and maybe of another config) made its dirs here
    assert len(left) <= 2 * len(POOL.pids()), left


HOST = textwrap.dedent("""
    import asyncio, json, sys, time
    from recursa.sandbox import LocalSandbox
    from recursa.sandbox.local import POOL
    from recursa.base.types import ContextPayload

    async def handler(kind, args):
        return ""

    async def main(mode):
        p = ContextPayload(path=sys.argv[1], kind="text", sha256="-", size_bytes=1)
        for _ in range(2):
            sb = LocalSandbox(isolation=mode, prewarm=2)
            await sb.start(p, handler)
            await sb.run("x = 1", timeout=10, max_output_chars=100)
            await sb.close()
        assert POOL.wait_ready(sb.config, 2)
        print(json.dumps(POOL.pids()), flush=True)

    asyncio.run(main(sys.argv[2]))
    if sys.argv[3] == "hang":
        time.sleep(600)
    sys.stdin.readline()    # exit: once the test has seen the spares (else it races their end)
""")


def _processes_under(marker: str) -> list[int]:
    """Processes whose command line or cwd mentions `marker` (a private TMPDIR)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if (marker.encode() in cmd or cwd.startswith(marker)) and alive(int(entry)):
            found.append(int(entry))
    return found


@pytest.mark.parametrize("how", ["exit", "killed"])
@pytest.mark.parametrize("mode", MODES)
def test_spares_do_not_outlive_the_interpreter(mode, how, tmp_path):
    marker = tempfile.mkdtemp(prefix="recursa-prewarm-test-", dir=tmp_path)
    ctx = payload_for(tmp_path, "c")
    script = tmp_path / "host.py"
    script.write_text(HOST)
    env = {k: v for k, v in os.environ.items() if k != "RECURSA_PREWARM"}
    env.update(TMPDIR=marker, PYTHONPATH=SRC)
    host = subprocess.Popen([sys.executable, str(script), ctx.path, mode,
                             "hang" if how == "killed" else "exit"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        pids = json.loads(host.stdout.readline())
        assert len(pids) == 2 and all(alive(p) for p in pids)
        assert _processes_under(marker)
        if how == "killed":   # no atexit: the spares die with the host (parent-death signal)
            host.kill()
        else:                 # let it exit: atexit stops the spares
            host.stdin.close()
        assert host.wait(30) in (0, -signal.SIGKILL)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert wait_until(lambda: not any(alive(p) for p in pids), 10), pids
    assert wait_until(lambda: not _processes_under(marker), 10), _processes_under(marker)
    if how == "exit":   # atexit also removed the spares' private directories
        assert os.listdir(marker) == []


@needs_bwrap
def test_bwrap_killed_at_once_leaves_no_orphan(tmp_path):
    """Killed in its first milliseconds, bwrap has not yet set its inner process's
    parent-death signal: the worker's marker (its private directory) still finds it."""
    cfg = LocalSandbox(isolation="bwrap").config
    for delay in (0.0, 0.001, 0.003, 0.005, 0.01):   # ~3 ms orphaned it every time here
        spec = cfg.new_worker()
        proc = _spawn(spec)
        spare = Spare(cfg, spec, proc)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        _kill_now(spare)
        try:
            marker = spec.marker
            assert wait_until(lambda m=marker: not [p for p in processes_with(m) if alive(p)],
                              5)
        finally:
            close_popen_pipes(proc)
            spec.cleanup()
