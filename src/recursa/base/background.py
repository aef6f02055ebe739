"""The one owner of what recursa keeps running in the background of a process (the process's
runtime, in the words of issue 22; not the llama.cpp runtime of `recursa runtime`).

Besides a run's own sandbox and model calls, recursa keeps a few things alive between runs,
because starting them per run would cost more than the run: spare sandbox workers and their
spawner thread (sandbox/local.py), zygote fork servers and their control threads
(sandbox/forkserver.py), the cgroup parent of the sandboxes (sandbox/treelimits.py) and the
thread that watches trees without one, the uids leased to workers (sandbox/uids.py), the sweep of
stale temporary directories (tempdirs.py), and llama-server processes (models/llama_server.py).

Each of them is a `Part` that attaches itself to `BACKGROUND` when it first starts something;
importing recursa starts nothing, registers no `atexit` handler and no fork hook. The first
attach installs one exit handler (the fallback: a program that never calls `shutdown()` still
leaves no process behind) and one fork hook (a forked child drops the parent's parts, which are
not its own to stop).

A program that wants recursa's background gone at a moment of its choosing (a server shutting
down, a test, a notebook) calls `recursa.base.background.shutdown()`; the next run starts what it needs
again. `start()` does the work a first run would otherwise do on its way (the temp dir sweep)
and installs the hooks, so a long-lived program can pay it up front:

    from recursa.base import background
    background.start()
    try:
        ...   # runs
    finally:
        background.shutdown()

or `with background.BACKGROUND: ...`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Protocol

log = logging.getLogger("recursa.background")

# shutdown order: what uses a resource stops before the resource goes
SERVERS = 0      # llama-server processes
WORKERS = 10     # spare workers, then the zygotes that fork runs
WATCHERS = 20    # threads that watch trees and sweep temp dirs
GROUPS = 30      # cgroups and uid leases, once nothing runs in them


class Part(Protocol):
    """Something recursa keeps running in the background of the process."""

    def shutdown(self) -> None:
        """Stop it and release what it holds; it may start again on its next use."""

    def after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's processes, threads and locks (they are the
        parent's to stop), without stopping them."""


class Background:
    """The background parts of this process, stopped together by `shutdown()`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[int, tuple[int, Part]] = {}    # id(part) -> (rank, part)
        self._hooked = False
        self.exiting = False       # True from the exit handler on: parts start nothing new

    def attach(self, part: Part, rank: int) -> None:
        """Called by a part when it first starts something (idempotent)."""
        with self._lock:
            self._hook()
            self._parts.setdefault(id(part), (rank, part))

    def start(self) -> Background:
        """Install the exit handler and fork hook and sweep the temp dir's stale directories
        now (a first run would otherwise do it); returns it."""
        with self._lock:
            self._hook()
        from recursa.base.tempdirs import start_sweep
        start_sweep()
        return self

    def shutdown(self) -> None:
        """Stop every part (servers, workers, watchers, then groups). Never raises. The parts
        stay known (for the fork hook) and start again on their next use."""
        for part in self.parts():
            try:
                part.shutdown()
            except Exception:   # one part's failure must not keep the others running
                log.warning("recursa: could not stop %r", part, exc_info=True)

    def parts(self) -> list[Part]:
        """The attached parts, in shutdown order (tests, diagnostics)."""
        with self._lock:
            return [p for _, p in sorted(self._parts.values(), key=lambda rp: rp[0])]

    def __enter__(self) -> Background:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- hooks (lock held)
    def _hook(self) -> None:
        if self._hooked:
            return
        self._hooked = True     # a forked child inherits the hooks, and this flag with them
        atexit.register(self._at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _at_exit(self) -> None:
        self.exiting = True
        self.shutdown()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()    # another thread may have held it at the fork
        for part in self.parts():
            try:
                part.after_fork_in_child()
            except Exception:
                pass   # nothing to report to in a fresh child; it holds the parent's copies


BACKGROUND = Background()


def start() -> Background:
    """`BACKGROUND.start()`: hooks installed and the temp dir swept now rather than on first use."""
    return BACKGROUND.start()


def shutdown() -> None:
    """`BACKGROUND.shutdown()`: stop every process and thread recursa keeps in the background."""
    BACKGROUND.shutdown()
