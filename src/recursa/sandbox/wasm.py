"""WasmSandbox (`sandbox="wasm"`): the worker in CPython compiled to WebAssembly (WASI).

The same worker protocol as every other sandbox, over the stdin/stdout of a small host process
(wasm_host.py) that runs the guest under wasmtime. Isolation is by construction, not by
kernel features: the guest sees two directories (`/recursa`, read-only: the worker and the
context; `/workspace`, its cwd, read-write), an environment of HOME and TMPDIR only, no
sockets, no processes, no signals. Calls to models (llm_query, rlm_query, ...) go to the host
through the protocol, as in the local sandbox. The runtime is fetched once
(`python -m recursa.sandbox.wasm_runtime`); see docs/sandbox.md for what it has and costs.

Caps: `memory_mb` bounds the guest's linear memory (MemoryError inside); a cell past its
time is stopped by stopping the worker (the guest cannot be interrupted while it computes,
so its variables are lost, as the cell's message says); `disk_mb` bounds the workspace: over
it the worker is stopped and the workspace emptied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from recursa.base.tempdirs import owned_tempdir
from recursa.base.types import CallHandler, Cell, ContextPayload, SandboxError
from recursa.sandbox import wasm_runtime
from recursa.sandbox.protocol import WORKER_PATH
from recursa.sandbox.session import WorkerSession, startable
from recursa.sandbox.transport import SubprocessTransport

log = logging.getLogger("recursa.sandbox")

WASM32_MAX_MB = 4096   # a wasm32 memory cannot grow past 4 GiB


def _used_bytes(root: str, limit: int) -> int:
    """Bytes under `root`, counted until `limit` is passed (no need to count further)."""
    total, stack = 0, [root]
    while stack and total <= limit:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    else:
                        total += e.stat(follow_symlinks=False).st_size
    return total


class WasmSandbox:
    """A `Sandbox` whose worker is CPython on WASI under wasmtime, in a host subprocess."""

    kind = "wasm"

    def __init__(self, *, memory_mb: int | None = 2048, disk_mb: int | None = 1024,
                 start_timeout: float = 60.0, interrupt_grace: float = 0.5,
                 disk_poll: float = 0.25, cache_dir: str | os.PathLike[str] | None = None):
        if memory_mb is not None and not 16 <= memory_mb <= WASM32_MAX_MB:
            raise ValueError(f"memory_mb must be between 16 and {WASM32_MAX_MB} "
                             f"(a wasm32 memory), not {memory_mb}")
        if disk_mb is not None and disk_mb < 1:
            raise ValueError(f"disk_mb must be at least 1, not {disk_mb}")
        self.memory_mb = memory_mb
        self.disk_mb = disk_mb
        self.start_timeout = start_timeout
        self.interrupt_grace = interrupt_grace
        self.disk_poll = disk_poll
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        mem = f"{memory_mb} MB memory" if memory_mb else "no memory cap"
        self.isolation = (f"WebAssembly (WASI CPython {wasm_runtime.PYTHON_WASI.python} under "
                          f"wasmtime: no network, only /workspace and a read-only /recursa, "
                          f"{mem})")
        self.session: WorkerSession | None = None
        self.workspace: str | None = None
        self._dir: str | None = None
        self._wasm: Path | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    def _argv(self) -> list[str]:
        assert self._dir is not None and self.workspace is not None and self._wasm is not None
        argv = [sys.executable, "-I", str(wasm_runtime.HOST_PATH), "--wasm", str(self._wasm),
                "--dir", f"{self._dir}:/recursa", "--dir", f"{self.workspace}:/workspace:rw",
                "--env", "HOME=/workspace", "--env", "TMPDIR=/workspace",
                "--parent", str(os.getpid())]
        if self.memory_mb:
            argv += ["--memory-mb", str(self.memory_mb)]
        return [*argv, "--", "-I", "-S", "/recursa/wasm_guest.py"]

    def _transport(self) -> SubprocessTransport:
        # The host process gets a bare environment too: it needs none of the caller's.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        return SubprocessTransport(self._argv(), env=env, cwd=self.workspace)

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        started, self._started = self._started, True     # a failed start is still a start
        context = startable(started, self._closed, payload.path)
        try:
            self._wasm = await asyncio.to_thread(wasm_runtime.verified_wasm, self.cache_dir)
            await asyncio.to_thread(wasm_runtime.precompile, self._wasm)   # a new wasmtime
            self._dir = owned_tempdir("recursa-wasm-")
            self.workspace = owned_tempdir("recursa-wasmws-")
            for src, name in ((WORKER_PATH, "worker.py"),
                              (wasm_runtime.GUEST_PATH, "wasm_guest.py"), (context, "context")):
                dst = os.path.join(self._dir, name)
                try:
                    os.link(src, dst)
                except OSError:   # another file system, or links refused: copy
                    await asyncio.to_thread(shutil.copyfile, src, dst)
            pyc = await asyncio.to_thread(wasm_runtime.worker_pyc, self._wasm, WORKER_PATH)
            if pyc is not None:
                os.mkdir(os.path.join(self._dir, "__pycache__"))
                shutil.copyfile(pyc, os.path.join(self._dir, "__pycache__", pyc.name))
            self.session = WorkerSession(
                self._transport, context_path="/recursa/context", kind=payload.kind,
                handler=handler, start_timeout=self.start_timeout,
                functions=payload.functions, interrupt_grace=self.interrupt_grace)
            await self.session.start()
            if self.disk_mb:
                self._watcher = asyncio.create_task(self._watch_disk(self.session))
        except BaseException:
            await self.close()
            raise

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self.session is None or self._closed:
            raise SandboxError("the sandbox is closed" if self._closed
                               else "the sandbox was not started")
        return await self.session.run(code, timeout=timeout, max_output_chars=max_output_chars)

    async def _watch_disk(self, session: WorkerSession) -> None:
        """WASI has no file-size limit: the host measures the workspace and stops the worker
        (emptying the workspace) when it passes `disk_mb`."""
        assert self.disk_mb and self.workspace
        limit = self.disk_mb << 20
        while True:
            await asyncio.sleep(self.disk_poll)
            if session.starting:
                continue
            try:
                if await asyncio.to_thread(_used_bytes, self.workspace, limit) > limit:
                    when = "" if session.in_cell else "between cells, "
                    await session.abort(f"{when}its workspace exceeded the {self.disk_mb} MB "
                                        f"limit, so it was stopped and the workspace emptied")
                    await asyncio.to_thread(self._empty_workspace)
            except Exception as exc:   # keep watching; the next cell reports a broken worker
                log.warning("watching the wasm sandbox's workspace failed: %r", exc)

    def _empty_workspace(self) -> None:
        assert self.workspace
        for e in os.scandir(self.workspace):
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)

    async def close(self) -> None:
        self._closed = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        session, self.session = self.session, None
        try:
            if session is not None:
                await session.close()
        finally:
            for d in (self._dir, self.workspace):
                if d:
                    shutil.rmtree(d, ignore_errors=True)
            self._dir = self.workspace = None

    async def __aenter__(self) -> WasmSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
