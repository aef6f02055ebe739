"""sandbox="daytona": one Daytona sandbox per RemoteSandbox, the worker an async session command.

Written against the Daytona SDK's async interface (`daytona>=0.100`, read from daytona
0.226.1): `AsyncDaytona().create(CreateSandboxFromImageParams(image=, network_block_all=True,
ephemeral=True, auto_stop_interval=))` (or `...FromSnapshotParams`) starts the machine,
`sandbox.fs.upload_file(local_path, remote_path)` uploads the worker, supervisor and context
once, and each incarnation is a process *session*: `process.create_session(id)`,
`process.execute_session_command(id, SessionExecuteRequest(command=, run_async=True,
suppress_input_echo=True))`, its output followed with `get_session_command_logs_async(...,
on_stdout, on_stderr)` (returns when the command ends) and input sent with
`send_session_command_input(id, cmd_id, data: str)`.

Both directions of a session command are *text* (`data: str`, decoded log chunks), so the
supervisor runs in --text mode: base64 lines both ways, and any echoed input is ignored by
prefix. Killing an incarnation is a pid-file `kill -9` of the worker's group plus
`delete_session`; `daytona.delete(sandbox)` at close removes the rest, and `ephemeral=True`
with `auto_stop_interval` is the backstop if the host dies first.

Not verified in this repository's CI (no Daytona account or network here); see docs/remote.md.
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

REMOTE_DIR = "/tmp/recursa"


class DaytonaTransport(StreamTransport):
    def __init__(self, sandbox: Any, sdk: Any, cmd: str, pidfile: str):
        super().__init__(text=True)
        self.sb = sandbox
        self.sdk = sdk
        self.cmd = cmd
        self.pidfile = pidfile
        self.session_id = f"recursa-{uuid.uuid4().hex[:12]}"
        self.cmd_id: str | None = None
        self._follower: asyncio.Task[None] | None = None

    async def _spawn(self) -> None:
        proc = self.sb.process
        await proc.create_session(self.session_id)
        req = self.sdk.SessionExecuteRequest(command=self.cmd, run_async=True,
                                             suppress_input_echo=True)
        resp = await proc.execute_session_command(self.session_id, req)
        self.cmd_id = resp.cmd_id
        self._follower = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        proc = self.sb.process
        try:
            await proc.get_session_command_logs_async(self.session_id, self.cmd_id,
                                                      self.feed_text, self.feed_stderr)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(f"the Daytona log stream failed: {type(exc).__name__}: {exc}")
        rc = None
        with contextlib.suppress(Exception):
            rc = (await proc.get_session_command(self.session_id, self.cmd_id)).exit_code
        self.feed_eof(rc)

    async def _write(self, data: bytes) -> None:
        await self.sb.process.send_session_command_input(self.session_id, self.cmd_id,
                                                         data.decode("ascii"))

    async def _terminate(self) -> None:
        with contextlib.suppress(Exception):
            await self.sb.process.exec(kill_pidfile_command(self.pidfile), timeout=15)
        with contextlib.suppress(Exception):
            await self.sb.process.delete_session(self.session_id)
        if self._follower is not None:
            self._follower.cancel()


class DaytonaLauncher:
    """Launcher for `RemoteSandbox` on Daytona; see the module docstring."""

    kind = "daytona"

    def __init__(self, image: str | None = "python:3.12-slim", *, snapshot: str | None = None,
                 network_block_all: bool = True, auto_stop_interval: int = 60,
                 ephemeral: bool = True, python: str = "python3", api_key: str | None = None,
                 api_url: str | None = None, target: str | None = None,
                 create_timeout: float = 180, limits: str | None = None,
                 create_options: dict[str, Any] | None = None):
        self.image = image
        self.snapshot = snapshot
        self.network_block_all = network_block_all
        self.auto_stop_interval = auto_stop_interval
        self.ephemeral = ephemeral
        self.python = python
        self.api_key = api_key
        self.api_url = api_url
        self.target = target
        self.create_timeout = create_timeout
        self.limits = limits
        self.create_options = dict(create_options or {})
        self.client: Any = None
        self.sb: Any = None
        self._sdk: Any = None
        net = "no network" if network_block_all else "network allowed"
        self.isolation = f"Daytona sandbox ({net}, auto-stop {auto_stop_interval} min)"

    async def prepare(self, files: dict[str, str]) -> str:
        sdk = require("daytona", "daytona", "daytona")
        self._sdk = sdk
        config = None
        if self.api_key or self.api_url or self.target:
            config = sdk.DaytonaConfig(api_key=self.api_key, api_url=self.api_url,
                                       target=self.target)
        self.client = sdk.AsyncDaytona(config)
        common: dict[str, Any] = {"network_block_all": self.network_block_all,
                                  "auto_stop_interval": self.auto_stop_interval,
                                  "ephemeral": self.ephemeral, "env_vars": {}}
        common.update(self.create_options)
        if self.snapshot:
            params = sdk.CreateSandboxFromSnapshotParams(snapshot=self.snapshot, **common)
        else:
            params = sdk.CreateSandboxFromImageParams(image=self.image, **common)
        self.sb = await self.client.create(params, timeout=self.create_timeout)
        for name, local in files.items():
            await self.sb.fs.upload_file(local, f"{REMOTE_DIR}/{name}")
        return REMOTE_DIR

    def transport(self) -> DaytonaTransport:
        pidfile = f"{REMOTE_DIR}/worker-{uuid.uuid4().hex[:8]}.pid"
        argv = worker_command(REMOTE_DIR, self.python, text=True, pidfile=pidfile,
                              limits=self.limits)
        cmd = f"cd {REMOTE_DIR} && exec " + shlex.join(argv)
        return DaytonaTransport(self.sb, self._sdk, cmd, pidfile)

    async def cleanup(self) -> None:
        sb, self.sb = self.sb, None
        client, self.client = self.client, None
        try:
            if sb is not None and client is not None:
                await client.delete(sb)
        finally:
            if client is not None:
                await client.close()
