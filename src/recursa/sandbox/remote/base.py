"""RemoteSandbox: the same worker and protocol as the local sandbox, in a remote process.

A remote sandbox is three steps, each behind a `Launcher`:

1. `prepare(files)` once: start the machine (container / cloud sandbox) and upload the worker,
   the supervisor and the context file to one remote directory. The context is never sent
   again, not even when the worker restarts.
2. `transport()` per worker incarnation: an unstarted `Transport` whose `start()` runs the
   worker remotely with its stdin/stdout attached to the host (no port, no tunnel), and whose
   `kill()` stops that incarnation.
3. `cleanup()` once, always: on close, on a failed start, on cancellation.

`WorkerSession` (shared with the local sandbox) does everything else: init, cells, calls back
to the host, timeouts, restarts. Sub-calls therefore still run on the host.

`StreamTransport` adapts the push-style streams SDKs offer (an output callback or an async
iterator plus a "write stdin" call) to the pull-style `Transport`, optionally decoding the
supervisor's text framing for SDKs whose stdout is text, not bytes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import importlib
import logging
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from recursa.base.extras import MissingExtra
from recursa.base.types import CallHandler, Cell, ContextPayload, SandboxError
from recursa.sandbox.protocol import WORKER_PATH
from recursa.sandbox.session import WorkerSession, startable
from recursa.sandbox.transport import Transport, describe_exit

log = logging.getLogger("recursa.sandbox")

SUPERVISOR_PATH = Path(__file__).resolve().with_name("supervisor.py")
MAX_LINE = 4 * 1024 * 1024       # a text-framed line longer than this is a broken stream
CHUNK = 512 * 1024               # raw bytes per W: line (SDK request bodies stay small)


def require(module: str, kind: str, extra: str) -> ModuleType:
    """Import a provider SDK lazily; a missing one is a SandboxError that says what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(extra, f"sandbox={kind!r}", module=module, detail=str(exc)) from None


def worker_command(remote_dir: str, python: str = "python3", *, supervised: bool = True,
                   text: bool = False, pidfile: str | None = None,
                   limits: str | None = None) -> list[str]:
    """argv that runs the uploaded worker (under the uploaded supervisor) in `remote_dir`."""
    worker = [python, "-I", "-S", f"{remote_dir}/worker.py"]
    if limits:
        worker += ["--limits", limits]
    if not supervised:
        return worker
    sup = [python, "-I", "-S", f"{remote_dir}/supervisor.py"]
    if text:
        sup.append("--text")
    if pidfile:
        sup += ["--pidfile", pidfile]
    return [*sup, "--", *worker]


def kill_pidfile_command(pidfile: str) -> str:
    """Shell line that SIGKILLs the worker's process group recorded by the supervisor."""
    return (f"p=$(cat {pidfile} 2>/dev/null) && [ -n \"$p\" ] && "
            f"{{ kill -9 -- -$p 2>/dev/null; kill -9 $p 2>/dev/null; }}; true")


@runtime_checkable
class Launcher(Protocol):
    """Starts, reaches and removes one remote machine for one RemoteSandbox."""

    kind: str
    isolation: str

    async def prepare(self, files: dict[str, str]) -> str:
        """Start the remote machine and upload `files` ({remote name: local path}) into one
        directory; return that directory's remote path."""
        ...

    def transport(self) -> Transport:
        """A fresh, unstarted transport for one worker incarnation."""
        ...

    async def cleanup(self) -> None:
        """Stop and remove everything `prepare` made. Idempotent; safe after a partial
        prepare."""
        ...


class StreamTransport:
    """A `Transport` over a process a provider SDK runs remotely.

    Subclasses implement `_spawn` (start the process and arrange for its output to reach
    `feed` / `feed_text`, `feed_stderr`, and finally `feed_eof(returncode)`), `_write` (bytes
    to its stdin) and `_terminate` (stop it). With `text=True` the remote side is the
    supervisor in --text mode and its line framing is decoded here.
    """

    def __init__(self, *, text: bool = False, stderr_tail: int = 8192):
        self.text = text
        self.returncode: int | None = None
        self._buf = bytearray()
        self._more = asyncio.Event()
        self._eof = False
        self._error: str | None = None
        self._line = ""
        self._tail_size = stderr_tail
        self._tail = ""
        self._started = False
        self._killed = False

    # ------------------------------------------------------------ subclass hooks
    async def _spawn(self) -> None:
        raise NotImplementedError

    async def _write(self, data: bytes) -> None:
        raise NotImplementedError

    async def _terminate(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ fed by the subclass
    def feed(self, data: bytes | bytearray | str) -> None:
        """Raw output bytes (text mode: a piece of the supervisor's line stream)."""
        if self.text:
            self.feed_text(data if isinstance(data, str) else bytes(data).decode(
                "ascii", errors="replace"))
            return
        if isinstance(data, str):   # an SDK that decoded what should have been bytes
            data = data.encode("utf-8", errors="surrogateescape")
        self._buf += data
        self._more.set()

    def feed_text(self, text: str) -> None:
        """A piece of the supervisor's --text output; pieces may split lines anywhere."""
        self._line += text
        while True:
            nl = self._line.find("\n")
            if nl < 0:
                break
            line, self._line = self._line[:nl].rstrip("\r"), self._line[nl + 1:]
            self._on_line(line)
        if len(self._line) > MAX_LINE:
            self._fail(f"its output stream was corrupted (a line of over {MAX_LINE} bytes)")

    def _on_line(self, line: str) -> None:
        if line.startswith("R:"):
            try:
                self._buf += base64.b64decode(line[2:], validate=True)
            except (binascii.Error, ValueError):
                self._fail("its output stream was corrupted (an undecodable line)")
                return
            self._more.set()
        elif line.startswith("X:"):
            with contextlib.suppress(ValueError):
                self.returncode = int(line[2:])
        elif line.strip():   # banners, echoed input: not ours; keep for diagnostics
            self._keep_tail("stdout: " + line[:500] + "\n")

    def feed_stderr(self, data: bytes | str) -> None:
        text = data if isinstance(data, str) else data.decode("utf-8", errors="replace")
        self._keep_tail(text)

    def feed_eof(self, returncode: int | None = None) -> None:
        # An X: line (the worker's own status) beats the supervisor's exit status.
        if returncode is not None and self.returncode is None:
            self.returncode = returncode
        self._eof = True
        self._more.set()

    def _fail(self, why: str) -> None:
        if self._error is None:
            self._error = why
        self._more.set()

    def _keep_tail(self, text: str) -> None:
        self._tail = (self._tail + text)[-self._tail_size:]

    # ------------------------------------------------------------ Transport
    async def start(self) -> None:
        self._started = True
        try:
            await self._spawn()
        except (OSError, SandboxError):
            raise
        except Exception as exc:   # an SDK error: the session reports it as "did not start"
            raise OSError(f"{type(exc).__name__}: {exc}") from exc

    async def send(self, data: bytes) -> None:
        if self._killed or self._eof or not self._started:
            raise ConnectionError("worker is not running")
        if self.text:
            lines = [b"W:" + base64.b64encode(data[i:i + CHUNK]) + b"\n"
                     for i in range(0, len(data), CHUNK)]
            payload = b"".join(lines)
        else:
            payload = data
        try:
            await self._write(payload)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ConnectionError(f"worker is gone: {type(exc).__name__}: {exc}") from None

    async def receive(self, n: int) -> bytes:
        while True:
            if self._error is not None:
                # A corrupted stream cannot be trusted from here on, buffered bytes included.
                # The session treats a non-EOF transport error as a dead worker and says why.
                raise ConnectionError(self._error)
            if len(self._buf) >= n:
                break
            if self._eof or self._killed:
                raise EOFError("worker closed its output")
            self._more.clear()
            await self._more.wait()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        self._more.set()
        if not self._started:
            return
        try:
            await asyncio.wait_for(self._terminate(), 30)
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # the machine's cleanup is the backstop
            log.debug("stopping a remote worker failed: %r", exc)

    async def wait_exit(self, timeout: float) -> int | None:
        """Give a dying process a moment to report its exit status (for the message)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._eof and asyncio.get_running_loop().time() < deadline:
            self._more.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), max(0.0, deadline -
                                       asyncio.get_running_loop().time()))
        return self.returncode

    def diagnostics(self) -> str:
        text = self._error or describe_exit(self.returncode)
        tail = self._tail.strip()
        if tail:
            text += "; its last error output was:\n" + tail[-2000:]
        return text


class RemoteSandbox:
    """A `Sandbox` whose worker runs in a remote process reached through a `Launcher`."""

    def __init__(self, launcher: Launcher, *, start_timeout: float = 120.0,
                 interrupt_grace: float = 2.0):
        self.launcher = launcher
        self.kind = launcher.kind
        self.isolation = launcher.isolation
        self.start_timeout = start_timeout
        self.interrupt_grace = interrupt_grace
        self.remote_dir: str | None = None
        self._session: WorkerSession | None = None
        self._started = False
        self._closed = False
        self._closing: asyncio.Task[None] | None = None

    @property
    def session(self) -> WorkerSession | None:
        return self._session

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        started, self._started = self._started, True     # a failed start is still a start
        path = startable(started, self._closed, payload.path)
        try:
            try:
                self.remote_dir = await self.launcher.prepare({
                    "worker.py": str(WORKER_PATH),
                    "supervisor.py": str(SUPERVISOR_PATH),
                    "context": str(path.resolve()),
                })
            except SandboxError:
                raise
            except Exception as exc:   # SDK errors (auth, quota, image) in one wording
                raise SandboxError(f"the {self.kind} sandbox could not be prepared: "
                                   f"{type(exc).__name__}: {exc}") from exc
            self._session = WorkerSession(
                self.launcher.transport, context_path=f"{self.remote_dir}/context",
                kind=payload.kind, handler=handler, start_timeout=self.start_timeout,
                functions=payload.functions,
                interrupt_grace=self.interrupt_grace)
            await self._session.start()
        except BaseException:
            # Also on cancellation: a cloud sandbox left running costs money.
            await self.close()
            raise

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        if self._session is None or self._closed:
            raise SandboxError("the sandbox was not started" if not self._closed
                               else "the sandbox is closed")
        return await self._session.run(code, timeout=timeout, max_output_chars=max_output_chars)

    async def close(self) -> None:
        # One shielded task does the work, so a second cancellation cannot cut cleanup short
        # and concurrent close() calls wait for the same cleanup.
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.close()
        except Exception as exc:
            log.warning("closing the %s sandbox's worker failed: %r", self.kind, exc)
        finally:
            try:
                await self.launcher.cleanup()
            except Exception as exc:
                log.warning("cleaning up the %s sandbox failed: %r (see docs/remote.md to "
                            "remove it by hand)", self.kind, exc)

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
