"""sandbox="e2b": one E2B sandbox per RemoteSandbox, the worker a background command.

Written against the E2B SDK's async interface (`e2b>=2`, read from e2b 2.63.0):
`AsyncSandbox.create(template=, timeout=, allow_internet_access=False, envs={})` starts the
machine, `files.write()` uploads the worker, supervisor and context once, and each
incarnation is `commands.run(cmd, background=True, stdin=True, on_stdout=, on_stderr=,
timeout=0)` with `commands.send_stdin(pid, data)` for input.

E2B delivers stdout to the callback as *decoded UTF-8 text* (invalid bytes replaced), so it
cannot carry the binary frames as they are. The supervisor runs in --text mode and the stream
travels as base64 lines both ways (about 4/3 the bytes), decoded by `StreamTransport`. Killing
an incarnation is `handle.kill()` (SIGKILL to the supervisor; the worker dies with its parent)
plus a pid-file `kill -9` of the worker's group; `sandbox.kill()` at close removes the rest,
and the sandbox `timeout` is the backstop if the host dies first.

Not verified in this repository's CI (no E2B account or network here); see docs/remote.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import uuid
from typing import Any

from recursa.sandbox.remote.base import (
    StreamTransport,
    kill_pidfile_command,
    require,
    worker_command,
)

REMOTE_DIR = "/tmp/recursa"   # the default user cannot write to /


class E2BTransport(StreamTransport):
    def __init__(self, sandbox: Any, cmd: str, pidfile: str, workdir: str):
        super().__init__(text=True)
        self.sbx = sandbox
        self.cmd = cmd
        self.pidfile = pidfile
        self.workdir = workdir
        self._handle: Any = None
        self._waiter: asyncio.Task[None] | None = None

    async def _spawn(self) -> None:
        self._handle = await self.sbx.commands.run(
            self.cmd, background=True, stdin=True, cwd=self.workdir, envs={},
            on_stdout=self.feed_text, on_stderr=self.feed_stderr, timeout=0)
        self._waiter = asyncio.create_task(self._wait())

    async def _wait(self) -> None:
        rc: int | None = None
        try:
            result = await self._handle.wait()
            rc = getattr(result, "exit_code", None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # CommandExitException carries the status of a non-zero exit; anything else is a
            # broken connection.
            rc = getattr(exc, "exit_code", None)
            if rc is None:
                self._fail(f"the E2B command stream failed: {type(exc).__name__}: {exc}")
        self.feed_eof(rc)

    async def _write(self, data: bytes) -> None:
        await self.sbx.commands.send_stdin(self._handle.pid, data)

    async def _terminate(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                await self._handle.kill()
        with contextlib.suppress(Exception):
            await self.sbx.commands.run(kill_pidfile_command(self.pidfile), timeout=15)
        if self._waiter is not None:
            self._waiter.cancel()


class E2BLauncher:
    """Launcher for `RemoteSandbox` on E2B; see the module docstring."""

    kind = "e2b"

    def __init__(self, template: str | None = None, *, timeout: int = 3600,
                 allow_internet_access: bool = False, python: str = "python3",
                 api_key: str | None = None, limits: str | None = None,
                 create_options: dict[str, Any] | None = None):
        self.template = template
        self.timeout = timeout
        self.allow_internet_access = allow_internet_access
        self.python = python
        self.api_key = api_key
        self.limits = limits
        self.create_options = dict(create_options or {})
        self.sbx: Any = None
        net = "internet allowed" if allow_internet_access else "no internet"
        self.isolation = f"E2B sandbox ({net}, Firecracker microVM, lifetime {timeout} s)"

    async def prepare(self, files: dict[str, str]) -> str:
        e2b = require("e2b", "e2b", "e2b")
        opts: dict[str, Any] = {"timeout": self.timeout, "envs": {},
                                "allow_internet_access": self.allow_internet_access}
        if self.template:
            opts["template"] = self.template
        if self.api_key:
            opts["api_key"] = self.api_key
        opts.update(self.create_options)
        self.sbx = await e2b.AsyncSandbox.create(**opts)
        for name, local in files.items():
            with open(local, "rb") as f:
                await self.sbx.files.write(f"{REMOTE_DIR}/{name}", f)
        await self.sbx.commands.run(f"mkdir -p {REMOTE_DIR}/workspace", timeout=30)
        return REMOTE_DIR

    def transport(self) -> E2BTransport:
        pidfile = f"{REMOTE_DIR}/worker-{uuid.uuid4().hex[:8]}.pid"
        argv = worker_command(REMOTE_DIR, self.python, text=True, pidfile=pidfile,
                              limits=self.limits)
        # `commands.run` goes through `bash -l -c`: exec so the supervisor is the command.
        return E2BTransport(self.sbx, "exec " + shlex.join(argv), pidfile,
                            f"{REMOTE_DIR}/workspace")

    async def cleanup(self) -> None:
        sbx, self.sbx = self.sbx, None
        if sbx is not None:
            await sbx.kill()
