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

Budgets (budgets.py), as for the local sandbox: a top-level run's sandbox commits its cap
against the process's totals (`HOST`, waiting for room); a child run's sandbox joins the run's
tree, so the run's sandboxes share its cap: a child's guest memory is capped at the run's,
children wait for room (`child_slot`), and when the host processes' resident memory summed
over the run passes its cap, the sandbox started last is stopped. There are no cgroups here:
the host watches the resident memory of each wasm host process (treelimits.WATCH).
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
from recursa.sandbox import budgets, wasm_runtime
from recursa.sandbox.budgets import HOST, MB, Member, RunTree
from recursa.sandbox.protocol import WORKER_PATH
from recursa.sandbox.session import WorkerSession, startable
from recursa.sandbox.transport import SubprocessTransport
from recursa.sandbox.treelimits import WATCH

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
        # the run tree this sandbox shares its caps with (budgets.py): its own when it is a
        # top-level run's, else the one of the run whose REPL started this child run
        self._tree: RunTree | None = None
        self._owns_tree = False
        self._member: Member | None = None
        self._guest_mb = memory_mb       # the guest's cap: at most its run's
        self._transport_now: SubprocessTransport | None = None
        self._watch_key: int | None = None
        self._started = False
        self._closed = False

    def _argv(self) -> list[str]:
        assert self._dir is not None and self.workspace is not None and self._wasm is not None
        argv = [sys.executable, "-I", str(wasm_runtime.HOST_PATH), "--wasm", str(self._wasm),
                "--dir", f"{self._dir}:/recursa", "--dir", f"{self.workspace}:/workspace:rw",
                "--env", "HOME=/workspace", "--env", "TMPDIR=/workspace",
                "--parent", str(os.getpid())]
        if self._guest_mb:
            argv += ["--memory-mb", str(self._guest_mb)]
        return [*argv, "--", "-I", "-S", "/recursa/wasm_guest.py"]

    def _transport(self) -> SubprocessTransport:
        # The host process gets a bare environment too: it needs none of the caller's.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        self._transport_now = SubprocessTransport(self._argv(), env=env, cwd=self.workspace,
                                                  on_start=self._watch_memory)
        return self._transport_now

    def _watch_memory(self, pid: int) -> None:
        """Measure a new incarnation's resident memory (its run's cap is held by _watch)."""
        if self._watch_key is not None:
            WATCH.unwatch(self._watch_key)
        self._watch_key = WATCH.watch(1 << 62, lambda _rss: None, root=pid)

    def _memory_now(self) -> int:
        return WATCH.rss(self._watch_key) if self._watch_key is not None else 0

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        started, self._started = self._started, True     # a failed start is still a start
        context = startable(started, self._closed, payload.path)
        try:
            tree, member = await self._join_tree()
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
                handler=budgets.in_tree(handler, tree, member),
                start_timeout=self.start_timeout, functions=payload.functions,
                interrupt_grace=self.interrupt_grace)
            await budgets.enter(tree, member, child=not self._owns_tree)
            await self.session.start()
            self._watcher = asyncio.create_task(self._watch(self.session))
        except BaseException:
            await self.close()
            raise

    async def _join_tree(self) -> tuple[RunTree, Member]:
        """Join the run tree of the run whose REPL started this sandbox's run (a child run),
        or open one of this sandbox's own (a top-level run), committing its cap against the
        process's totals (waiting for room)."""
        cur = budgets.current()
        parent: Member | None = None
        if cur is not None:
            self._tree, parent = cur
        else:
            mem = min(self.memory_mb * MB, HOST.memory) if self.memory_mb else None
            self._tree = RunTree(mem, None, host=HOST)
            self._owns_tree = True
            if mem:
                self._tree.lease = await HOST.acquire(
                    mem, 0, wait=budgets.wait_seconds(), what=self.isolation,
                    usage=self._tree.usage, measured=False)
        tree = self._tree
        if tree.memory and self.memory_mb:
            self._guest_mb = max(16, min(self.memory_mb, tree.memory // MB))
        self._member = Member(name=f"wasm sandbox {id(self):x}", parent=parent,
                              usage=self._memory_now)
        return tree, self._member

    def _leave_tree(self) -> None:
        tree, self._tree = self._tree, None
        if tree is None:
            return
        if self._member is not None:
            tree.leave(self._member)
        if self._owns_tree:
            tree.close()

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self.session is None or self._closed:
            raise SandboxError("the sandbox is closed" if self._closed
                               else "the sandbox was not started")
        if self._tree is not None and self._member is not None and self._member.need:
            await self._tree.wait_for_room(self._member)
        return await self.session.run(code, timeout=timeout, max_output_chars=max_output_chars)

    def _run_memory_reason(self) -> str:
        tree = self._tree
        assert tree is not None and tree.memory
        return (f"the run it belongs to reached its {tree.memory // MB} MB memory limit (host "
                f"watch), which the run's sandbox and its child runs' share, so this sandbox, "
                f"the one started last, was stopped")

    async def _watch(self, session: WorkerSession) -> None:
        """WASI has no file-size limit: the host measures the workspace and stops the worker
        (emptying the workspace) when it passes `disk_mb`. And the run's sandboxes together
        at the run's memory cap: the one started last is stopped (budgets.py)."""
        limit = self.disk_mb << 20 if self.disk_mb else 0
        member = self._member
        try:
            while True:
                await asyncio.sleep(self.disk_poll)
                transport = self._transport_now
                up = not (session.starting or transport is None
                          or transport.returncode is not None)
                if member is not None:     # only a running guest is stopped at the cap
                    member.running = up
                if not up:
                    continue
                await self._check(session, member, limit)
        finally:
            if member is not None:
                member.running = False

    async def _check(self, session: WorkerSession, member: Member | None, limit: int) -> None:
        when = "" if session.in_cell else "between cells, "
        tree = self._tree
        try:
            if tree is not None and member is not None and tree.over() \
                    and tree.victim() is member:
                tree.stopped_one(member, self._memory_now())
                await session.abort(when + self._run_memory_reason())
                return
            if limit:
                assert self.workspace
                if await asyncio.to_thread(_used_bytes, self.workspace, limit) > limit:
                    await session.abort(f"{when}its workspace exceeded the {self.disk_mb} "
                                        f"MB limit, so it was stopped and the workspace "
                                        f"emptied")
                    await asyncio.to_thread(self._empty_workspace)
        except Exception as exc:   # keep watching; the next cell reports a broken worker
            log.warning("watching the wasm sandbox's limits failed: %r", exc)

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
            if self._watch_key is not None:
                WATCH.unwatch(self._watch_key)
                self._watch_key = None
            self._leave_tree()
            for d in (self._dir, self.workspace):
                if d:
                    shutil.rmtree(d, ignore_errors=True)
            self._dir = self.workspace = None

    async def __aenter__(self) -> WasmSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
