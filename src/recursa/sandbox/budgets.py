"""One memory and process budget per run, and one per process.

Per run (`RunTree`): a top-level run's sandbox and the sandboxes of every child run under it
(`rlm_query` / `rlm_batch`, at any depth) share the run's caps, `memory_mb` and
`max_processes`, instead of each child getting caps of its own: ten children of a run capped
at 512 MB hold 512 MB together, not 5 GB. Where cgroups are usable the run has a group of its
own with those caps and its sandboxes' groups go under it, so the kernel holds the total
(treelimits.py); elsewhere the host's tree watch sums its sandboxes' resident memory. When the
run is at its cap anyway, the sandbox started last is stopped (its cell reports why and the
worker restarts), never the run's own first.

Children are admitted, not all started at once: `child_slot()` (the dispatcher takes one for
each child run) waits while the run's memory in use, plus a reserve for each child admitted in
the last seconds whose memory is not known yet, leaves no room for one more child's reserve
(the largest child of the run so far, at least a quarter of the cap, at least 64 MB). A parent
with no child running may always start one, so nested children never wait for each other in a
circle.

Per process (`HostBudget`, `HOST`): one total for every sandbox the process runs, running or
idle (a session's sandbox lives as long as the session). The totals default to what fits the
machine: three quarters of its memory (or of the host process's own cgroup limit, if lower;
RECURSA_MEMORY_TOTAL_MB overrides) and RECURSA_PROCESS_TOTAL (1024) processes; with cgroups
the process's sandbox group is capped at them, so the kernel holds them. A new run is admitted
when the memory the process's sandboxes use now, plus a reserve for each run admitted in the
last seconds, leaves room for its own reserve (a quarter of its cap, at least 64 MB). When it
does not, the registered reclaimers are asked first (`recursa serve` closes its least
recently used idle session, one at a time), then the run waits, and it fails with an error
that says what holds the memory only after `wait` seconds in which no run ended. A run's
default cap is an eighth of the total (512 MB to 4 GB).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from recursa.base.background import BACKGROUND, GROUPS
from recursa.base.types import CallHandler, SandboxError
from recursa.sandbox.treelimits import RunCgroup

log = logging.getLogger("recursa.sandbox")

MB = 1 << 20
RESERVE_MIN = 64 * MB         # a child admitted is assumed to need at least this ...
RESERVE_SHARE = 4             # ... and at least a quarter of the run's cap
YOUNG_S = 2.0                 # how long a child's reserve counts beside its measured memory
PROCESS_RESERVE = 8           # tasks a new child's worker needs (init, worker, its threads)
POLL_S = 0.2                  # how often a waiting child looks at the run's memory again
OWN_MARGIN = 4 * MB           # a sandbox's own cap sits this far under its run's


# ------------------------------------------------------------------ the process's totals
def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its own cgroup's limit when
    that is lower (a container)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    for path in _own_memory_limit_files():
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                text = f.read().strip()
            if text and text != "max":
                total = min(total, int(text))
    return total


def _own_memory_limit_files() -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        with open("/proc/self/cgroup") as f:
            for line in f.read().splitlines():
                _, ctrls, path = line.split(":", 2)
                if ctrls == "":
                    out.append(f"/sys/fs/cgroup{path}/memory.max")
                elif "memory" in ctrls.split(","):
                    out.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    return out


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        log.warning("recursa: %s=%r is not a whole number; ignored", name, raw)
        return None
    return value if value > 0 else None


def default_memory_total() -> int:
    """RECURSA_MEMORY_TOTAL_MB, else three quarters of `machine_memory()`."""
    mb = _env_int("RECURSA_MEMORY_TOTAL_MB")
    return mb * MB if mb else machine_memory() * 3 // 4


def default_process_total() -> int:
    return _env_int("RECURSA_PROCESS_TOTAL") or 1024


def default_run_memory_mb() -> int:
    """A run's memory cap when none is given: an eighth of the process's total (so eight
    runs fit at once), at least 512 MB, at most 4096 MB."""
    return max(512, min(4096, HOST.memory // 8 // MB))


def wait_seconds() -> float:
    """How long a run waits for room in the process's totals while nothing frees any
    (RECURSA_MEMORY_WAIT, default 600 s): each run that ends starts the wait again."""
    return float(_env_int("RECURSA_MEMORY_WAIT") or 600)


@dataclass(eq=False)
class Lease:
    """One open run tree's place in the process's totals: the memory and processes it was
    admitted with (counted beside what is measured while it is young) and what it uses now."""

    memory: int
    processes: int
    what: str
    usage: Callable[[], int] = lambda: 0
    since: float = field(default_factory=time.monotonic)
    released: bool = False
    measured: bool = True     # its sandboxes sit in the process's cgroup, when that measures


class HostBudget:
    """The process's totals and the open run trees admitted under them; thread-safe (runs may
    live on different event loops: `recursa serve`'s, sessions' own).

    A run is admitted when the memory its process's sandboxes use now, plus a reserve for
    each run admitted in the last seconds, leaves room for its own reserve (a quarter of its
    cap, at least 64 MB) and the processes likewise; where cgroups are usable the process's
    group is capped at the totals too, so the kernel holds them (sandbox/treelimits.py)."""

    def __init__(self, memory: int | None = None, processes: int | None = None):
        self._memory, self._processes = memory, processes
        self._lock = threading.RLock()
        self._leases: list[Lease] = []
        self._gen = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._reclaimers: list[Callable[[], Callable[[], bool] | None]] = []
        self._measure: tuple[Callable[[], int], Callable[[], int]] | None = None
        self.reclaimed = 0          # things reclaimers let go of for a waiting run

    @property
    def memory(self) -> int:
        if self._memory is None:
            self._memory = default_memory_total()
        return self._memory

    @property
    def processes(self) -> int:
        if self._processes is None:
            self._processes = default_process_total()
        return self._processes

    def configure(self, *, memory: int | None = None, processes: int | None = None) -> None:
        """Set the totals (None: back to the defaults, read again on next use)."""
        with self._lock:
            self._memory, self._processes = memory, processes
        self._wake()

    def measure_with(self, usage: Callable[[], int], processes: Callable[[], int]) -> None:
        """Read the process's sandboxes' memory and tasks from here (its cgroup parent)
        instead of summing its run trees'."""
        with self._lock:
            self._measure = (usage, processes)

    def usage(self) -> int:
        """Bytes the process's sandboxes use now."""
        with self._lock:
            measure, leases = self._measure, list(self._leases)
        if measure is not None:    # plus the runs whose sandboxes are outside its group
            return _safe(measure[0]) + sum(_safe(x.usage) for x in leases if not x.measured)
        return sum(_safe(x.usage) for x in leases)

    def tasks(self) -> int:
        with self._lock:
            measure = self._measure
        return _safe(measure[1]) if measure is not None else 0

    def committed(self) -> tuple[int, int]:
        """The open runs' admitted memory and processes (their reserves)."""
        with self._lock:
            return (sum(x.memory for x in self._leases),
                    sum(x.processes for x in self._leases))

    def open_runs(self) -> int:
        with self._lock:
            return len(self._leases)

    def add_reclaimer(self, fn: Callable[[], bool]) -> None:
        """`fn()` lets go of something that holds a run open (an idle session) and says
        whether it did; held weakly when it is a bound method (its object may go)."""
        ref: Callable[[], Callable[[], bool] | None]
        if hasattr(fn, "__self__"):
            ref = weakref.WeakMethod(fn)  # type: ignore[arg-type]
        else:
            ref = lambda: fn  # noqa: E731
        with self._lock:
            self._reclaimers.append(ref)

    def _fits(self, memory: int, processes: int) -> bool:
        now = time.monotonic()
        young = [x for x in self._leases if now - x.since < YOUNG_S]
        mem = self.usage() + sum(x.memory for x in young)
        if mem + memory > self.memory:
            return False
        if self._measure is None:
            return True
        return self.tasks() + sum(x.processes for x in young) + processes <= self.processes

    def _reclaim(self) -> bool:
        with self._lock:
            refs = list(self._reclaimers)
            self._reclaimers = [r for r in refs if r() is not None]
        for ref in refs:
            fn = ref()
            if fn is None:
                continue
            try:
                if fn():
                    self.reclaimed += 1
                    return True
            except Exception:   # a reclaimer's failure must not fail the run asking
                log.exception("recursa: a memory reclaimer failed")
        return False

    async def acquire(self, memory: int, processes: int, *, wait: float, what: str,
                      usage: Callable[[], int] = lambda: 0, measured: bool = True) -> Lease:
        """Admit a run tree whose caps are `memory` bytes and `processes` (its reserve: a
        quarter of each, at least 64 MB / PROCESS_RESERVE); `usage()`: its memory in use,
        when the process's cgroup does not measure it (`measured=False`: it never does, as
        for the wasm sandbox's host processes). See the module docstring for what happens
        when it does not fit."""
        mem = min(self.memory, max(RESERVE_MIN, memory // RESERVE_SHARE)) if memory else 0
        procs = min(self.processes, max(PROCESS_RESERVE, processes // RESERVE_SHARE)) \
            if processes else 0
        BACKGROUND.attach(self, GROUPS)     # forgotten in a forked child
        deadline = time.monotonic() + wait
        told = False
        while True:
            with self._lock:
                if self._fits(mem, procs):
                    lease = Lease(mem, procs, what, usage, measured=measured)
                    self._leases.append(lease)
                    return lease
                seen = self._gen
            reclaiming = self._reclaim()
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(self._refusal(mem, wait))
            if not told and not reclaiming:
                told = True
                log.warning("recursa: a run waits for room in this process's sandbox budget: "
                            "%s", self._state(mem))
            # a reclaimed session closes in the background: wait for its release (or for a
            # while) before asking for another, so one run does not empty the pool
            await self._changed(seen, min(left, 5.0 if reclaiming else 1.0))
            with self._lock:
                if self._gen != seen:     # a run ended: the wait starts again
                    deadline = time.monotonic() + wait

    def _state(self, memory: int) -> str:
        return (f"the {self.open_runs()} runs open in this process use "
                f"{self.usage() // MB} of its {self.memory // MB} MB, which leaves no room for "
                f"another run's {memory // MB} MB")

    def _refusal(self, memory: int, wait: float) -> str:
        return (f"no room for another run's sandbox after {wait:g} s with nothing freed: "
                f"{self._state(memory)}. Close idle sessions, lower the runs' memory, or "
                f"raise RECURSA_MEMORY_TOTAL_MB")

    def release(self, lease: Lease) -> None:
        with self._lock:
            if lease.released:
                return
            lease.released = True
            with contextlib.suppress(ValueError):
                self._leases.remove(lease)
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            self._gen += 1
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, fut)

    async def _changed(self, seen: int, timeout: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._gen != seen:
                return
            self._waiters.append((asyncio.get_running_loop(), fut))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            with self._lock:
                self._waiters = [(lp, f) for lp, f in self._waiters if f is not fut]

    def shutdown(self) -> None:
        """Nothing runs in the background: the leases go with their runs."""

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._leases, self._waiters = [], []   # the parent's runs
        self._measure = None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


HOST = HostBudget()


# ------------------------------------------------------------------ one run's tree
@dataclass(eq=False)
class Member:
    """One sandbox of a run tree."""

    name: str
    parent: Member | None                 # the sandbox whose run started this one's
    usage: Callable[[], int]              # its memory in use now (bytes)
    started: float = field(default_factory=time.monotonic)
    running: bool = False                 # its worker is up and its watch looks (may stop it)
    need: int = 0                         # stopped at the run's cap using this much: its next
                                          # cell waits until the run has that much room
    waiting: bool = False


@dataclass(eq=False)
class _Slot:
    parent: Member | None
    admitted: float = field(default_factory=time.monotonic)
    member: Member | None = None


_ids = itertools.count(1)


class RunTree:
    """The sandboxes of one top-level run, sharing its caps; see the module docstring.
    `usage()` and `processes()`: the run's memory and tasks now (the tree's cgroup's, else
    the sum over its sandboxes); `over()`: it is at its memory cap now."""

    def __init__(self, memory: int | None, processes: int | None, *,
                 usage: Callable[[], int] | None = None,
                 processes_now: Callable[[], int] | None = None,
                 under_oom: Callable[[], bool] | None = None,
                 lease: Lease | None = None, host: HostBudget | None = None):
        self.id = next(_ids)
        self.memory, self.max_processes = memory, processes
        self._group_usage, self._group_procs, self._under_oom = usage, processes_now, under_oom
        self.lease, self._host = lease, host
        self.group: RunCgroup | None = None   # the run's control group, when it has one
        self._lock = threading.RLock()        # _room (held) asks usage() (takes it too)
        self.members: list[Member] = []
        self._slots: list[_Slot] = []
        self.peak_child = 0              # the most memory a child of this run used so far
        self.waited = 0                  # children that waited for room
        self.stopped = 0                 # sandboxes stopped at the run's cap
        self.closed = False
        self._over_since: float | None = None

    # -- members
    def attach(self, group: RunCgroup) -> None:
        """The run's control group: the kernel holds its caps and measures it."""
        self.group = group
        self._group_usage, self._group_procs = group.resident, group.processes
        self._under_oom = group.under_oom if group.kind == "cgroup1" else None

    def join(self, member: Member) -> None:
        with self._lock:
            self.members.append(member)
            slot = _SLOT.get()
            if slot is not None and slot.member is None and slot in self._slots:
                slot.member = member

    def leave(self, member: Member) -> None:
        with self._lock:
            if member in self.members:
                self.members.remove(member)
            for s in self._slots:
                if s.member is member:
                    self.peak_child = max(self.peak_child, _safe(member.usage))

    def usage(self) -> int:
        if self._group_usage is not None:
            return self._group_usage()
        with self._lock:
            members = list(self.members)
        return sum(_safe(m.usage) for m in members)

    def processes(self) -> int:
        return self._group_procs() if self._group_procs is not None else 0

    def over(self, grace: float = 0.5) -> bool:
        """At the run's memory cap now, for `grace` seconds (v1 cgroups: the tree waits at
        its limit; the watch: the sum of its sandboxes is past it, at once)."""
        if not self.memory:
            return False
        if self._under_oom is not None:
            now = time.monotonic()
            if not self._under_oom():
                self._over_since = None
                return False
            if self._over_since is None:
                self._over_since = now
            return now - self._over_since >= grace
        return self._group_usage is None and self.usage() > self.memory

    def victim(self) -> Member | None:
        """The sandbox to stop at the cap: the running one started last (never the run's
        first while a child runs; one still starting waits at the cap for memory to free)."""
        with self._lock:
            running = [m for m in self.members if m.running]
        return running[-1] if running else None

    def stopped_one(self, member: Member, used: int) -> None:
        """`member` was stopped at the cap while it used `used` bytes."""
        self.stopped += 1
        self._over_since = None
        member.need = max(member.need, used, RESERVE_MIN)

    async def wait_for_room(self, member: Member) -> None:
        """Before a cell of a sandbox stopped at the run's cap: wait until the run has the
        room it was using, while another sandbox of the run may still free some."""
        need, member.need = member.need, 0
        if not need or not self.memory:
            return
        member.waiting = True
        try:
            while self.usage() + need > self.memory:
                with self._lock:
                    others = [m for m in self.members if m is not member and m.running
                              and not m.waiting]
                if not others:        # nobody left who could free memory: try anyway
                    return
                await asyncio.sleep(POLL_S)
        finally:
            member.waiting = False

    # -- admitting children
    def reserve(self) -> int:
        assert self.memory
        return min(self.memory, max(RESERVE_MIN, self.memory // RESERVE_SHARE,
                                    self.peak_child))

    def _room(self, parent: Member | None) -> bool:
        """Whether one more child of `parent` may start now (lock held)."""
        if not any(s.parent is parent for s in self._slots):
            return True      # every parent may run one child: nested waits never circle
        if self.memory:
            now = time.monotonic()
            young = sum(1 for s in self._slots
                        if now - s.admitted < YOUNG_S
                        and (s.member is None or _safe(s.member.usage) < self.reserve()))
            for m in self.members:     # children of the run so far: the next one's reserve
                if m.parent is not None:
                    self.peak_child = max(self.peak_child, _safe(m.usage))
            if self.usage() + (young + 1) * self.reserve() > self.memory:
                return False
        if self.max_processes and self._group_procs is not None:
            live = sum(1 for s in self._slots if s.member is None)
            if self.processes() + (live + 1) * PROCESS_RESERVE > self.max_processes:
                return False
        return True

    @contextlib.asynccontextmanager
    async def slot(self, parent: Member | None) -> AsyncIterator[None]:
        """Hold a place for one child run of `parent` while it runs."""
        waited = False
        while True:
            with self._lock:
                if self._room(parent):
                    s = _Slot(parent)
                    self._slots.append(s)
                    break
            waited = True
            await asyncio.sleep(POLL_S)      # memory in use changes without an event
        if waited:
            self.waited += 1
        token = _SLOT.set(s)
        try:
            yield
        finally:
            _SLOT.reset(token)
            with self._lock:
                self._slots.remove(s)
                if s.member is not None:
                    self.peak_child = max(self.peak_child, _safe(s.member.usage))

    def close(self) -> None:
        self.closed = True
        if self.lease is not None and self._host is not None:
            self._host.release(self.lease)


def _safe(fn: Callable[[], int]) -> int:
    try:
        return int(fn())
    except Exception:
        return 0


# ------------------------------------------------------------------ where a run is
# The run tree and sandbox whose REPL made the current call (set by LocalSandbox around its
# handler), so a child run's sandbox, started from that call, joins the same tree.
CURRENT: contextvars.ContextVar[tuple[RunTree, Member] | None] = contextvars.ContextVar(
    "recursa_run_tree", default=None)
_SLOT: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "recursa_child_slot", default=None)


def current() -> tuple[RunTree, Member] | None:
    """The run tree, and the sandbox in it, whose REPL made the current call, unless that run
    has closed: a child run started now belongs to it."""
    cur = CURRENT.get()
    return cur if cur is not None and not cur[0].closed else None


async def enter(tree: RunTree, member: Member, child: bool) -> None:
    """A sandbox joins its run's tree; a child run's waits until the run has room for one
    (the kernel would refuse its namespaces' memory at the run's cap)."""
    tree.join(member)
    if child:
        member.need = RESERVE_MIN
        await tree.wait_for_room(member)


def in_tree(handler: CallHandler, tree: RunTree, member: Member) -> CallHandler:
    """`handler`, with a child run started by one of its calls joining this run's tree."""
    async def handle(kind: str, args: dict[str, Any]) -> Any:
        token = CURRENT.set((tree, member))
        try:
            return await handler(kind, args)
        finally:
            CURRENT.reset(token)
    return handle


@contextlib.asynccontextmanager
async def child_slot() -> AsyncIterator[None]:
    """Wait for room in the current run's budget for one child run and hold it while the
    child runs (nothing to wait for outside a local sandbox's call)."""
    cur = current()
    if cur is None:
        yield
        return
    tree, member = cur
    async with tree.slot(member):
        yield
