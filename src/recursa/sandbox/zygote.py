"""recursa sandbox zygote: a fork server that starts one isolated worker per run.

A standalone program (standard library only), started once per sandbox configuration inside
one bubblewrap sandbox as root with CAP_SYS_ADMIN, CAP_SETUID/SETGID, CAP_SETPCAP, CAP_KILL,
CAP_NET_ADMIN and CAP_DAC_READ_SEARCH only (no user namespace; bubblewrap also sets
no_new_privs). It imports the worker once; each run is then a fork, so starting an isolated worker costs a few milliseconds
of CPU instead of a fresh bubblewrap, interpreter and imports (~90 ms).

Each run still gets what a worker of its own bubblewrap gets, and no view of another run:
  * its own mount namespace: its workspace at /workspace and its context directory read-only
    at /recursa/ctx (both from /recursa/runs/<name>/), a fresh size-capped tmpfs at /tmp, and
    /recursa/runs (every run's directories) unmounted. With "disk_bytes" the workspace is a
    size-capped tmpfs the zygote mounts over the run's ws directory in its own namespace at the
    run's first spawn (so the kernel enforces the cap, and a restarted worker of the same run
    finds its files); the host removing the run's directory detaches it;
  * its own pid namespace (a small init is its pid 1, the worker pid 2; a fresh /proc),
    network namespace
    (loopback only), IPC, UTS and cgroup namespaces, and its own /dev/pts (devpts instance);
  * its own control group when the host made one (the worker joins it before anything else);
  * its own unprivileged uid: after opening its context the worker empties its capability
    bounding set and setuid()s, exactly like a worker started on its own.
No user code ever runs in the zygote or before the uid drop.

Without root (--userns): bubblewrap puts the zygote in a user namespace of its own (uid 0 there,
the host user outside, with only CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SETPCAP and CAP_SETFCAP over
its own namespaces). A run gets the same namespaces and mounts as above (its /dev read-only too,
the zygote's /dev being writable by the host user), but only one uid can be mapped without
root, so instead of a uid of its own each run's init then enters a nested user namespace of its
own: uid RUN_UID inside, the host user outside, setgroups denied, no further user namespaces
(max_user_namespaces 0), an empty bounding set and no capabilities. RLIMIT_NPROC is counted per
uid *and user namespace* (Linux 5.14+), so it bounds each run on its own; runs share the host
user's uid but see nothing of each other (own mount, pid, network, IPC namespaces) and cannot
reach the zygote or another run's processes (not in their pid namespace; ptrace and signals of
the zygote's namespace need capabilities there). See docs/security.md.

Each run's first process is forked straight into a new pid namespace (unshare(CLONE_NEWPID)
before the fork, setns() back after it), is that namespace's init, and forks the worker.

Control socket (SOCK_SEQPACKET, fd --control-fd): one JSON object per message.
  host -> zygote  {"op": "spawn", "id", "run", "uid", "limits", "tmp_bytes", "disk_bytes"?}
                  with SCM_RIGHTS [stdin, stdout, stderr, *cgroup.procs]
                  {"op": "kill", "id"}
  zygote -> host  {"op": "spawned", "id", "error"?, "pid"?}   {"op": "exit", "id", "status"}
"spawned" carries SCM_CREDENTIALS naming the run's init when "pid" is true: the kernel gives
the host that pid in its own pid namespace (the host has no other way to find a run without a
uid or cgroup of its own; it watches the tree's memory from there).
"status" follows Popen.returncode (negative: killed by that signal). The zygote exits when the
host closes the socket; bubblewrap then tears the whole pid namespace down, runs included.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import fcntl
import gc
import json
import os
import resource  # noqa: F401  (imported late by the worker: done once here)
import select
import signal
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker  # noqa: E402  (imported once here, shared by every forked run)

RUNS = "/recursa/runs"
CLONE_NEWNS, CLONE_NEWCGROUP = 0x00020000, 0x02000000
CLONE_NEWUTS, CLONE_NEWIPC = 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
CLONE_NEWUSER = 0x10000000
RUN_UID = 1000            # a run's uid inside its own user namespace (--userns)
USERNS = False            # set by main(): the zygote runs in a user namespace, not as root
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    _check(_libc.mount(src and src.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def _umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _loopback_up() -> None:
    """Bring up `lo` in the run's new network namespace (as bubblewrap does): code that talks
    to itself over 127.0.0.1 works, and nothing else is reachable."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        iff_up, iff_loopback, iff_running = 0x1, 0x8, 0x40
        ifreq = struct.pack("16sH22s", b"lo", iff_up | iff_loopback | iff_running, b"")
        fcntl.ioctl(s.fileno(), 0x8914, ifreq)  # SIOCSIFFLAGS


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _own_userns() -> None:
    """(--userns) Enter a user namespace of the run's own as RUN_UID, and keep no capability
    in it: the caps a new user namespace grants are dropped here, since no setuid() from root
    will clear them. Called by the run's init once its namespaces and mounts are set up (they
    stay owned by the zygote's namespace, out of the run's reach)."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare user")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{RUN_UID} {uid} 1")
    _write("/proc/self/gid_map", f"{RUN_UID} {gid} 1")
    _write("/proc/sys/user/max_user_namespaces", "0")   # none nested in the run's
    for cap in range(64):
        _libc.prctl(24, cap, 0, 0, 0)   # PR_CAPBSET_DROP
    _libc.prctl(47, 4, 0, 0, 0)          # PR_CAP_AMBIENT_CLEAR_ALL
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()), "capset")
    if os.getuid() != RUN_UID:
        raise OSError("the run's user namespace has no uid map")


def _init(req: dict, fds: list[int]) -> None:
    """The run's first process, pid 1 of its own pid namespace (forked by the zygote): join
    the run's cgroup, enter new namespaces, mount the run's view, fork the worker, wait for it
    and exit with its status. The worker is not pid 1 itself, so signals reach it as anywhere
    else (the kernel shields a namespace's init from them); when this process ends, the
    kernel kills everything left in the namespace. Never returns."""
    code = 1
    stdio, cgroup_fds = fds[:3], fds[3:]
    try:
        os.setsid()
        # The namespaces and mounts are made before the run joins its cgroup: at a run
        # tree's memory cap the kernel refuses their memory (ENOMEM) rather than waiting.
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
               "unshare")
        _loopback_up()
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        run = os.path.join(RUNS, os.path.basename(str(req["run"])))
        _mount(f"{run}/ws", "/workspace", None, MS_BIND)
        _mount(f"{run}/ctx", "/recursa/ctx", None, MS_BIND)
        _mount(None, "/recursa/ctx", None,
               MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={int(req['tmp_bytes'])},mode=1777")
        _umount(RUNS)   # the other runs' directories are gone from this namespace
        # Its own pseudo-terminals: a new devpts instance over the zygote's, shared by every
        # run otherwise (/dev/ptmx is bubblewrap's link to pts/ptmx, so it follows)
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=620")
        worker.join_cgroups(cgroup_fds)   # before the worker: its processes are born inside
        _check(_libc.unshare(CLONE_NEWCGROUP), "unshare cgroup")
        if USERNS:
            # Mounted over the zygote's (the kernel lets a user namespace mount a proc only
            # while one is fully visible); the zygote's /dev belongs to the host user: read-only
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _mount(None, "/dev", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
            _own_userns()
        else:
            _umount("/proc")
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        pid = os.fork()
        if pid == 0:
            _worker(req, stdio)
        os.closerange(0, 1 << 16)   # the pipes are the worker's alone: EOF when it dies
        while True:
            got, st = os.wait()
            if got == pid:
                code = 128 + os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)
                break
    except BaseException as exc:  # noqa: BLE001 - tell the host why, never return
        try:
            os.write(stdio[2], f"recursa zygote: the run's setup failed: "
                               f"{type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def _worker(req: dict, stdio: list[int]) -> None:
    """The worker: the pipes as fds 0-2, then the worker's own start-up (limits, wait for
    init, open the context, drop the uid)."""
    code = 1
    try:
        for i, fd in enumerate(stdio):
            os.dup2(fd, i)
        os.closerange(3, 1 << 16)
        os.chdir("/workspace")
        os.environ["HOME"] = "/workspace"
        os.environ["TMPDIR"] = "/tmp"
        code = worker.run(req.get("limits") or {}, uid=None if USERNS else int(req["uid"]),
                          late_context=True, pdeathsig=False, confine="require")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code or 0)


def _recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not msg:
        return None, list(fds)
    return json.loads(msg), list(fds)


def _workspace(req: dict) -> None:
    """(In the zygote, before the run's init is forked) the run's workspace as a tmpfs of
    `disk_bytes`, owned by the run's uid, once per run: the kernel refuses a write past the
    cap (ENOSPC) where a watch from the host could only notice it afterwards."""
    size = req.get("disk_bytes")
    if not size:
        return
    ws = os.path.join(RUNS, os.path.basename(str(req["run"])), "ws")
    if os.path.ismount(ws):      # a restart of the same run: its files stay
        return
    owner = 0 if USERNS else int(req["uid"])
    _mount("tmpfs", ws, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(size)},nr_inodes={max(1024, int(size) // 4096)},mode=0700,"
           f"uid={owner},gid={owner}")


def _status(st: int) -> int:
    if os.WIFSIGNALED(st):
        return -os.WTERMSIG(st)
    return os.WEXITSTATUS(st) if os.WIFEXITED(st) else 1


def serve(sock: socket.socket) -> int:
    runs: dict[int, int] = {}   # pid of a run's init (our namespace) -> run id
    own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    def send(msg: dict, pid: int | None = None) -> None:
        data = json.dumps(msg).encode()
        if pid is not None:   # see the module docstring: the host learns the run's pid
            creds = struct.pack("3i", pid, os.getuid(), os.getgid())
            try:
                sock.sendmsg([json.dumps({**msg, "pid": True}).encode()],
                               [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
                return
            except OSError:
                pass
        sock.send(data)

    def reap() -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = runs.pop(pid, None)
            if rid is not None:
                send({"op": "exit", "id": rid, "status": _status(st)})

    def spawn(msg: dict, fds: list[int]) -> int:
        _workspace(msg)
        # The next child is pid 1 of a new pid namespace; then back to ours, so that the one
        # after it gets a new namespace too.
        _check(_libc.unshare(CLONE_NEWPID), "unshare")
        try:
            child = os.fork()
        finally:
            if os.getpid() != 1:
                _check(_libc.setns(own_pidns, CLONE_NEWPID), "setns")
        if child == 0:
            sock.close()
            for fd in (own_pidns, wake_r, wake_w):
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _init(msg, fds)
        rid = msg.get("id")
        runs[child] = rid if isinstance(rid, int) else -1   # the host sends int ids
        return child

    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        reap()
        if sock.fileno() not in ready:
            continue
        try:
            msg, fds = _recv(sock)
        except (OSError, ValueError):
            return 1
        if msg is None:
            return 0   # the host closed the socket
        op = msg.get("op")
        if op == "spawn":
            try:
                child = spawn(msg, fds)
                send({"op": "spawned", "id": msg.get("id")}, child)
            except OSError as exc:
                send({"op": "spawned", "id": msg.get("id"), "error": str(exc)})
        elif op == "kill":
            for pid, rid in runs.items():
                if rid == msg.get("id"):
                    try:
                        os.kill(pid, signal.SIGKILL)  # pid 1 of its namespace: all of it dies
                    except OSError:
                        pass
        for fd in fds:   # the run has its own copies
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zygote.py")
    ap.add_argument("--control-fd", type=int, required=True)
    ap.add_argument("--userns", action="store_true",
                    help="not root: in a user namespace; each run gets one of its own")
    args = ap.parse_args(argv)
    global USERNS
    USERNS = args.userns
    sock = socket.socket(fileno=args.control_fd)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    worker.prepare_lock_down()   # each run's worker installs the same seccomp program
    # Everything imported so far is shared by the forks: keep the collector from touching (and
    # so copying) those pages in each of them.
    gc.collect()
    gc.freeze()
    try:
        return serve(sock)
    except (BrokenPipeError, ConnectionError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
