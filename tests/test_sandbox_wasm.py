"""sandbox="wasm": CPython on WASI under wasmtime, driven by scripted models.

The runtime is fetched by `make test` (python -m recursa.sandbox.wasm_runtime); without it these
tests skip, saying what to run (and fail under CI, where a skip would hide a missing install).

The attack cells of tests/test_attack.py that apply to a WebAssembly guest, each checked to be
contained: files outside the workspace (read and write), the network, keys in the environment
and /proc, the host's memory and processes, unbounded memory, a loop that never yields, output
without bound, filling the disk, a stack that never ends, tampering with the sub-call budget,
forged frames. Not applicable (WASI has no such thing, so the attack fails at the import or
the call): fork bombs and processes left behind, signals to the host, threads spinning past a
cell, /tmp (not mounted).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from helpers_procs import alive, processes_with
from helpers_scripted import SYSTEM_MARK, repl
from recursa import RLM
from recursa.base.types import ContextPayload, SandboxError
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load
from recursa.sandbox import make_sandbox
from recursa.sandbox.budgets import HOST, MB, RunTree
from recursa.sandbox.kinds import kind_names, sandbox_kind
from recursa.sandbox.wasm import WasmSandbox
from recursa.sandbox.wasm_runtime import PYTHON_WASI, unavailable_reason, verified_wasm, wasm_path

WHY = unavailable_reason()
if WHY and os.environ.get("CI"):
    raise RuntimeError(f"make test installs the wasm runtime, yet: {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

SECRET = "sk-recursa-wasm-" + uuid.uuid4().hex


class Attack:
    def __init__(self, res: Any, client: ReplayClient, trace: Path):
        self.res, self.trace = res, trace
        roots = [c for c in client.calls if SYSTEM_MARK in c[0]["content"]]
        self.feedback = roots[1][-1]["content"] if len(roots) > 1 else ""
        self.run = load(trace)
        cells = [n for n in self.run.nodes.values() if n.kind == "cell"]
        self.out = str(cells[0].data.get("output", "")) if cells else ""
        self.cell = cells[0].data if cells else {}


def attack(tmp_path: Path, code: str, *, sandbox_opts: dict[str, Any] | None = None,
           **limits: Any) -> Attack:
    """One RLM run whose first cell is `code` and whose second answers "survived"."""
    replies = [repl(code), repl('FINAL("survived")')]
    state = {"i": 0}

    def respond(messages):
        if SYSTEM_MARK not in messages[0]["content"]:
            return "sub-ok"
        state["i"] += 1
        return replies[min(state["i"] - 1, 1)]

    client = ReplayClient(respond, cost_usd=0.001)
    trace = tmp_path / f"trace-{uuid.uuid4().hex[:6]}.jsonl"
    limits.setdefault("cell_timeout", 5.0)
    limits.setdefault("max_iterations", 4)
    opts = {"memory_mb": 512, **(sandbox_opts or {})}
    rlm = RLM(model=client, sandbox=lambda: WasmSandbox(**opts), trace_path=trace,
              max_output_chars=4000, **limits)
    res = rlm.completion("Summarise the context.", context="the context " * 50)
    return Attack(res, client, trace)


def intact(a: Attack) -> None:
    """The run ended normally and its trace agrees with its Result."""
    assert a.res.status == "final" and a.res.answer == "survived", \
        (a.res.status, a.res.error, a.feedback[:2000])
    assert a.run.finished and a.run.status == "final" and not a.run.torn
    assert a.run.totals.cost_usd == pytest.approx(a.res.cost_usd)


# ------------------------------------------------------------------ it runs
def test_kind_is_registered_and_checked() -> None:
    assert "wasm" in kind_names()
    kind = sandbox_kind("wasm")
    assert kind is not None and kind.check is not None and kind.check({}) == []
    with pytest.raises(ValueError, match="memory_mb must be between"):
        make_sandbox("wasm", memory_mb=8192)


def test_a_missing_or_altered_runtime_is_refused_saying_what_to_run(tmp_path: Path) -> None:
    why = unavailable_reason(tmp_path)
    assert why and "not fetched" in why and "python -m recursa.sandbox.wasm_runtime" in why
    with open(wasm_path(tmp_path), "wb") as f:   # the right size, other bytes
        f.truncate(PYTHON_WASI.size)
    with pytest.raises(SandboxError, match="does not match its pinned SHA-256"):
        verified_wasm(tmp_path)
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("c")
    payload = ContextPayload(path=str(ctx), kind="text", sha256="", size_bytes=1)
    with pytest.raises(SandboxError, match="pinned SHA-256"):
        asyncio.run(WasmSandbox(cache_dir=tmp_path).start(payload, None))  # type: ignore[arg-type]


def test_scripted_run_uses_context_and_sub_calls(tmp_path: Path) -> None:
    code = ("import sys\nprint(sys.platform, len(context))\n"
            "r = llm_batch(['a', 'b'])\nx = llm_query('q')\nprint(r, x)")
    a = attack(tmp_path, code)
    intact(a)
    assert "wasi 600" in a.out and "['sub-ok', 'sub-ok'] sub-ok" in a.out
    assert a.res.subcalls == 3


@pytest.mark.slow   # ~4 s: 3 runs (~30 s more without the bench extra: its corpus)
def test_bench_code_mode_methods_answer_right(tmp_path: Path) -> None:
    from recursa.bench.methods import MethodConfig, parse_method
    from recursa.bench.runner import AsyncioExecutor, load_rows, make_specs, run_bench
    cfgs = []
    for m in ("rlm", "rlm-d0", "codeact-bm25"):
        name, depth, trunc = parse_method(m)
        cfgs.append(MethodConfig(method=name, depth=depth, truncate=trunc, model="replay:",
                                 sandbox="wasm", limits={"max_iterations": 3},
                                 client_options={"responder": "helpers_scripted:sniah_model"}))
    specs = make_specs(["sniah"], [2048], range(1), cfgs, str(tmp_path / "traces"))
    s = run_bench(specs, tmp_path, executor=AsyncioExecutor(2), progress=False)
    rows = load_rows(tmp_path)
    assert s["errors"] == 0 and s["ran"] == 3, [r["error"] for r in rows if r["error"]]
    rows = load_rows(tmp_path)
    assert {r["method"] for r in rows} == {"rlm", "rlm-d0", "codeact-bm25"}
    for r in rows:
        assert r["status"] == "final" and r["score"] == 1.0, r


# ------------------------------------------------------------------ files
def test_files_outside_the_workspace_are_not_there(tmp_path: Path) -> None:
    key = tmp_path / "id_rsa"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY----- attack-marker")
    target = tmp_path / "planted.txt"
    probes = {"ssh_key": str(key), "project": str(Path(__file__).parents[1] / "pyproject.toml"),
              "home": os.path.expanduser("~"), "etc_passwd": "/etc/passwd",
              "venv": os.path.realpath(".venv"), "root": "/"}
    code = ("import os\nseen = {}\n"
            f"for k, p in {probes!r}.items():\n"
            "    try:\n"
            "        seen[k] = 'dir' if os.path.isdir(p) and os.listdir(p) is not None "
            "else open(p).read(80)\n"
            "    except OSError as e:\n"
            "        seen[k] = type(e).__name__\n"
            "print(seen)\nw = {}\n"
            f"for p in [{str(target)!r}, '/recursa/planted', '/recursa/worker.py', '/planted']:\n"
            "    try:\n"
            "        open(p, 'a').write('x'); w[p] = 'written'\n"
            "    except OSError as e:\n"
            "        w[p] = type(e).__name__\n"
            "for src in ['/recursa/context', '/recursa/worker.py']:\n"
            "    try:\n"
            "        os.link(src, 'linked'); w[src] = 'linked'\n"
            "    except OSError as e:\n"
            "        w[src] = type(e).__name__\n"
            "print(w)\nopen('inside.txt', 'w').write('fine')\n"
            "print(os.getcwd(), open('inside.txt').read())")
    a = attack(tmp_path, code)
    intact(a)
    lines = a.out.strip().splitlines()
    seen, wrote = eval(lines[0]), eval(lines[1])
    assert set(seen.values()) == {"FileNotFoundError"}, seen
    # the read-only mount's files (hard links to the host's) can be neither written nor linked
    assert not {"written", "linked"} & set(wrote.values()), wrote
    assert lines[2] == "/workspace fine"
    assert not target.exists()
    assert "attack-marker" not in a.trace.read_text()


# ------------------------------------------------------------------ network
def test_network_is_absent(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    code = ("import socket\n"
            "try:\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "    s.sendall(b'exfiltrated'); print('sent')\n"
            "except Exception as e:\n"
            "    print('blocked', type(e).__name__)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 443); print('dns ok')\n"
            "except Exception as e:\n"
            "    print('dns blocked', type(e).__name__)\n"
            "try:\n"
            "    import urllib.request\n"
            "    urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=3); print('http ok')\n"
            "except Exception as e:\n"
            "    print('http blocked', type(e).__name__)")
    with server:
        a = attack(tmp_path, code)
        intact(a)
        assert "blocked" in a.out and "dns blocked" in a.out and "http blocked" in a.out
        assert "sent" not in a.out and "ok" not in a.out
        # A connection would wait in the listen backlog, accepted or not: there is none.
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()


# ------------------------------------------------------------------ secrets and the host
def test_keys_host_processes_and_memory_are_out_of_reach(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    host = os.getpid()
    code = ("import os\nprint('env', sorted(os.environ))\n"
            "for p in ['/proc/self/environ', f'/proc/{" + str(host) + "}/environ',"
            f" '/proc/{host}/mem']:\n"
            "    try:\n"
            "        open(p, 'rb').read(10); print('read', p)\n"
            "    except OSError as e:\n"
            "        print('no', type(e).__name__)\n"
            "for what in ('kill', 'fork', 'system', 'execv'):\n"
            "    print(what, hasattr(os, what))\n"
            "try:\n"
            "    import subprocess; subprocess.run(['true']); print('ran')\n"
            "except Exception as e:\n"
            "    print('no subprocess', type(e).__name__)\n"
            "import threading\n"
            "try:\n"
            "    threading.Thread(target=lambda: None).start(); print('thread')\n"
            "except RuntimeError as e:\n"
            "    print('no thread')")
    a = attack(tmp_path, code)
    intact(a)
    assert "env ['HOME', 'TMPDIR']" in a.out
    assert "read" not in a.out.replace("no thread", "") and a.out.count("no FileNotFound") == 3
    assert "kill False" in a.out and "fork False" in a.out and "system False" in a.out
    assert "no subprocess" in a.out and "no thread" in a.out
    assert SECRET not in a.trace.read_text()


# ------------------------------------------------------------------ resources
def test_unbounded_memory_is_a_memory_error(tmp_path: Path) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))"
    a = attack(tmp_path, code, sandbox_opts={"memory_mb": 256})
    intact(a)
    assert "MemoryError" in a.feedback


@pytest.mark.slow   # ~4 s: the cell's second of spinning, then a restart
def test_loop_forever_is_stopped_and_restarted(tmp_path: Path) -> None:
    code = "keep = 1\nwhile True:\n    pass"
    t0 = time.monotonic()
    a = attack(tmp_path, code, cell_timeout=1.0)
    assert time.monotonic() - t0 < 20
    intact(a)
    assert "exceeded 1 s" in a.feedback and "restarted" in a.feedback
    assert "were lost" in a.feedback
    assert a.cell.get("timed_out") is True


@pytest.mark.slow   # ~4 s
def test_print_without_bound_is_truncated_and_stopped(tmp_path: Path) -> None:
    code = ("import os\nos.write(2, b'E' * 5_000_000)\nprint('y' * 20_000_000)\n"
            "while True:\n    print('x' * 10_000)")
    a = attack(tmp_path, code, cell_timeout=1.5)
    intact(a)
    # A computing guest cannot be interrupted: it is stopped, and its output with it (the
    # local sandbox's KeyboardInterrupt would keep the first max_output_chars).
    assert len(a.feedback) < 6000 and "EEEE" not in a.feedback
    assert "exceeded 1.5 s and was stopped" in a.feedback


@pytest.mark.slow   # ~4 s
def test_filling_the_disk_stops_the_worker_and_empties_the_workspace(tmp_path: Path) -> None:
    code = ("import time\nblock = b'\\0' * (4 << 20)\n"
            "for i in range(40):\n"
            "    with open(f'f{i}.bin', 'wb') as f:\n"
            "        f.write(block)\n"
            "    time.sleep(0.05)\n"
            "print('wrote all')")
    a = attack(tmp_path, code, sandbox_opts={"disk_mb": 16})
    intact(a)
    assert "wrote all" not in a.feedback
    assert "workspace exceeded the 16 MB limit" in a.feedback and "restarted" in a.feedback


def test_a_deep_c_stack_is_a_recursion_error(tmp_path: Path) -> None:
    # repr recurses in C: with the Python limit lifted, CPython's own C-stack limit holds
    code = ("import sys\nsys.setrecursionlimit(10 ** 7)\nx = []\n"
            "for _ in range(10 ** 5):\n    x = [x]\nrepr(x)")
    a = attack(tmp_path, code)
    intact(a)
    assert "RecursionError" in a.feedback



# ------------------------------------------------------------------ the run's budget
def _batch_run(factory: Any, child: str, n: int, seen: list[tuple[int, int]]) -> Any:
    """A root wasm run whose one cell is an rlm_batch of `n` children running `child`;
    `seen`: the process's open runs and their committed memory at each root/child turn."""
    root = f"r = rlm_batch([f'child {{i}}' for i in range({n})])\nFINAL(' | '.join(r))"

    def respond(messages):
        if SYSTEM_MARK not in messages[0]["content"]:
            return "leaf"
        seen.append((HOST.open_runs(), HOST.committed()[0]))
        return repl(child if "child " in messages[1]["content"] else root)
    return RLM(model=ReplayClient(respond), sandbox=factory, max_depth=1,
               cell_timeout=60).completion("q", context="ctx")


def test_children_share_the_runs_memory_cap_and_host_lease() -> None:
    """A run at 128 MB whose children's sandboxes ask for 2 GB each: before, every child
    had its own 2 GB guest and no part in the process's totals; now the run holds one lease
    in them and each child's guest is capped at the run's 128 MB (a 300 MB allocation is a
    MemoryError), and the lease goes with the run."""
    made: list[WasmSandbox] = []

    def factory() -> WasmSandbox:
        made.append(WasmSandbox(memory_mb=128 if not made else 2048))
        return made[-1]
    child = ("try:\n    b = bytearray(300 << 20)\n    FINAL('big')\n"
             "except MemoryError:\n    FINAL('capped')")
    before = HOST.open_runs()
    seen: list[tuple[int, int]] = []
    res = _batch_run(factory, child, 2, seen)
    assert res.status == "final" and res.answer == "capped | capped", (res.answer, res.error)
    assert len(made) == 3 and {sb._guest_mb for sb in made} == {128}
    assert {runs for runs, _ in seen} == {before + 1}, seen    # children open no run of their own
    assert all(mem >= 32 * MB for _, mem in seen), seen        # the run's reserve: 128 / 4
    assert HOST.open_runs() == before


@pytest.mark.slow   # ~3.5 s: four children, one to three at a time
def test_children_beyond_the_runs_memory_wait_or_are_stopped_and_all_answer() -> None:
    """Four children of a run at 256 MB, each holding 80 MB (plus its host process's own
    ~45 MB): they cannot all run at once inside the run's cap, so some wait for room or, at
    the cap, the one started last is stopped and restarted; every child still answers."""
    made: list[WasmSandbox] = []

    def factory() -> WasmSandbox:
        made.append(WasmSandbox(memory_mb=256))
        return made[-1]
    child = ("import time\nb = bytearray(80 << 20)\nfor i in range(0, len(b), 4096):\n"
             "    b[i] = 1\ntime.sleep(0.5)\nFINAL('ok')")
    trees: list[Any] = []
    orig = RunTree.close
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunTree, "close", lambda self: (trees.append(self), orig(self))[1])
        res = _batch_run(factory, child, 4, [])
    assert res.status == "final" and res.answer == " | ".join(["ok"] * 4), res.error
    assert len(trees) == 1, trees                    # one tree for the run and its children
    assert trees[0].waited + trees[0].stopped >= 1, vars(trees[0])
    assert trees[0].peak_child >= 80 * MB

# ------------------------------------------------------------------ the protocol
def test_patching_llm_query_or_the_channel_cannot_exceed_the_budget(tmp_path: Path) -> None:
    code = (
        "import builtins, gc\n"
        "real = llm_query\n"
        "def llm_query(p, **kw):\n"
        "    return real(p, max_tokens=10, **kw)\n"
        "builtins.llm_query = llm_query\n"
        "outs = [llm_query(f'q{i}') for i in range(5)]\n"
        "outs += llm_batch([f'b{i}' for i in range(10)])\n"
        "repl = [o for o in gc.get_objects() if type(o).__name__ == 'Repl']\n"
        "outs += [repl[0]._call('llm', {'prompt': 'raw', 'model': None, 'opts': {}})"
        " for _ in range(5)]\n"
        "print(sum(not o.startswith('Error') for o in outs), 'answered')\n"
        "print([o for o in outs if o.startswith('Error')][0])")
    a = attack(tmp_path, code, max_subcalls=3)
    intact(a)
    assert a.res.subcalls == 3 and "3 answered" in a.out
    assert "max_subcalls" in a.feedback


def test_forged_frames_end_the_run_clearly(tmp_path: Path) -> None:
    code = ("import gc, os, struct\n"
            "ch = [o for o in gc.get_objects() if type(o).__name__ == 'Channel'][0]\n"
            "body = (b'{\"type\": \"call\", \"id\": \"c9\", \"kind\": \"llm\", \"args\": {\"p\": ['"
            " + b'{},' * (5 << 20) + b'{}]}}')\n"
            "data = memoryview(struct.pack('>I', len(body)) + body)\n"
            "while data:\n"
            "    data = data[os.write(ch.wfd, data):]\n"
            "import time; time.sleep(5)")
    a = attack(tmp_path, code)
    assert a.res.status == "error" and "broke the protocol" in str(a.res.error)
    assert a.res.turns == 1 and a.run.finished and not a.run.torn


@pytest.mark.slow   # ~3 s
def test_a_cell_calling_the_host_in_a_loop_is_interrupted_with_its_state_kept(tmp_path: Path) -> None:
    # The guest reads the host's interrupt while it waits on a call: KeyboardInterrupt there,
    # as in `local`, and the REPL keeps its variables (a computing guest is restarted instead).
    code = "keep = 1\nwhile True:\n    llm_query('again')"
    a = attack(tmp_path, code, cell_timeout=1.0, max_subcalls=100_000)
    intact(a)
    assert "KeyboardInterrupt" in a.feedback and "the REPL state was kept" in a.feedback
    assert a.cell.get("timed_out") is True and not a.cell.get("restarted")


def test_a_computing_guest_dies_with_a_killed_host(tmp_path: Path) -> None:
    # recursa's process is SIGKILLed mid-cell: its wasm host process must not spin on alone.
    ctx = tmp_path / "context.txt"
    ctx.write_text("c")
    script = (
        "import asyncio, sys\n"
        "from recursa.base.types import ContextPayload\n"
        "from recursa.sandbox.wasm import WasmSandbox\n"
        "async def main():\n"
        "    sb = WasmSandbox()\n"
        f"    p = ContextPayload(path={str(ctx)!r}, kind='text', sha256='', size_bytes=1)\n"
        "    await sb.start(p, None)\n"
        "    print('ready', flush=True)\n"
        "    await sb.run('while True: pass', timeout=600, max_output_chars=100)\n"
        "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        mine = [p for p in processes_with("wasm_host.py") if alive(p)
                and Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[1]
                == str(proc.pid)]
        assert len(mine) == 1, mine
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while alive(mine[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(mine[0])
