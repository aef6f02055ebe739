"""A real multi-node Ray cluster on this machine for the tests: `ray start --head` and worker
nodes, each a separate `ray start --block` process in a session of its own (so a test can kill
one node, raylet, workers and all, with one killpg). Small --num-cpus each; the head has no
CPUs, so every task runs on a worker node. Nodes import recursa and tests/ from PYTHONPATH.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_env() -> dict[str, str]:
    path = os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")])
    # token auth (Ray's default for new clusters) for every node and the driver alike
    return {**os.environ, "PYTHONPATH": path.strip(os.pathsep), "RAY_AUTH_MODE": "token",
            "RAY_USAGE_STATS_ENABLED": "0"}


class LocalCluster:
    """head + `workers` nodes of `cpus` CPUs each; `address` for ray.init."""

    def __init__(self, workers: int = 2, cpus: int = 1):
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = tempfile.mkdtemp(prefix="rc")     # short: Ray's socket paths have a limit
        self.cpus = cpus
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs = Path(self.temp) / "node-logs"
        self.logs.mkdir()
        try:
            self.head = self._start(["--head", f"--port={self.port}", "--num-cpus=0",
                                     "--include-dashboard=false", f"--temp-dir={self.temp}",
                                     "--disable-usage-stats"], "head")
            self._wait_for(self.head, "head")
            for _ in range(workers):
                self.add_worker()
        except BaseException:
            self.shutdown()
            raise

    def _start(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        # no nice of its own (run the tests under nice): Ray gives a node 30 s to register,
        # which a busy 2-core machine barely meets at the default priority
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start",
               "--node-ip-address=127.0.0.1", "--block", *args]
        log = open(self.logs / f"{name}-{len(self.procs)}.log", "wb")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cluster_env(),
                             start_new_session=True)
        self.procs.append(p)
        return p

    def _wait_for(self, p: subprocess.Popen[bytes], name: str, timeout: float = 120) -> None:
        log = self.logs / f"{name}-{self.procs.index(p)}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"ray node {name} exited: {log.read_text()[-2000:]}")
            if b"block forever" in log.read_bytes():
                return
            time.sleep(0.5)
        raise RuntimeError(f"ray node {name} did not start in {timeout}s")

    def add_worker(self, tries: int = 2) -> subprocess.Popen[bytes]:
        for attempt in range(tries):
            p = self._start([f"--address={self.address}", f"--num-cpus={self.cpus}"],
                            "worker")
            try:
                self._wait_for(p, "worker")
            except RuntimeError:
                self.kill(p)
                if attempt == tries - 1:
                    raise
                continue
            self.workers.append(p)
            return p
        raise AssertionError("unreachable")

    def wait_nodes(self, ray: Any, n: int, timeout: float = 60) -> None:
        """Until `n` nodes (head included) are alive in the cluster."""
        deadline = time.monotonic() + timeout
        while sum(nd["Alive"] for nd in ray.nodes()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {sum(nd['Alive'] for nd in ray.nodes())} of {n} "
                                   "ray nodes are alive")
            time.sleep(0.5)

    def kill(self, p: subprocess.Popen[bytes]) -> None:
        """SIGKILL one node: its `ray start`, raylet and worker processes (one session)."""
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def shutdown(self) -> None:
        for p in reversed(self.procs):
            self.kill(p)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:       # "pid (comm) state ppid ...": comm may hold spaces
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if _ppid(int(d)) == pid:
                    out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def kill_node_of_worker(worker_pid: int, sessions: set[int]) -> int | None:
    """SIGKILL the node whose raylet started Ray worker `worker_pid` (Linux /proc): the raylet's
    `ray start` session (one of `sessions`, the cluster's worker nodes) and the raylet's worker
    processes, which Ray puts in process groups of their own. Returns the session, or None if
    the worker does not belong to one of `sessions`."""
    raylet = _ppid(worker_pid)
    session = os.getpgid(raylet)
    if session not in sessions:
        return None
    workers = _children(raylet)
    os.killpg(session, signal.SIGKILL)
    for w in workers:
        try:
            os.kill(w, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return session
