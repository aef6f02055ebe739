"""Remote sandboxes, tested here through stand-ins for the remote machine.

`LocalLauncher` "uploads" into a temp directory and runs the worker there as if it were
remote; `LocalStreamTransport` runs it under the supervisor and pushes its output in odd-sized,
delayed pieces the way SDK callbacks do (text mode decodes as E2B does). Fault-injecting
wrappers make the stream slow, corrupt it, or kill the process mid-cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from recursa.base.types import ContextPayload, Sandbox, SandboxError
from recursa.sandbox.local import base_python
from recursa.sandbox.remote import KINDS, RemoteSandbox, make_remote_sandbox
from recursa.sandbox.remote.base import StreamTransport, worker_command
from recursa.sandbox.transport import SubprocessTransport, Transport

PY = base_python()
TEXT = "alpha beta gamma\n" * 500


def payload_for(tmp_path: Path, text: str = TEXT) -> ContextPayload:
    path = tmp_path / "context.txt"
    path.write_text(text, encoding="utf-8")
    raw = path.read_bytes()
    return ContextPayload(path=str(path), kind="text", sha256=hashlib.sha256(raw).hexdigest(),
                          size_bytes=len(raw))


async def handler(kind: str, args: dict[str, Any]) -> Any:
    if kind == "llm":
        return f"LLM[{args['prompt']}]"
    if kind == "llm_batch":
        return [f"LLM[{p}]" for p in args["prompts"]]
    return f"{kind}?"


class Running:
    """`handler`, and an event for "the cell is running now": the cell calls
    llm_query('running') first, so a test acts mid-cell without guessing how long starting takes."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def __call__(self, kind: str, args: dict[str, Any]) -> Any:
        if kind == "llm" and args.get("prompt") == "running":
            self.event.set()
        return await handler(kind, args)

    async def wait(self) -> None:
        await asyncio.wait_for(self.event.wait(), 20)


# ---------------------------------------------------------------- stand-ins
class LocalStreamTransport(StreamTransport):
    """The supervisor + worker as a local process whose output reaches feed() the way an SDK
    delivers it: in pieces of random size, optionally delayed, as text in text mode."""

    def __init__(self, argv: list[str], *, text: bool, max_piece: int = 7,
                 delay: float = 0.0, seed: int = 0):
        super().__init__(text=text)
        self.argv = argv
        self.max_piece = max_piece
        self.delay = delay
        self.rng = random.Random(seed)
        self.proc: asyncio.subprocess.Process | None = None
        self.injected_lines: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def _spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={"LANG": "C.UTF-8"}, start_new_session=True)
        self._tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._err())]

    async def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            data = await self.proc.stdout.read(65536)
            if not data:
                break
            i = 0
            while i < len(data):
                n = self.rng.randint(1, self.max_piece)
                piece = data[i:i + n]
                i += n
                if self.delay and self.rng.random() < 0.05:
                    await asyncio.sleep(self.delay)
                if not self._line:   # between two lines, as a real extra line would be
                    for line in self.injected_lines:
                        self.feed_text(line)
                    self.injected_lines.clear()
                # text mode: decoded like E2B's on_stdout (invalid bytes replaced)
                self.feed(piece.decode("utf-8", errors="replace") if self.text else piece)
        self.feed_eof(await self.proc.wait())

    async def _err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(4096):
            self.feed_stderr(chunk)

    async def _write(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def _terminate(self) -> None:
        assert self.proc is not None
        if self.proc.stdin is not None:   # EOF: the supervisor kills the worker's group
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        for t in self._tasks:
            t.cancel()


class LocalLauncher:
    """A remote machine stand-in: prepare() copies the files into a temp dir ("upload"),
    transport() runs the worker there, cleanup() removes it and records that it ran."""

    kind = "local-standin"
    isolation = "none (test stand-in)"

    def __init__(self, root: Path, *, mode: str = "subprocess", wrap: Any = None,
                 prepare_delay: float = 0.0, fail_prepare: bool = False,
                 python: str = PY, **stream_opts: Any):
        self.root = root
        self.mode = mode
        self.wrap = wrap
        self.prepare_delay = prepare_delay
        self.fail_prepare = fail_prepare
        self.python = python
        self.stream_opts = stream_opts
        self.remote: Path | None = None
        self.uploads: list[str] = []
        self.prepared = 0
        self.preparing = asyncio.Event()
        self.cleaned = 0
        self.transports: list[Transport] = []

    async def prepare(self, files: dict[str, str]) -> str:
        self.prepared += 1
        self.preparing.set()
        if self.prepare_delay:
            await asyncio.sleep(self.prepare_delay)
        self.remote = self.root / "remote"
        self.remote.mkdir()
        for name, src in files.items():
            shutil.copyfile(src, self.remote / name)
            self.uploads.append(name)
        if self.fail_prepare:
            raise RuntimeError("quota exceeded")
        return str(self.remote)

    def transport(self) -> Transport:
        assert self.remote is not None
        t: Transport
        if self.mode == "subprocess":
            t = SubprocessTransport(worker_command(str(self.remote), self.python,
                                                   supervised=False), env={"LANG": "C.UTF-8"})
        else:
            text = self.mode == "text"
            t = LocalStreamTransport(worker_command(str(self.remote), self.python, text=text),
                                     text=text, **self.stream_opts)
        if self.wrap is not None:
            t = self.wrap(t, len(self.transports))
        self.transports.append(t)
        return t

    async def cleanup(self) -> None:
        self.cleaned += 1
        if self.remote is not None:
            shutil.rmtree(self.remote, ignore_errors=True)


# ---------------------------------------------------------------- fault injection
class SlowTransport:
    """Moves bytes a few at a time with pauses, in both directions."""

    def __init__(self, inner: Transport, piece: int = 3, delay: float = 0.002):
        self.inner, self.piece, self.delay = inner, piece, delay

    async def start(self) -> None:
        await self.inner.start()

    async def send(self, data: bytes) -> None:
        for i in range(0, len(data), self.piece * 50):
            await asyncio.sleep(self.delay)
            await self.inner.send(data[i:i + self.piece * 50])

    async def receive(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            await asyncio.sleep(self.delay)
            out += await self.inner.receive(min(self.piece, n - len(out)))
        return out

    async def kill(self) -> None:
        await self.inner.kill()

    def diagnostics(self) -> str:
        return self.inner.diagnostics()


class CorruptingTransport(SlowTransport):
    """After `after` good bytes, the stream delivers random garbage (once)."""

    def __init__(self, inner: Transport, after: int, seed: int = 1):
        super().__init__(inner, piece=1 << 30, delay=0)
        self.after = after
        self.seen = 0
        self.garbage = b""
        rng = random.Random(seed)
        # a plausible header announcing 40 bytes, then 40 bytes that are not JSON
        self.pending = (40).to_bytes(4, "big") + bytes(rng.randrange(128, 256) for _ in range(40))

    async def receive(self, n: int) -> bytes:
        if self.seen >= self.after and self.pending:
            out, self.pending = self.pending[:n], self.pending[n:]
            return out
        data = await self.inner.receive(n)
        self.seen += len(data)
        return data


def live(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[-1].startswith("Z"):
                return False
    return True


async def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if not live(pid):
            return True
        await asyncio.sleep(0.05)
    return False


# ---------------------------------------------------------------- fixtures
@pytest.fixture
async def remote(tmp_path: Path):
    made: list[Sandbox] = []

    async def make(launcher: LocalLauncher, on_call: Any = handler, **opts: Any) -> RemoteSandbox:
        sb = RemoteSandbox(launcher, **opts)
        made.append(sb)
        await sb.start(payload_for(tmp_path), on_call)
        return sb

    yield make
    for sb in made:
        await sb.close()


MODES = ["subprocess", "raw", "text"]


# ---------------------------------------------------------------- behaviour
@pytest.mark.parametrize("mode", MODES)
async def test_remote_repl_roundtrip(remote: Any, tmp_path: Path, mode: str) -> None:
    launcher = LocalLauncher(tmp_path, mode=mode)
    sb = await remote(launcher)
    assert sorted(launcher.uploads) == ["context", "supervisor.py", "worker.py"]
    cell = await sb.run("n = len(context)\nn", timeout=10, max_output_chars=1000)
    assert cell.error is None and cell.value == str(len(TEXT))
    cell = await sb.run("print(llm_query('hi'), llm_batch(['a', 'b']))\nprint('x' * 50000)",
                        timeout=10, max_output_chars=100000)
    assert cell.error is None, cell.error
    assert cell.stdout.startswith("LLM[hi] ['LLM[a]', 'LLM[b]']") and cell.stdout_chars > 50000
    cell = await sb.run("answer['content'] = 'done'; answer['ready'] = True; n",
                        timeout=10, max_output_chars=1000)
    assert cell.final == "done"
    await sb.close()
    assert launcher.cleaned == 1 and not (tmp_path / "remote").exists()


@pytest.mark.parametrize("mode", ["raw", "text"])
async def test_chunked_delayed_sdk_stream(remote: Any, tmp_path: Path, mode: str) -> None:
    launcher = LocalLauncher(tmp_path, mode=mode, max_piece=3, delay=0.01, seed=7)
    sb = await remote(launcher)
    code = "import json\nprint(json.dumps([llm_query(str(i)) for i in range(5)]))\nlen(context)"
    cell = await sb.run(code, timeout=20, max_output_chars=10000)
    assert cell.error is None, cell.error
    assert cell.stdout.strip() == '["LLM[0]", "LLM[1]", "LLM[2]", "LLM[3]", "LLM[4]"]'
    assert cell.value == str(len(TEXT))


async def test_slow_stream(remote: Any, tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, wrap=lambda t, i: SlowTransport(t))
    sb = await remote(launcher)
    cell = await sb.run("x = llm_query('slow')\nprint(x * 300)", timeout=30,
                        max_output_chars=100000)
    assert cell.error is None, cell.error
    assert cell.stdout.startswith("LLM[slow]LLM[slow]") and len(cell.stdout) > 2000
    # time spent waiting on a slow stream for a sub-call does not end the cell early
    cell = await sb.run("llm_query('again')", timeout=5, max_output_chars=1000)
    assert cell.value == "'LLM[again]'"


async def test_corrupted_stream_restarts_cleanly(remote: Any, tmp_path: Path) -> None:
    # only the first incarnation's stream is corrupted, after init/ready and one cell
    state = {"after": 10**9}
    launcher = LocalLauncher(
        tmp_path, wrap=lambda t, i: CorruptingTransport(t, state["after"]) if i == 0 else t)
    sb = await remote(launcher)
    first = launcher.transports[0]
    assert isinstance(first, CorruptingTransport)
    first.after = first.seen   # garbage from the next byte on
    cell = await sb.run("keep = 1\nprint('hello')", timeout=10, max_output_chars=1000)
    assert cell.restarted and cell.error is not None
    assert "malformed message" in cell.error and "restarted" in cell.error
    assert "`context` reloaded" in cell.error
    cell = await sb.run("len(context)", timeout=10, max_output_chars=1000)
    assert cell.error is None and cell.value == str(len(TEXT))
    assert launcher.prepared == 1 and len(launcher.transports) == 2   # no second upload


async def test_text_stream_ignores_foreign_lines_and_catches_corruption(
        remote: Any, tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, mode="text", max_piece=50)
    sb = await remote(launcher)
    t = launcher.transports[0]
    assert isinstance(t, LocalStreamTransport)
    # a login banner or an echo of our own input is not part of the stream
    t.injected_lines += ["Welcome to the sandbox\n", "W:AAAA\n"]
    cell = await sb.run("v = 41\nv + 1", timeout=10, max_output_chars=1000)
    assert cell.error is None and cell.value == "42"
    t.injected_lines.append("R:%%not base64%%\n")
    cell = await sb.run("v", timeout=10, max_output_chars=1000)
    assert cell.restarted and "corrupted" in (cell.error or "")
    assert "v" in cell.lost_variables
    cell = await sb.run("len(context)", timeout=10, max_output_chars=1000)
    assert cell.value == str(len(TEXT))


@pytest.mark.parametrize("mode", MODES)
async def test_remote_process_killed_mid_cell(remote: Any, tmp_path: Path, mode: str) -> None:
    launcher = LocalLauncher(tmp_path, mode=mode)
    running = Running()
    sb = await remote(launcher, on_call=running)
    await sb.run("keep = 'me'", timeout=10, max_output_chars=1000)
    pid = sb.session.info["pid"]
    task = asyncio.create_task(sb.run("llm_query('running')\nimport time\ntime.sleep(30)",
                                      timeout=60, max_output_chars=1000))
    await running.wait()
    os.kill(pid, signal.SIGKILL)
    cell = await asyncio.wait_for(task, 20)
    assert cell.restarted and "died while running this cell" in (cell.error or "")
    assert "SIGKILL" in (cell.error or ""), cell.error
    assert cell.lost_variables == ["keep"]
    cell = await sb.run("len(context)", timeout=10, max_output_chars=1000)
    assert cell.value == str(len(TEXT))
    assert sb.session.info["pid"] != pid


@pytest.mark.parametrize("mode", ["raw", "text"])
async def test_kill_stops_a_busy_supervised_worker(remote: Any, tmp_path: Path,
                                                   mode: str) -> None:
    """Providers with no per-process kill rely on closing stdin: the supervisor kills the
    worker's process group even mid-cell, including processes the cell started."""
    launcher = LocalLauncher(tmp_path, mode=mode)
    running = Running()
    sb = await remote(launcher, on_call=running)
    cell = await sb.run("import subprocess\np = subprocess.Popen(['sleep', '60'])\np.pid",
                        timeout=10, max_output_chars=100)
    child = int(cell.value or 0)
    worker = sb.session.info["pid"]
    task = asyncio.create_task(sb.run("llm_query('running')\nwhile True: pass", timeout=60,
                                      max_output_chars=100))
    await running.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(worker) and await wait_dead(child)


async def test_cell_timeout_interrupt_over_remote_stream(remote: Any, tmp_path: Path) -> None:
    sb = await remote(LocalLauncher(tmp_path, mode="text"))
    await sb.run("kept = 5", timeout=10, max_output_chars=100)
    cell = await sb.run("while True: pass", timeout=0.5, max_output_chars=100)
    assert cell.timed_out and "KeyboardInterrupt" in (cell.error or "")
    cell = await sb.run("kept", timeout=10, max_output_chars=100)
    assert cell.value == "5"


# ---------------------------------------------------------------- cleanup
async def test_cleanup_when_prepare_fails(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, fail_prepare=True)
    sb = RemoteSandbox(launcher)
    with pytest.raises(SandboxError, match="could not be prepared: RuntimeError: quota"):
        await sb.start(payload_for(tmp_path), handler)
    assert launcher.cleaned == 1 and not (tmp_path / "remote").exists()


async def test_cleanup_when_worker_cannot_start(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, python=str(tmp_path / "no-such-python"))
    sb = RemoteSandbox(launcher)
    with pytest.raises(SandboxError, match="could not start the sandbox worker"):
        await sb.start(payload_for(tmp_path), handler)
    assert launcher.cleaned == 1


async def test_cleanup_when_worker_dies_at_start(tmp_path: Path) -> None:
    fake = tmp_path / "fakepython"
    fake.write_text("#!/bin/sh\necho 'cannot load worker' >&2\nexit 3\n")
    fake.chmod(0o755)
    launcher = LocalLauncher(tmp_path, mode="text", python=str(fake))
    sb = RemoteSandbox(launcher, start_timeout=10)
    with pytest.raises(SandboxError, match="did not start") as info:
        await sb.start(payload_for(tmp_path), handler)
    assert "cannot load worker" in str(info.value)
    assert launcher.cleaned == 1


async def test_cleanup_on_cancellation_during_start(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, prepare_delay=30)
    sb = RemoteSandbox(launcher)
    task = asyncio.create_task(sb.start(payload_for(tmp_path), handler))
    await asyncio.wait_for(launcher.preparing.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert launcher.cleaned == 1


async def test_cleanup_on_cancellation_during_a_cell(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    running = Running()
    pids: list[int] = []

    async def use() -> None:
        async with RemoteSandbox(launcher) as sb:
            await sb.start(payload_for(tmp_path), running)
            pids.append(sb.session.info["pid"])
            await sb.run("llm_query('running')\nimport time\ntime.sleep(60)", timeout=120,
                         max_output_chars=100)

    task = asyncio.create_task(use())
    await running.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert launcher.cleaned == 1
    assert await wait_dead(pids[0])


async def test_close_is_idempotent_and_run_after_close_fails(remote: Any,
                                                             tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    sb = await remote(launcher)
    await asyncio.gather(sb.close(), sb.close())
    await sb.close()
    assert launcher.cleaned == 1
    with pytest.raises(SandboxError, match="closed"):
        await sb.run("1", timeout=5, max_output_chars=10)


async def test_missing_context_file(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    p = ContextPayload(path=str(tmp_path / "nope"), kind="text", sha256="0", size_bytes=0)
    with pytest.raises(SandboxError, match="context file not found"):
        await RemoteSandbox(launcher).start(p, handler)
    assert launcher.prepared == 0


# ---------------------------------------------------------------- factory and SDKs
def test_make_remote_sandbox_kinds() -> None:
    for kind in KINDS:
        sb = make_remote_sandbox(kind, start_timeout=5)
        assert isinstance(sb, RemoteSandbox) and sb.kind == kind and sb.start_timeout == 5
        assert isinstance(sb, Sandbox)
    with pytest.raises(ValueError, match="unknown remote sandbox kind"):
        make_remote_sandbox("prime")


@pytest.mark.parametrize("kind,module", [("modal", "modal"), ("e2b", "e2b"),
                                         ("daytona", "daytona")])
async def test_missing_sdk_is_a_clear_error(tmp_path: Path, kind: str, module: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)   # import fails as if not installed
    sb = make_remote_sandbox(kind)
    with pytest.raises(SandboxError, match=rf"pip install 'recursa\[{kind}\]'"):
        await sb.start(payload_for(tmp_path), handler)
