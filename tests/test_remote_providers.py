"""The Modal, E2B and Daytona adapters against local fakes of their SDKs.

Each fake implements only the calls recursa makes, with the shapes read from the SDK sources
(modal 1.6.4, e2b 2.63.0, daytona 0.226.1): bytes streams for Modal's exec, decoded-text
callbacks for E2B and Daytona. "Remote" processes run locally, so these tests check the
adapters' sequencing (upload once, stream both ways, exit status, kill, cleanup) with the real
worker and supervisor. They do not show that the real services behave like the fakes: that is
documented in docs/remote.md as not verified in this repository's CI.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import hashlib
import itertools
import os
import shutil
import signal
import types
from pathlib import Path
from typing import Any

import pytest

from recursa.base.types import ContextPayload
from recursa.sandbox.local import base_python
from recursa.sandbox.remote import RemoteSandbox, make_remote_sandbox

PY = base_python()
TEXT = "one two three\n" * 100


def payload_for(tmp_path: Path) -> ContextPayload:
    path = tmp_path / "context.txt"
    path.write_text(TEXT, encoding="utf-8")
    raw = path.read_bytes()
    return ContextPayload(path=str(path), kind="text", sha256=hashlib.sha256(raw).hexdigest(),
                          size_bytes=len(raw))


async def handler(kind: str, args: dict[str, Any]) -> Any:
    return f"LLM[{args.get('prompt')}]"


class Machine:
    """What a fake remote machine did: processes, uploads, whether it was removed."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[asyncio.subprocess.Process] = []
        self.uploads: list[str] = []
        self.create_opts: dict[str, Any] = {}
        self.removed = False

    def path(self, p: str) -> str:
        return p.replace("/workspace", str(self.root / "workspace"))

    async def spawn(self, argv: list[str], cwd: str | None = None) -> asyncio.subprocess.Process:
        (self.root / "workspace").mkdir(exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            *[self.path(a) for a in argv], stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=self.path(cwd) if cwd else None, env={"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
            start_new_session=True)
        self.procs.append(proc)
        return proc

    def upload(self, local: Any, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(local, str | Path):
            shutil.copyfile(local, remote)
        else:
            Path(remote).write_bytes(local.read())
        self.uploads.append(os.path.basename(remote))

    async def remove(self) -> None:
        self.removed = True
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


async def _text_pump(stream: asyncio.StreamReader, cb: Any) -> None:
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := await stream.read(777):
        r = cb(dec.decode(chunk))
        if asyncio.iscoroutine(r):
            await r


# ---------------------------------------------------------------- fake modal
def fake_modal(m: Machine) -> types.ModuleType:
    mod = types.ModuleType("modal")

    def aio(fn: Any) -> Any:
        return types.SimpleNamespace(aio=fn)

    class Stream:
        def __init__(self, s: asyncio.StreamReader):
            self.s = s

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> bytes:
            chunk = await self.s.read(1000)
            if not chunk:
                raise StopAsyncIteration
            return chunk

    class Stdin:
        def __init__(self, w: asyncio.StreamWriter):
            self.w = w
            self.drain = aio(self._drain)

        def write(self, data: bytes) -> None:
            assert isinstance(data, bytes | bytearray) and len(data) <= 2 * 1024 * 1024
            self.w.write(data)

        def write_eof(self) -> None:
            self.w.close()

        async def _drain(self) -> None:
            await self.w.drain()

    class Proc:
        def __init__(self, p: asyncio.subprocess.Process):
            self.stdout, self.stderr = Stream(p.stdout), Stream(p.stderr)  # type: ignore[arg-type]
            self.stdin = Stdin(p.stdin)  # type: ignore[arg-type]
            self.wait = aio(p.wait)

    class Sandbox:
        def __init__(self) -> None:
            self.filesystem = types.SimpleNamespace(copy_from_local=aio(self._copy))
            self.exec = aio(self._exec)
            self.terminate = aio(m.remove)

        async def _copy(self, local: str, remote: str) -> None:
            m.upload(local, remote)

        async def _exec(self, *argv: str, text: bool = True, workdir: str | None = None,
                        **kw: Any) -> Proc:
            assert text is False or argv[0] in ("sh", "mkdir")
            return Proc(await m.spawn(list(argv), workdir))

    async def create(**opts: Any) -> Sandbox:
        m.create_opts = opts
        return Sandbox()

    async def lookup(name: str, create_if_missing: bool = False) -> str:
        return f"app:{name}"

    mod.Sandbox = types.SimpleNamespace(create=aio(create))  # type: ignore[attr-defined]
    mod.App = types.SimpleNamespace(lookup=aio(lookup))  # type: ignore[attr-defined]
    mod.Image = types.SimpleNamespace(  # type: ignore[attr-defined]
        debian_slim=lambda python_version: f"debian_slim:{python_version}",
        from_registry=lambda ref: f"registry:{ref}")
    return mod


# ---------------------------------------------------------------- fake e2b
def fake_e2b(m: Machine) -> types.ModuleType:
    mod = types.ModuleType("e2b")

    class CommandExitException(Exception):
        def __init__(self, exit_code: int):
            super().__init__(f"exit {exit_code}")
            self.exit_code = exit_code

    class Handle:
        def __init__(self, p: asyncio.subprocess.Process, on_out: Any, on_err: Any):
            self.p, self.pid = p, p.pid
            self._pumps = [asyncio.create_task(_text_pump(p.stdout, on_out)),  # type: ignore[arg-type]
                           asyncio.create_task(_text_pump(p.stderr, on_err))]  # type: ignore[arg-type]

        async def wait(self) -> Any:
            await asyncio.gather(*self._pumps)
            rc = await self.p.wait()
            if rc != 0:
                raise CommandExitException(rc)
            return types.SimpleNamespace(exit_code=rc)

        async def kill(self) -> bool:
            with contextlib.suppress(ProcessLookupError):
                self.p.kill()
            return True

    class Commands:
        def __init__(self) -> None:
            self.by_pid: dict[int, asyncio.subprocess.Process] = {}

        async def run(self, cmd: str, background: bool = False, stdin: bool = False,
                      cwd: str | None = None, envs: Any = None, on_stdout: Any = None,
                      on_stderr: Any = None, timeout: float | None = 60) -> Any:
            p = await m.spawn(["bash", "-c", cmd], cwd)
            self.by_pid[p.pid] = p
            h = Handle(p, on_stdout or (lambda s: None), on_stderr or (lambda s: None))
            if background:
                assert stdin and timeout == 0   # no stdin / a 60 s stream cap would break us
                return h
            return await h.wait()

        async def send_stdin(self, pid: int, data: str | bytes) -> None:
            w = self.by_pid[pid].stdin
            assert w is not None
            w.write(data.encode() if isinstance(data, str) else data)
            await w.drain()

    class AsyncSandbox:
        def __init__(self) -> None:
            self.commands = Commands()
            self.files = types.SimpleNamespace(write=self._write)

        async def _write(self, path: str, data: Any) -> None:
            m.upload(data, path)

        async def kill(self) -> None:
            await m.remove()

        @staticmethod
        async def create(**opts: Any) -> AsyncSandbox:
            m.create_opts = opts
            return AsyncSandbox()

    mod.AsyncSandbox = AsyncSandbox  # type: ignore[attr-defined]
    return mod


# ---------------------------------------------------------------- fake daytona
def fake_daytona(m: Machine) -> types.ModuleType:
    mod = types.ModuleType("daytona")
    ids = itertools.count(1)

    class Process:
        def __init__(self) -> None:
            self.cmds: dict[str, asyncio.subprocess.Process] = {}
            self.sessions: dict[str, list[str]] = {}

        async def create_session(self, sid: str) -> None:
            assert sid not in self.sessions
            self.sessions[sid] = []

        async def execute_session_command(self, sid: str, req: Any) -> Any:
            assert req.run_async and req.suppress_input_echo
            p = await m.spawn(["sh", "-c", req.command])
            cid = f"cmd{next(ids)}"
            self.cmds[cid] = p
            self.sessions[sid].append(cid)
            return types.SimpleNamespace(cmd_id=cid)

        async def get_session_command_logs_async(self, sid: str, cid: str, on_stdout: Any,
                                                 on_stderr: Any) -> None:
            p = self.cmds[cid]
            await asyncio.gather(_text_pump(p.stdout, on_stdout),  # type: ignore[arg-type]
                                 _text_pump(p.stderr, on_stderr))  # type: ignore[arg-type]

        async def get_session_command(self, sid: str, cid: str) -> Any:
            return types.SimpleNamespace(exit_code=await self.cmds[cid].wait())

        async def send_session_command_input(self, sid: str, cid: str, data: str) -> None:
            assert isinstance(data, str)
            w = self.cmds[cid].stdin
            assert w is not None
            w.write(data.encode())
            await w.drain()

        async def delete_session(self, sid: str) -> None:
            for cid in self.sessions.pop(sid, []):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.cmds[cid].pid, signal.SIGKILL)

        async def exec(self, command: str, cwd: str | None = None, env: Any = None,
                       timeout: int | None = None) -> Any:
            p = await m.spawn(["sh", "-c", command])
            await p.communicate()
            return types.SimpleNamespace(exit_code=p.returncode)

    class Sandbox:
        def __init__(self) -> None:
            self.process = Process()
            self.fs = types.SimpleNamespace(upload_file=self._upload)

        async def _upload(self, src: str, dst: str) -> None:
            m.upload(src, dst)

    class AsyncDaytona:
        def __init__(self, config: Any = None):
            self.closed = False

        async def create(self, params: Any, timeout: float = 60) -> Sandbox:
            m.create_opts = dict(params)
            return Sandbox()

        async def delete(self, sb: Any) -> None:
            await m.remove()

        async def close(self) -> None:
            self.closed = True

    def params(**kw: Any) -> dict[str, Any]:
        return kw

    mod.AsyncDaytona = AsyncDaytona  # type: ignore[attr-defined]
    mod.DaytonaConfig = params  # type: ignore[attr-defined]
    mod.CreateSandboxFromImageParams = params  # type: ignore[attr-defined]
    mod.CreateSandboxFromSnapshotParams = params  # type: ignore[attr-defined]
    mod.SessionExecuteRequest = types.SimpleNamespace  # type: ignore[attr-defined]
    return mod


FAKES = {"modal": fake_modal, "e2b": fake_e2b, "daytona": fake_daytona}
NO_NETWORK = {"modal": ("block_network", True), "e2b": ("allow_internet_access", False),
              "daytona": ("network_block_all", True)}


@pytest.fixture(params=sorted(FAKES))
def provider(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    kind = request.param
    m = Machine(tmp_path / "machine")
    m.root.mkdir()
    monkeypatch.setitem(__import__("sys").modules, kind, FAKES[kind](m))
    # the worker learns its context path over the stream, so the remote directory itself
    # is moved under the fake machine's root
    module = __import__(f"recursa.sandbox.remote.{kind}", fromlist=["REMOTE_DIR"])
    monkeypatch.setattr(module, "REMOTE_DIR", str(m.root / "recursa"))
    return kind, m


async def test_provider_adapter_end_to_end(provider: Any, tmp_path: Path) -> None:
    kind, m = provider
    sb = make_remote_sandbox(kind, python=PY)
    assert isinstance(sb, RemoteSandbox)
    await sb.start(payload_for(tmp_path), handler)
    try:
        key, value = NO_NETWORK[kind]
        assert m.create_opts[key] is value
        assert sorted(m.uploads) == ["context", "supervisor.py", "worker.py"]
        cell = await sb.run("x = llm_query('q')\nprint(x * 2000)\nlen(context)", timeout=20,
                            max_output_chars=100000)
        assert cell.error is None, cell.error
        assert cell.value == str(len(TEXT)) and cell.stdout.startswith("LLM[q]LLM[q]")
        # a crash mid-cell: restarted in the same machine, context not uploaded again
        pid = sb.session.info["pid"]
        task = asyncio.create_task(sb.run("import time; time.sleep(30)", timeout=60,
                                          max_output_chars=100))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        cell = await asyncio.wait_for(task, 30)
        assert cell.restarted and "SIGKILL" in (cell.error or ""), cell.error
        cell = await sb.run("len(context)", timeout=20, max_output_chars=100)
        assert cell.value == str(len(TEXT))
        assert len(m.uploads) == 3
        # a busy cell cancelled: the incarnation is killed, the sandbox stays usable
        pid = sb.session.info["pid"]
        task = asyncio.create_task(sb.run("while True: pass", timeout=60, max_output_chars=10))
        await asyncio.sleep(0.3)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(100):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 0)
                await asyncio.sleep(0.05)
                continue
            break
        else:
            raise AssertionError("the cancelled worker is still running")
        cell = await sb.run("1 + 1", timeout=20, max_output_chars=100)
        assert cell.value == "2"
    finally:
        await sb.close()
    assert m.removed
    for p in m.procs:   # nothing the sandbox started outlives close()
        await asyncio.wait_for(p.wait(), 10)


async def test_provider_cleanup_when_worker_cannot_start(provider: Any,
                                                         tmp_path: Path) -> None:
    kind, m = provider
    sb = make_remote_sandbox(kind, python="/nonexistent/python3", start_timeout=15)
    with pytest.raises(Exception, match="did not start|could not start"):
        await sb.start(payload_for(tmp_path), handler)
    assert m.removed
