"""sandbox="modal": one Modal Sandbox per RemoteSandbox, the worker run with `Sandbox.exec`.

Written against the Modal SDK's async interface (`modal>=1.0`, read from modal 1.6.4):
`modal.Sandbox.create.aio(app=, image=, block_network=True, timeout=)` starts the machine,
`sb.filesystem.copy_from_local.aio()` uploads the worker, supervisor and context once, and
each incarnation is `sb.exec.aio(..., text=False)`, whose `stdin` (`write` + `drain`) and
`stdout` (an async iterator of bytes) carry the protocol unchanged. Modal has no call to kill
one exec'd process, so the worker runs under the supervisor: closing its stdin kills the
worker's process group, and a pid-file `kill -9` is the fallback. `sb.terminate()` at close
removes everything; the sandbox `timeout` is the backstop if the host dies first.

Not verified in this repository's CI (no Modal account or network here); see docs/remote.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from recursa.sandbox.remote.base import (
    StreamTransport,
    kill_pidfile_command,
    require,
    worker_command,
)

REMOTE_DIR = "/recursa"
WRITE_CHUNK = 1024 * 1024   # Modal caps one stdin buffer at 2 MiB (16 MiB via the router)


class ModalTransport(StreamTransport):
    def __init__(self, sandbox: Any, argv: list[str], pidfile: str, workdir: str):
        super().__init__(text=False)
        self.sb = sandbox
        self.argv = argv
        self.pidfile = pidfile
        self.workdir = workdir
        self._proc: Any = None
        self._pumps: list[Any] = []

    async def _spawn(self) -> None:
        self._proc = await self.sb.exec.aio(*self.argv, text=False, workdir=self.workdir)
        self._pumps = [asyncio.create_task(self._pump_out()),
                       asyncio.create_task(self._pump_err())]

    async def _pump_out(self) -> None:
        try:
            async for chunk in self._proc.stdout:
                self.feed(chunk)
            rc = await self._proc.wait.aio()
        except Exception as exc:
            self._fail(f"the Modal output stream failed: {type(exc).__name__}: {exc}")
            rc = None
        self.feed_eof(rc)

    async def _pump_err(self) -> None:
        with contextlib.suppress(Exception):
            async for chunk in self._proc.stderr:
                self.feed_stderr(chunk)

    async def _write(self, data: bytes) -> None:
        for i in range(0, len(data), WRITE_CHUNK):
            self._proc.stdin.write(data[i:i + WRITE_CHUNK])
            await self._proc.stdin.drain.aio()

    async def _terminate(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(Exception):   # EOF: the supervisor kills the worker
                self._proc.stdin.write_eof()
                await self._proc.stdin.drain.aio()
        with contextlib.suppress(Exception):
            p = await self.sb.exec.aio("sh", "-c", kill_pidfile_command(self.pidfile))
            await p.wait.aio()
        for task in self._pumps:
            task.cancel()


class ModalLauncher:
    """Launcher for `RemoteSandbox` on Modal; see the module docstring."""

    kind = "modal"

    def __init__(self, image: Any = None, *, app_name: str = "recursa-sandbox",
                 python_version: str = "3.12", python: str = "python3",
                 block_network: bool = True, timeout: int = 3600,
                 cpu: float | None = None, memory_mb: int | None = None,
                 region: str | None = None, limits: str | None = None,
                 create_options: dict[str, Any] | None = None):
        self.image = image
        self.app_name = app_name
        self.python_version = python_version
        self.python = python
        self.block_network = block_network
        self.timeout = timeout
        self.cpu = cpu
        self.memory_mb = memory_mb
        self.region = region
        self.limits = limits
        self.create_options = dict(create_options or {})
        self.sb: Any = None
        self._n = 0
        net = "no network" if block_network else "network allowed"
        self.isolation = f"Modal sandbox ({net}, gVisor container, lifetime {timeout} s)"

    def _image(self, modal: Any) -> Any:
        if self.image is None:
            return modal.Image.debian_slim(python_version=self.python_version)
        if isinstance(self.image, str):
            return modal.Image.from_registry(self.image)
        return self.image

    async def prepare(self, files: dict[str, str]) -> str:
        modal = require("modal", "modal", "modal")
        app = await modal.App.lookup.aio(self.app_name, create_if_missing=True)
        opts: dict[str, Any] = {"app": app, "image": self._image(modal),
                                "block_network": self.block_network, "timeout": self.timeout}
        if self.cpu is not None:
            opts["cpu"] = self.cpu
        if self.memory_mb is not None:
            opts["memory"] = self.memory_mb
        if self.region is not None:
            opts["region"] = self.region
        opts.update(self.create_options)
        self.sb = await modal.Sandbox.create.aio(**opts)
        for name, local in files.items():
            await self.sb.filesystem.copy_from_local.aio(local, f"{REMOTE_DIR}/{name}")
        p = await self.sb.exec.aio("mkdir", "-p", "/workspace")
        await p.wait.aio()
        return REMOTE_DIR

    def transport(self) -> ModalTransport:
        self._n += 1
        pidfile = f"/tmp/recursa-worker-{uuid.uuid4().hex[:8]}.pid"
        argv = worker_command(REMOTE_DIR, self.python, pidfile=pidfile, limits=self.limits)
        return ModalTransport(self.sb, argv, pidfile, "/workspace")

    async def cleanup(self) -> None:
        sb, self.sb = self.sb, None
        if sb is not None:
            await sb.terminate.aio()
