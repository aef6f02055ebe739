"""A llama.cpp server process that recursa starts, owns and stops: the local model's home.

The model runs outside the host process, so a crash in native code (SIGILL on a CPU without an
instruction, SIGSEGV, the OOM killer) ends one run with a clear error instead of killing the
host or the test runner. The server listens on a Unix socket in a private (0700) directory of its
own, not on a TCP port: no port is picked and then bound later (a race in which another process
could take the port and receive our requests and token), and no other user can connect at all.
It also requires a random bearer token (passed in its environment, not on its command line).
llama.cpp listens on a Unix socket when `--host` ends in `.sock` (since March 2025, llama.cpp
PR 12613; the pinned runtime has it; a $RECURSA_LLAMA_SERVER must be that recent). It dies with the host
(PR_SET_PDEATHSIG, set from one long-lived launcher thread so that it is not tied to the
lifetime of whichever thread first asked for the model), and is stopped at interpreter exit.

One server per (binary, model file, options) per process, shared by every client and run: the
weights load once. It has several slots over one unified KV pool, and llama.cpp's host-RAM
prompt cache (`--cache-ram`): an idle slot's KV state is saved there when another request needs
the slot and restored when its prefix comes back, so a root turn after a batch of sub-calls
does not read its whole history again.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import http.client
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from recursa.base.background import BACKGROUND, SERVERS
from recursa.base.types import ModelError

_PR_SET_PDEATHSIG = 1


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ServerConfig:
    binary: str
    model: str
    n_ctx: int = 8192          # context per slot (tokens)
    slots: int = 3             # root + sub-calls in parallel without evicting each other
    threads: int = 0           # 0: every core this process may use
    cache_ram_mib: int = 2048  # host-RAM prompt cache shared by the slots
    extra_args: tuple[str, ...] = ()

    def argv(self, socket_path: str) -> list[str]:
        """The command line; llama.cpp listens on a Unix socket when `--host` ends in .sock."""
        if not socket_path.endswith(".sock"):
            raise ValueError(f"llama-server socket path must end in .sock: {socket_path}")
        threads = str(self.threads or _cpu_count())
        return [self.binary, "-m", self.model, "--host", socket_path,
                "-np", str(self.slots), "--kv-unified", "--kv-unified-per-slot", str(self.n_ctx),
                "-t", threads, "-tb", threads, "--cache-ram", str(self.cache_ram_mib),
                "--no-webui", "--jinja", "--no-warmup", *self.extra_args]


def signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _explain(returncode: int) -> str:
    if returncode == -signal.SIGILL:
        return (" The runtime uses a CPU instruction this machine does not enable: set "
                "RECURSA_CPU_PROFILE=x86-64-v2 (for the build and the runs: recursa then builds "
                "llama.cpp for an older CPU, once; `recursa runtime build` does it now), or set "
                "RECURSA_LLAMA_SERVER to a llama-server built for this machine.")
    if returncode == -signal.SIGKILL:
        return " (killed: out of memory, or by another process)"
    return ""


def _set_pdeathsig() -> None:   # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# PR_SET_PDEATHSIG fires when the *thread* that forked exits: fork from one thread that lives
# as long as the process.
_launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recursa-llama-launch")

# sun_path holds 108 bytes on Linux, 104 on macOS
_MAX_SOCKET_PATH = 100


def _private_tempdir() -> str:
    """A 0700 directory (mkdtemp's mode) short enough to hold the socket's path."""
    d = tempfile.mkdtemp(prefix="recursa-llama-")
    if len(os.fsencode(d)) + len("/llama.sock") <= _MAX_SOCKET_PATH:
        return d
    os.rmdir(d)       # a long $TMPDIR (macOS's is ~50 bytes, some are longer)
    return tempfile.mkdtemp(prefix="recursa-llama-", dir="/tmp")


def _remove_dir(path: str, owner: int) -> None:
    """Remove the server's directory, only in the process that made it: a forked child (a
    sandbox worker) that drops its copy of the registry must not delete the parent's socket
    (tempfile.TemporaryDirectory's finalizer did, and the parent's next request failed with
    ENOENT)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (the health check; runs use httpx's `uds`)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class LlamaServer:
    """One llama-server process. `start()` blocks until it serves (or raises ModelError)."""

    def __init__(self, config: ServerConfig, name: str = "local model") -> None:
        self.config = config
        self.name = name
        self.token = secrets.token_urlsafe(24)
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = _private_tempdir()
        self._cleanup = weakref.finalize(self, _remove_dir, self._dir, os.getpid())
        self.log_path = Path(self._dir) / "server.log"
        # in the server's own 0700 directory: nobody else can connect, or bind it first
        self.socket_path = str(Path(self._dir) / "llama.sock")
        self.started_s = 0.0

    @property
    def base_url(self) -> str:
        """The URL to put requests under; they go to `socket_path` (httpx: `uds=`)."""
        return "http://localhost"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 12) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [ln for ln in lines if ln.strip()][-n:]
        return "\n".join(keep)

    def death(self) -> str | None:
        """Why the process is gone (None while it runs)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        return (f"{self.name}: the llama.cpp server (pid {self.proc.pid}) died: "
                f"{signal_name(rc)}.{_explain(rc)}")

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LLAMA_API_KEY": self.token,
               # OpenMP threads spin while idle by default; on a shared 2-core box that starves
               # everything else (the sandbox, other servers) for no gain
               "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        log = open(self.log_path, "wb")
        try:
            # its own session: a Ctrl-C in the terminal (which signals the whole foreground
            # process group) cancels a question in `recursa chat`, and must not also start the
            # server's shutdown; it still dies with us (parent-death signal)
            return subprocess.Popen(self.config.argv(self.socket_path), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=_set_pdeathsig, cwd=self._dir,
                                    start_new_session=True)
        finally:
            log.close()

    def start(self, timeout: float = 300.0) -> None:
        if not Path(self.config.model).is_file():
            raise ModelError(f"{self.name}: model file not found: {self.config.model}",
                             retryable=False)
        t0 = time.monotonic()
        self.proc = _launcher.submit(self._spawn).result()
        while True:
            if (why := self.death()) is not None:
                tail = self.log_tail()
                bad_file = "failed to load model" in tail or "gguf" in tail.lower()
                hint = (f" Is {self.config.model} a complete GGUF file?" if bad_file else "")
                if "couldn't bind" in tail or "could not bind" in tail:
                    hint = (" This llama-server cannot listen on a Unix socket (llama.cpp "
                            "before March 2025?): use recursa's runtime (unset "
                            "RECURSA_LLAMA_SERVER) or a newer llama.cpp build.")
                raise ModelError(f"{why}{hint}\nserver log:\n{tail}", retryable=False)
            if self._healthy():
                self.started_s = time.monotonic() - t0
                return
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise ModelError(f"{self.name}: the llama.cpp server did not come up in "
                                 f"{timeout:.0f} s\nserver log:\n{self.log_tail()}")
            time.sleep(0.1)

    def request(self, method: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """One authorised request over the socket (status, body), for checks and tests."""
        conn = _UnixHTTPConnection(self.socket_path, timeout)
        try:
            conn.request(method, path, headers={"Authorization": f"Bearer {self.token}"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def _healthy(self) -> bool:
        try:
            return self.request("GET", "/health", timeout=2)[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._cleanup()


# ------------------------------------------------------------------ the process-wide registry
_servers: dict[ServerConfig, LlamaServer] = {}
_lock = threading.Lock()
_starting: dict[ServerConfig, threading.Lock] = {}


def get_server(config: ServerConfig, name: str = "local model") -> LlamaServer:
    """The running server for `config`, started on first use (or again after it died)."""
    with _lock:
        gate = _starting.setdefault(config, threading.Lock())
    with gate:                  # one start per config; others wait for it
        srv = _servers.get(config)
        if srv is not None and srv.alive():
            return srv
        if srv is not None:     # it died: the next run gets a fresh one
            srv.stop()
        srv = LlamaServer(config, name)
        BACKGROUND.attach(_SERVERS, SERVERS)
        srv.start()
        with _lock:
            _servers[config] = srv
        return srv


def forget(server: LlamaServer) -> None:
    with _lock:
        if _servers.get(server.config) is server:
            del _servers[server.config]


def stop_all() -> None:
    """Stop every server this process started (also `recursa.base.background.shutdown()` and exit)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.stop()


class _Servers:
    """The servers as a part of recursa.base.background."""

    def shutdown(self) -> None:
        stop_all()

    def after_fork_in_child(self) -> None:
        global _lock
        _lock = threading.Lock()
        _starting.clear()
        _servers.clear()     # the parent's servers: a child's exit must not stop them


_SERVERS = _Servers()


def running() -> list[LlamaServer]:
    with _lock:
        return [s for s in _servers.values() if s.alive()]
