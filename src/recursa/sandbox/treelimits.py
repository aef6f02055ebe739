"""Limits on a sandbox's whole process tree: memory and number of processes.

rlimits hold per process, so six children of 1.5 GB each pass a 4 GB `memory_mb` together.
Each sandbox (each run) therefore gets its own control group when the host can make one:

  * cgroup v2 (a `cgroup2` mount whose memory and pids controllers can be delegated to a
    sub-group of ours): `memory.max`, `memory.swap.max=0`, `memory.oom.group=1`, `pids.max`;
  * cgroup v1 (the `memory` and `pids` hierarchies mounted and writable):
    `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`), the OOM killer off for the group
    (`memory.oom_control`), so a tree at its limit waits to be killed whole instead of losing one
    process at random; `pids.max`.

The groups live under the host process's own group: one group per run tree (a top-level run's
sandbox and every child run's under it: `recursa-<pid>-<n>/tree-<j>`, capped at the run's
memory and processes, so they share them: sandbox/budgets.py) and one per sandbox in it
(`.../tree-<j>/run-<k>`). They are removed when the sandbox (the tree: its run) closes and at
interpreter exit, and stale ones of killed hosts are swept. The
worker joins its group itself, first thing, by writing "0" to a `cgroup.procs` file the host
opened and passed as a descriptor (inside bubblewrap /sys is not visible), so every process it
starts is counted.

Without usable cgroups (or with RECURSA_CGROUPS=0) a host thread (`TreeWatch`) sums the resident
memory of each watched tree from /proc a few times a second; over the limit, the sandbox stops
the worker and restarts it, like the disk cap. The process cap then falls back to RLIMIT_NPROC.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from recursa.base.background import BACKGROUND, GROUPS, WATCHERS

_counter = itertools.count()
_PREFIX = "recursa-"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _fields(path: str) -> dict[str, int]:
    """`key value` lines (memory.events, memory.oom_control, pids.events) as a dict."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in _read(path).splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
    return out


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root, fstype, super options) of cgroup mounts, from /proc/self/mountinfo."""
    out = []
    with contextlib.suppress(OSError):
        for line in _read("/proc/self/mountinfo").splitlines():
            left, _, right = line.partition(" - ")
            lf, rf = left.split(), right.split()
            if len(lf) >= 5 and len(rf) >= 3 and rf[0] in ("cgroup", "cgroup2"):
                out.append((lf[4].replace("\\040", " "), lf[3], rf[0], set(rf[2].split(","))))
    return out


def _own_groups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's group path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in _read("/proc/self/cgroup").splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _join(mountpoint: str, mount_root: str, path: str) -> str | None:
    if mount_root != "/" and not (path + "/").startswith(mount_root.rstrip("/") + "/"):
        return None   # our group is outside what this mount shows
    rel = path[len(mount_root.rstrip("/")):] if mount_root != "/" else path
    return mountpoint.rstrip("/") + rel.rstrip("/")


# ------------------------------------------------------------------ cgroups
@dataclass
class RunCgroup:
    """One sandbox's group (one directory per hierarchy)."""

    kind: str                      # "cgroup2" | "cgroup1"
    memory_dir: str | None
    pids_dir: str | None
    memory_bytes: int | None
    pids_max: int | None
    _base_oom: int = 0
    _base_pids: int = 0

    @property
    def dirs(self) -> list[str]:
        return list(dict.fromkeys(d for d in (self.memory_dir, self.pids_dir) if d))

    def open_procs(self) -> list[int]:
        """Write-only descriptors of each `cgroup.procs`, for the worker to join with "0"."""
        fds: list[int] = []
        try:
            for d in self.dirs:
                fds.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def add(self, pid: int) -> None:
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def _oom_count(self) -> int:
        if not self.memory_dir:
            return 0
        if self.kind == "cgroup2":
            ev = _fields(os.path.join(self.memory_dir, "memory.events"))
            return ev.get("oom_kill", 0) + ev.get("oom_group_kill", 0) + ev.get("oom", 0)
        return _fields(os.path.join(self.memory_dir, "memory.oom_control")).get("oom_kill", 0)

    def under_oom(self, directory: str | None = None) -> bool:
        """v1: the group (or a group above it) is waiting at its memory limit now (the OOM
        killer is off: the host decides what to stop)."""
        d = directory or self.memory_dir
        if self.kind != "cgroup1" or not d:
            return False
        return bool(_fields(os.path.join(d, "memory.oom_control")).get("under_oom"))

    def over_memory(self) -> bool:
        """The group hit its own memory limit since the last `rearm()` (v1: it is waiting at
        the limit now, the OOM killer being off; v2: the kernel killed the group). A run
        tree's limit reached above it is not this group's (v1 marks the groups below as
        waiting too): the tree decides which of its sandboxes stops (sandbox/budgets.py)."""
        if not self.memory_dir or not self.memory_bytes:
            return False
        if self.kind == "cgroup1" and self.under_oom() and self.memory_dir and \
                not self.under_oom(os.path.dirname(self.memory_dir)):
            return True     # waiting at its own limit, not at its run's
        return self._oom_count() > self._base_oom

    def usage(self) -> int:
        """Bytes of memory charged to the group now (0 if unknown)."""
        if not self.memory_dir:
            return 0
        name = "memory.current" if self.kind == "cgroup2" else "memory.usage_in_bytes"
        try:
            return int(_read(os.path.join(self.memory_dir, name)).strip() or 0)
        except (OSError, ValueError):
            return 0

    def resident(self) -> int:
        """Bytes the group holds that the kernel cannot simply drop: anonymous memory and
        tmpfs files (its page cache of files it read is left out: reclaimed at the limit).
        What budgets.py admits new sandboxes by."""
        if not self.memory_dir:
            return 0
        st = _fields(os.path.join(self.memory_dir, "memory.stat"))
        if self.kind == "cgroup2":
            return st.get("anon", 0) + st.get("shmem", 0) + st.get("kernel", 0)
        return st.get("total_rss", 0) + st.get("total_shmem", 0)

    def processes(self) -> int:
        """Tasks (threads count) in the group now (pids.current; 0 if unknown)."""
        if not self.pids_dir:
            return 0
        try:
            return int(_read(os.path.join(self.pids_dir, "pids.current")).strip() or 0)
        except (OSError, ValueError):
            return 0

    def pids_refused(self) -> int:
        """How many forks the process cap refused since the last `rearm()`."""
        if not self.pids_dir or not self.pids_max:
            return 0
        name = "pids.events"
        return _fields(os.path.join(self.pids_dir, name)).get("max", 0) - self._base_pids

    def rearm(self) -> None:
        self._base_oom = self._oom_count()
        if self.pids_dir and self.pids_max:
            self._base_pids = _fields(os.path.join(self.pids_dir, "pids.events")).get("max", 0)

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in _read(os.path.join(d, "cgroup.procs")).split())
        return sorted(out)

    def kill_all(self) -> None:
        for _ in range(20):   # a fork loop may add processes while we kill
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left in the group and delete it (rmdir fails while tasks remain);
        groups below it (a tree's sandboxes) first."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                for entry in os.listdir(d):
                    sub = os.path.join(d, entry)
                    if entry.startswith(("run-", "tree-")) and os.path.isdir(sub):
                        RunCgroup(self.kind, sub, None, None, None).remove()
            for attempt in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 0:
                        self.kill_all()
                    time.sleep(0.01)


class CgroupHost:
    """This process's parent group(s) for its sandboxes, one per hierarchy."""

    def __init__(self, kind: str, memory_parent: str | None, pids_parent: str | None):
        self.kind = kind
        self.memory_parent = memory_parent
        self.pids_parent = pids_parent
        self.pid = os.getpid()

    def describe(self) -> str:
        return "cgroup v2" if self.kind == "cgroup2" else "cgroup v1"

    def new_group(self, memory_bytes: int | None, pids_max: int | None, *,
                  parent: RunCgroup | None = None, tree: bool = False) -> RunCgroup:
        """A sandbox's group (under `parent`, its run tree's, if given), or with `tree` a run
        tree's group, which its sandboxes' groups go under."""
        name = f"{'tree' if tree else 'run'}-{next(_counter)}"
        mem_base = parent.memory_dir if parent is not None else self.memory_parent
        pids_base = parent.pids_dir if parent is not None else self.pids_parent
        mem = os.path.join(mem_base, name) if mem_base else None
        pids = os.path.join(pids_base, name) if pids_base else None
        g = RunCgroup(self.kind, mem, pids, memory_bytes, pids_max)
        try:
            for d in g.dirs:
                os.mkdir(d)
            if self.kind == "cgroup2":
                if tree:   # its sandboxes' groups use these controllers too
                    _write(f"{mem or pids}/cgroup.subtree_control", "+memory +pids")
                if memory_bytes:
                    _write(f"{mem}/memory.max", str(memory_bytes))
                    with contextlib.suppress(OSError):
                        _write(f"{mem}/memory.swap.max", "0")
                    if not tree:   # at a tree's limit the kernel stops one sandbox whole
                        with contextlib.suppress(OSError):
                            _write(f"{mem}/memory.oom.group", "1")
                if pids_max:
                    _write(f"{pids}/pids.max", str(pids_max))
            else:
                if memory_bytes and mem:
                    _write(f"{mem}/memory.limit_in_bytes", str(memory_bytes))
                    with contextlib.suppress(OSError):   # absent without swap accounting
                        _write(f"{mem}/memory.memsw.limit_in_bytes", str(memory_bytes))
                    _write(f"{mem}/memory.oom_control", "1")
                if pids_max and pids:
                    _write(f"{pids}/pids.max", str(pids_max))
            g.rearm()
        except OSError:
            g.remove()
            raise
        return g

    def set_totals(self, memory_bytes: int | None, pids_max: int | None) -> None:
        """The process's own caps on every sandbox it runs, on the parent group (a backstop:
        sandbox/budgets.py commits each run's caps against them before it starts)."""
        with contextlib.suppress(OSError):
            if memory_bytes and self.memory_parent:
                name = "memory.max" if self.kind == "cgroup2" else "memory.limit_in_bytes"
                _write(os.path.join(self.memory_parent, name), str(memory_bytes))
            if pids_max and self.pids_parent:
                _write(os.path.join(self.pids_parent, "pids.max"), str(pids_max))

    def remove(self) -> None:
        for d in (self.memory_parent, self.pids_parent):
            if d:
                _remove_tree(d)


def _remove_tree(parent: str) -> None:
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent):
            sub = os.path.join(parent, entry)
            if entry.startswith(("run-", "tree-")) and os.path.isdir(sub):
                RunCgroup("cgroup1", sub, None, None, None).remove()
    with contextlib.suppress(OSError):
        os.rmdir(parent)


def _sweep_stale(parent_of: str) -> None:
    """Remove groups left by hosts that were killed (their pid is gone)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent_of):
            if not entry.startswith(_PREFIX):
                continue
            try:
                pid = int(entry[len(_PREFIX):].split("-")[0])
            except ValueError:
                continue
            if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                _remove_tree(os.path.join(parent_of, entry))


def _make_parent(base: str, controllers: list[str] | None = None) -> str:
    _sweep_stale(base)
    d = os.path.join(base, f"{_PREFIX}{os.getpid()}-{os.urandom(3).hex()}")
    os.mkdir(d)
    try:
        if controllers:   # v2: let the run groups below use these controllers
            _write(os.path.join(d, "cgroup.subtree_control"),
                   " ".join("+" + c for c in controllers))
    except OSError:
        os.rmdir(d)
        raise
    return d


def _try_v2() -> CgroupHost | None:
    own = _own_groups().get("")
    if own is None:
        return None
    for mnt, root, fstype, _ in _mounts():
        if fstype != "cgroup2":
            continue
        base = _join(mnt, root, own)
        if not base:
            continue
        try:
            ctrls = set(_read(os.path.join(base, "cgroup.controllers")).split())
            if not {"memory", "pids"} <= ctrls:
                continue
            enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
            if not {"memory", "pids"} <= enabled:
                # Fails (EBUSY) if our own group holds processes: the "no internal processes"
                # rule. Then v2 is not ours to use.
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
            parent = _make_parent(base, ["memory", "pids"])
        except OSError:
            continue
        return CgroupHost("cgroup2", parent, parent)
    return None


def _try_v1() -> CgroupHost | None:
    own = _own_groups()
    found: dict[str, str] = {}
    for ctrl in ("memory", "pids"):
        if ctrl not in own:
            return None
        for mnt, root, fstype, opts in _mounts():
            if fstype == "cgroup" and ctrl in opts:
                base = _join(mnt, root, own[ctrl])
                if base and os.access(base, os.W_OK):
                    found[ctrl] = base
                    break
        if ctrl not in found:
            return None
    made: list[str] = []
    try:
        for ctrl in ("memory", "pids"):
            made.append(_make_parent(found[ctrl]))
    except OSError:
        for d in made:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        return None
    return CgroupHost("cgroup1", made[0], made[1])


_host: CgroupHost | None = None
_probed = False
_lock = threading.Lock()


def cgroup_host() -> CgroupHost | None:
    """This process's cgroup parent for sandboxes, made on first use; None when cgroups are
    not usable here or RECURSA_CGROUPS=0."""
    global _host, _probed
    with _lock:
        if _probed and (_host is None or _host.pid == os.getpid()):
            return _host
        _probed = True
        _host = None
        if os.environ.get("RECURSA_CGROUPS", "1").strip().lower() in ("0", "no", "false", "off"):
            return None
        _host = _try_v2() or _try_v1()
        if _host is not None:
            BACKGROUND.attach(_GROUPS, GROUPS)
        return _host


def _cleanup() -> None:
    global _host, _probed
    with _lock:
        host, _host, _probed = _host, None, False   # probed (and made) again on next use
    if host is not None and host.pid == os.getpid():
        host.remove()
        for d in (host.memory_parent, host.pids_parent):   # and those of killed hosts
            if d:
                _sweep_stale(os.path.dirname(d))


class _Groups:
    """The cgroup parent as a part of recursa.base.background."""

    def shutdown(self) -> None:
        _cleanup()

    def after_fork_in_child(self) -> None:
        global _host, _probed, _lock
        _lock = threading.Lock()
        _host, _probed = None, False   # the parent's groups are its own to remove


_GROUPS = _Groups()


# ------------------------------------------------------------------ the fallback watch
@dataclass
class _Watched:
    limit: int
    on_over: Callable[[int], None]
    root: int | None = None
    uid: int | None = None
    fired: bool = False
    last_rss: int = 0


@dataclass
class TreeWatch:
    """One host thread that, while anything is watched, reads /proc every `interval` s and
    sums the resident memory of each watched tree (the descendants of a pid, or every process
    of a uid of its own); over its limit, `on_over(rss)` is called once, from that thread.
    A part of recursa.base.background: `shutdown()` ends the thread, the next
    `watch()` starts it again."""

    interval: float = 0.25
    _items: dict[int, _Watched] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    _ids: itertools.count = field(default_factory=itertools.count)

    def watch(self, limit: int, on_over: Callable[[int], None], *, root: int | None = None,
              uid: int | None = None) -> int:
        with self._cond:
            key = next(self._ids)
            self._items[key] = _Watched(limit, on_over, root, uid)
            if self._thread is None or not self._thread.is_alive():
                BACKGROUND.attach(self, WATCHERS)
                self._thread = threading.Thread(target=self._run, name="recursa-treewatch",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return key

    def unwatch(self, key: int) -> None:
        with self._cond:
            self._items.pop(key, None)

    def rss(self, key: int) -> int:
        """The watched tree's resident bytes at the last look (0: not watched)."""
        with self._cond:
            w = self._items.get(key)
            return w.last_rss if w is not None else 0

    def shutdown(self) -> None:
        with self._cond:
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def after_fork_in_child(self) -> None:
        self._cond = threading.Condition()
        self._items.clear()        # the parent's sandboxes
        self._thread = None

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._items and self._thread is me:
                    self._cond.wait()
                if self._thread is not me:     # shut down
                    return
                items = list(self._items.values())
            procs = _scan(page, uids=any(w.uid is not None for w in items))
            children: dict[int, list[int]] = {}
            for pid, (ppid, _, _) in procs.items():
                children.setdefault(ppid, []).append(pid)
            for w in items:
                if w.fired:
                    continue
                if w.uid is not None:
                    rss = sum(r for _, uid, r in procs.values() if uid == w.uid)
                else:
                    rss, todo, seen = 0, [w.root], set()
                    while todo:
                        p = todo.pop()
                        if p in seen or p is None:
                            continue
                        seen.add(p)
                        rss += procs.get(p, (0, 0, 0))[2]
                        todo.extend(children.get(p, ()))
                w.last_rss = rss
                if rss > w.limit:
                    w.fired = True
                    with contextlib.suppress(Exception):
                        w.on_over(rss)
            with self._cond:
                if self._thread is me:
                    self._cond.wait(self.interval)


def _scan(page: int, *, uids: bool = True) -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, uid, resident bytes) for every process (Linux /proc); uid -1 unless
    `uids` (a stat less per process: trees watched by pid alone do not need it)."""
    out: dict[int, tuple[int, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
            uid = os.stat(f"/proc/{e}").st_uid if uids else -1
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) > 21:
            # fields after the name: state ppid ... rss is field 24 overall (index 21 here)
            out[int(e)] = (int(rest[1]), uid, int(rest[21]) * page)
    return out


WATCH = TreeWatch()


def processes_of_uid(uid: int) -> list[int]:
    """Pids of every process running as `uid` (Linux /proc)."""
    out = []
    with contextlib.suppress(OSError):
        for e in os.listdir("/proc"):
            if e.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{e}").st_uid == uid:
                        out.append(int(e))
    return sorted(out)
