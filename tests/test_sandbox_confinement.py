"""Isolation never lapses silently, and the worker's kernel surface is small.

* Without a usable bubblewrap the default `local` sandbox refuses to start, before any model
  call, saying why and what to do; `sandbox="limits"` is the explicit unconfined choice.
* Model-written code in the real local sandbox cannot make namespaces, ptrace, mount, load
  BPF or use keyrings (seccomp filter), keeps no capability (inheritable and ambient
  included), runs as a uid no concurrent run has (outside the usual subuid ranges) and, forked
  by the zygote, has a /dev/pts of its own.

Run as root, `test_confinement_holds_for_an_unprivileged_user` runs this module again as an
unprivileged uid (tests/sandbox_asuser.py), so the user-namespace path is tested too.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import os
import re
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

import sandbox_asuser
from helpers_sandbox import needs_bwrap
from openai_testserver import OpenAITestServer
from recursa import RLM
from recursa.base.tempdirs import WORKER_UID_MAX, WORKER_UID_MIN
from recursa.core.preflight import PreflightError
from recursa.models.replay import ReplayClient
from recursa.sandbox import LocalSandbox, make_sandbox
from recursa.sandbox import uids as uids_mod
from recursa.sandbox.isolation import IsolationUnavailable, unavailable_reason
from recursa.sandbox.kinds import kind_names
from recursa.sandbox.protocol import WORKER_PATH

ROOT = os.geteuid() == 0
MISSING = "/nonexistent/bwrap"
FINAL_X = "```repl\nFINAL('x')\n```"


def _worker_module() -> Any:
    spec = importlib.util.spec_from_file_location("_confinement_worker", WORKER_PATH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ isolation never lapses
def test_the_local_sandbox_refuses_without_bubblewrap(monkeypatch):
    monkeypatch.setenv("RECURSA_BWRAP", MISSING)
    for make in (LocalSandbox, lambda: make_sandbox("local"),
                 lambda: LocalSandbox(isolation="bwrap")):
        with pytest.raises(IsolationUnavailable) as e:
            make()
        msg = str(e.value)
        assert "refuses to run model-written code without isolation" in msg
        assert MISSING in msg and "install bubblewrap" in msg and "apt install bubblewrap" in msg
        # which sandboxes can work (every other kind in the registry), and the unconfined
        # ones named for what they are
        head, _, trusted = msg.partition("Only for code and data you trust")
        assert all(f"--sandbox {k} " in head for k in kind_names(isolates=True) if k != "local")
        assert all(f"--sandbox {k} " in trusted for k in kind_names(isolates=False))
        assert "sandbox='docker'" in head and "unconfined" in trusted
    limits = make_sandbox("limits")
    assert isinstance(limits, LocalSandbox) and limits.mode == "limits"
    assert "not isolated" in limits.isolation
    with pytest.raises(ValueError, match="contradicts"):
        make_sandbox("limits", isolation="bwrap")


def test_a_bubblewrap_that_cannot_make_a_sandbox_is_explained(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely "
                    "because the kernel does not allow non-privileged user namespaces.' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    with pytest.raises(IsolationUnavailable, match="No permissions to creating new namespace"):
        LocalSandbox(bwrap=str(fake))
    # Not root: the fix names the sysctls that allow unprivileged user namespaces.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    msg = unavailable_reason(str(fake))
    assert msg is not None and "cannot create a sandbox here" in msg
    assert "kernel.unprivileged_userns_clone" in msg or "user.max_user_namespaces" in msg \
        or "apparmor_restrict_unprivileged_userns" in msg or "container" in msg, msg
    assert "sandbox='docker'" in msg


@needs_bwrap
def test_a_working_bubblewrap_has_nothing_to_explain():
    assert unavailable_reason() is None


def test_rlm_fails_before_any_model_call_and_limits_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RECURSA_BWRAP", MISSING)
    with OpenAITestServer(lambda req: FINAL_X) as srv:
        def rlm(**kw: Any) -> RLM:
            return RLM(model="openai:test-model", base_url=srv.base_url, api_key="sk-test",
                       trace_path=tmp_path / f"{uuid.uuid4().hex}.jsonl", **kw)

        with pytest.raises(PreflightError, match="refuses to run model-written code"):
            rlm().completion("q", context="abc")
        assert srv.request_count == 0
        # without the preflight the run still ends before the first model call
        res = rlm(preflight=False).completion("q", context="abc")
        assert res.status == "error" and "install bubblewrap" in (res.error or "")
        assert srv.request_count == 0
        res = rlm(sandbox="limits").completion("q", context="abc")
        assert res.status == "final" and res.answer == "x", res.error
        assert srv.request_count == 1


def test_recursa_run_fails_before_any_model_call_and_limits_runs():
    with OpenAITestServer(lambda req: FINAL_X) as srv:
        def recursa_run(*extra: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                [sys.executable, "-m", "recursa.cli", "run", "q", "--context", "-",
                 "--model", "openai:test-model", "--base-url", srv.base_url,
                 "--api-key-env", "CONFINEMENT_KEY", "-q", *extra],
                input=b"abc", capture_output=True, timeout=60,
                env={**os.environ, "RECURSA_BWRAP": MISSING, "CONFINEMENT_KEY": "sk-test"})

        p = recursa_run()
        err = p.stderr.decode()
        assert p.returncode == 2 and p.stdout == b"", err
        assert "refuses to run model-written code" in err and "install bubblewrap" in err
        assert "--sandbox limits" in err
        assert srv.request_count == 0
        p = recursa_run("--sandbox", "limits")
        assert p.returncode == 0 and p.stdout.decode().strip() == "x", p.stderr.decode()
        assert srv.request_count == 1


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["mcp"]])
def test_serve_and_mcp_refuse_to_start_without_isolation(command):
    with OpenAITestServer(lambda req: FINAL_X) as srv:
        p = subprocess.run(
            [sys.executable, "-m", "recursa.cli", *command, "--model", "openai:test-model",
             "--base-url", srv.base_url, "--api-key-env", "CONFINEMENT_KEY"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
            env={**os.environ, "RECURSA_BWRAP": MISSING, "CONFINEMENT_KEY": "sk-test"})
        err = p.stderr.decode()
        assert p.returncode == 2, err
        assert "refuses to run model-written code" in err and "--sandbox limits" in err
        assert srv.request_count == 0


# ------------------------------------------------------------------ the seccomp filter
def _header_numbers(path: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize(("arch", "header"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_the_filters_syscall_numbers_match_the_kernel_headers(arch, header):
    if not os.path.exists(header):
        pytest.skip(f"no {header} (linux-libc-dev)")
    known = _header_numbers(header)
    table = _worker_module().SYSCALLS[arch]
    missing = [n for n in table if n not in known]
    wrong = {n: (v, known[n]) for n, v in table.items() if n in known and known[n] != v}
    # the headers of an older kernel may lack the newest calls; none may disagree
    assert not wrong, wrong
    assert len(missing) <= 3, missing


def test_every_denied_call_is_in_each_table():
    w = _worker_module()
    for arch, table in w.SYSCALLS.items():
        assert set(w._DENY_COMMON) <= set(table), arch
        program = w.seccomp_program(arch)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096


_NORMAL_USE = r"""
import ctypes, errno, json, mmap, multiprocessing, os, select, signal, socket, subprocess
import sys, tempfile, threading, time
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import importlib.util
spec = importlib.util.spec_from_file_location("w", sys.argv[1])
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
early = threading.Thread(target=time.sleep, args=(2,)); early.start()   # before the filter
w.lock_down()
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def err(rc):
    return 0 if rc == 0 else ctypes.get_errno()
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())
out['seccomp'] = status['Seccomp'].strip()
out['early_thread'] = open(f'/proc/self/task/{early.native_id}/status').read().split(
    'Seccomp:')[1].split()[0]
# normal use still works: threads, fork, subprocess (clone3 -> ENOSYS -> clone), pools, sockets
t = threading.Thread(target=lambda: out.__setitem__('thread', 'ok')); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out['fork'] = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
out['subprocess'] = subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout
out['posix_spawn'] = os.waitpid(os.posix_spawn('/bin/true', ['true'], {}), 0)[1]
with multiprocessing.get_context('fork').Pool(2) as pool:
    out['pool'] = pool.map(abs, [-1, -2, -3])
a, b = socket.socketpair(); a.send(b'x'); out['socketpair'] = b.recv(1).decode()
with tempfile.TemporaryFile() as f:
    f.write(b'y' * 4096); f.flush()
    out['mmap'] = mmap.mmap(f.fileno(), 4096)[:1].decode()
m, s = os.openpty(); out['openpty'] = os.isatty(s)
out['unshare_files'] = err(libc.unshare(0x00000400))          # CLONE_FILES: harmless, allowed
# denied
out['unshare_user'] = err(libc.unshare(0x10000000))
out['unshare_net'] = err(libc.unshare(0x40000000))
out['unshare_time'] = err(libc.unshare(0x00000080))
out['setns'] = err(libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0))
out['clone3'] = err(libc.syscall(435, 0, 0))
out['ptrace_traceme'] = err(libc.ptrace(0, 0, 0, 0))
out['mount'] = err(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
out['umount'] = err(libc.umount2(b'/proc', 2))
out['bpf'] = err(libc.syscall(w.SYSCALLS[w.seccomp_arch()]['bpf'], 0, 0, 0))
out['keyctl'] = err(libc.syscall(w.SYSCALLS[w.seccomp_arch()]['keyctl'], 0, 0, 0))
out['perf'] = err(libc.syscall(w.SYSCALLS[w.seccomp_arch()]['perf_event_open'], 0, 0, 0, 0, 0))
out['userfaultfd'] = err(libc.syscall(w.SYSCALLS[w.seccomp_arch()]['userfaultfd'], 0))
out['tiocsti'] = err(libc.ioctl(s, 0x5412, ctypes.c_char_p(b'x')))
if w.seccomp_arch() == 'x86_64':
    out['x32_getpid'] = err(libc.syscall(0x40000000 | 39))
print(json.dumps(out))
"""


@pytest.mark.skipif(_worker_module().seccomp_arch() is None, reason="no filter on this arch")
def test_the_filter_denies_what_it_should_and_nothing_python_needs(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(_NORMAL_USE)
    p = subprocess.run([sys.executable, "-I", str(script), str(WORKER_PATH)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["seccomp"] == "2" and out["early_thread"] == "2", out   # TSYNC: every thread
    assert out["thread"] == "ok" and out["fork"] == 7 and out["subprocess"] == "hi\n"
    assert out["posix_spawn"] == 0 and out["pool"] == [1, 2, 3]
    assert out["socketpair"] == "x" and out["mmap"] == "y" and out["openpty"] is True
    assert out["unshare_files"] == 0
    assert out["clone3"] == errno.ENOSYS
    for name in ("unshare_user", "unshare_net", "unshare_time", "setns", "ptrace_traceme",
                 "mount", "umount", "bpf", "keyctl", "perf", "userfaultfd", "tiocsti",
                 *(["x32_getpid"] if "x32_getpid" in out else [])):
        assert out[name] == errno.EPERM, (name, out)


# ------------------------------------------------------------------ from model-written code
PROBE = textwrap.dedent(r"""
    import ctypes, json, os, time
    libc = ctypes.CDLL(None, use_errno=True)
    def err(rc):
        return 0 if rc == 0 else ctypes.get_errno()
    st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())
    out = {k: st[k].strip() for k in ('Seccomp', 'NoNewPrivs', 'CapInh', 'CapAmb', 'CapEff',
                                      'CapPrm', 'CapBnd')}
    out['uid'] = os.getuid()
    out['unshare_user'] = err(libc.unshare(0x10000000))               # CLONE_NEWUSER
    out['unshare_user_net'] = err(libc.unshare(0x10000000 | 0x40000000))
    out['ptrace_attach'] = err(libc.ptrace(16, os.getppid() or 1, 0, 0))   # PTRACE_ATTACH
    out['ptrace_traceme'] = err(libc.ptrace(0, 0, 0, 0))
    out['mount'] = err(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
    m, s = os.openpty()
    out['pts_dev'] = os.stat('/dev/pts').st_dev
    out['pts'] = sorted(os.listdir('/dev/pts'))
    out['t0'] = time.time()
    time.sleep(SLEEP)
    out['t1'] = time.time()
    print(json.dumps(out))
""")


def _probe_run(tmp_path: Path, sandbox: Any, sleep: float = 0.0) -> RLM:
    code = PROBE.replace("SLEEP", repr(sleep))
    replies = iter([f"```repl\n{code}\n```", "```repl\nFINAL('done')\n```"])
    client = ReplayClient(lambda messages: next(replies), cost_usd=0.0)
    return RLM(model=client, sandbox=sandbox, max_iterations=3, cell_timeout=30,
               trace_path=tmp_path / f"{uuid.uuid4().hex}.jsonl", max_output_chars=4000)


async def _probe(tmp_path: Path, sandbox: Any, sleep: float = 0.0) -> dict[str, Any]:
    import json

    from recursa.obs.trace import load
    rlm = _probe_run(tmp_path, sandbox, sleep)
    res = await rlm.acompletion("probe", context="ctx")
    assert res.status == "final", res.error
    cells = [n for n in load(res.trace_path).nodes.values() if n.kind == "cell"]
    return json.loads(str(cells[0].data["output"]).strip().splitlines()[0])


CONFIGS = {
    "zygote": {},                                  # the default: forked by the zygote
    "own-bwrap": {"zygote": False, "prewarm": 0},  # a bubblewrap per run
    "limits": {"isolation": "limits"},             # unconfined, still filtered
}


@needs_bwrap
@pytest.mark.parametrize("config", list(CONFIGS))
def test_model_code_cannot_make_namespaces_trace_mount_or_keep_capabilities(config, tmp_path):
    out = asyncio.run(_probe(tmp_path, lambda: LocalSandbox(**CONFIGS[config])))
    assert out["Seccomp"] == "2" and out["NoNewPrivs"] == "1", out
    for cap in ("CapInh", "CapAmb", "CapEff", "CapPrm"):
        assert int(out[cap], 16) == 0, (cap, out)
    if config != "limits" or ROOT:
        assert int(out["CapBnd"], 16) == 0, out
    for name in ("unshare_user", "unshare_user_net", "ptrace_attach", "ptrace_traceme",
                 "mount"):
        assert out[name] == errno.EPERM, (name, out)
    if ROOT and config != "limits":
        assert WORKER_UID_MIN <= out["uid"] <= WORKER_UID_MAX, out


@needs_bwrap
def test_concurrent_runs_have_their_own_uid_and_pseudo_terminals(tmp_path):
    async def both() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_probe(tmp_path, "local", sleep=1.5) for _ in range(2)))

    a, b = asyncio.run(both())
    assert a["t0"] < b["t1"] and b["t0"] < a["t1"], (a, b)   # they did run at the same time
    assert a["pts_dev"] != b["pts_dev"], (a, b)              # a devpts instance each
    assert a["pts"] == b["pts"] == ["0", "ptmx"], (a, b)     # neither sees the other's pty
    if ROOT:
        assert a["uid"] != b["uid"], (a, b)
        for u in (a["uid"], b["uid"]):
            assert WORKER_UID_MIN <= u <= WORKER_UID_MAX


# ------------------------------------------------------------------ unique uids
def test_worker_uids_lie_outside_the_subordinate_and_system_ranges():
    assert 600_100_000 < WORKER_UID_MIN and WORKER_UID_MAX < 2**31   # useradd's SUB_UID_MAX
    assert WORKER_UID_MIN > 1_879_048_191                           # systemd's containers
    for line in Path("/etc/subuid").read_text().splitlines() if os.path.exists(
            "/etc/subuid") else []:
        _, start, count = line.split(":")
        lo, hi = int(start), int(start) + int(count) - 1
        assert hi < WORKER_UID_MIN or lo > WORKER_UID_MAX, line


_HOLD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from recursa.sandbox import uids
fd = uids._try_lock(uids._lock_dir(), int(sys.argv[2]))
print('locked' if fd is not None else 'busy', flush=True)
sys.stdin.read()
"""


def test_a_leased_uid_is_not_leased_again_here_or_by_another_process(tmp_path):
    got = [uids_mod.lease_uid() for _ in range(200)]
    try:
        assert len(set(got)) == len(got)
        assert all(WORKER_UID_MIN <= u <= WORKER_UID_MAX for u in got)
        assert set(got) <= uids_mod.leased()
        lockdir = uids_mod._lock_dir()
        assert stat.S_IMODE(os.stat(lockdir).st_mode) == 0o700
        src = str(Path(__file__).resolve().parent.parent / "src")
        # another process cannot take one of ours ...
        other = subprocess.run([sys.executable, "-c", _HOLD, src, str(got[0])], input="",
                               capture_output=True, text=True, timeout=30)
        assert other.stdout.strip() == "busy", other.stderr
        # ... and we cannot take one another process holds
        uids_mod.release_uid(got[0])
        holder = subprocess.Popen([sys.executable, "-c", _HOLD, src, str(got[0])],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            assert uids_mod._try_lock(lockdir, got[0]) is None
        finally:
            holder.communicate("", timeout=30)
        # the holder is gone (its lock with it): free again
        fd = uids_mod._try_lock(lockdir, got[0])
        assert fd is not None
        os.close(fd)
    finally:
        for u in got:
            uids_mod.release_uid(u)
    assert not set(got) & uids_mod.leased()


# ------------------------------------------------------------------ without root
@pytest.mark.slow
@needs_bwrap
@pytest.mark.skipif(not ROOT, reason="only root can run the tests as another uid")
def test_confinement_holds_for_an_unprivileged_user():
    why = sandbox_asuser.usable()
    if why:
        pytest.skip(f"cannot run as an unprivileged user: {why}")
    out = sandbox_asuser.run_pytest([str(Path(__file__).resolve())],
                                    "model_code or concurrent_runs or filter_denies")
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    for name in ("test_model_code_cannot_make_namespaces_trace_mount_or_keep_capabilities"
                 "[zygote] PASSED",
                 "test_concurrent_runs_have_their_own_uid_and_pseudo_terminals PASSED"):
        assert name in out.stdout, tail
