"""Can the local sandbox isolate model-written code here? And if not: why, and what to do.

The local sandbox isolates with bubblewrap. Where bubblewrap is missing or cannot make a
sandbox (macOS, a container that blocks user namespaces, a distribution that restricts them),
`LocalSandbox()` refuses to start with `IsolationUnavailable`, whose message says why, how to
fix it, and which sandboxes can still work. Running without isolation is a separate, explicit
choice: `sandbox="limits"` (`--sandbox limits`).

`RECURSA_BWRAP` names the bubblewrap to use (a path); set to a path that does not exist, the
local sandbox behaves as on a host without bubblewrap (for tests and for trying the message).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from recursa.base.types import SandboxError

ENV_BWRAP = "RECURSA_BWRAP"
_works: set[str] = set()   # bwrap paths that made a sandbox here


class IsolationUnavailable(SandboxError):
    """The local sandbox cannot isolate code on this host (the message says why and what to do)."""


def find_bwrap() -> str | None:
    """The bubblewrap to use: $RECURSA_BWRAP if set (None when it is not an executable), else
    `bwrap` on PATH, else /usr/bin/bwrap."""
    named = os.environ.get(ENV_BWRAP)
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else None
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


def bwrap_failure(bwrap: str) -> str | None:
    """None if `bwrap` can make a sandbox with its own network here, else bubblewrap's own
    words on why not (bwrap may be installed yet unusable, e.g. in a container without user
    namespaces). A success is remembered per path and process; a failure is probed again next
    time (it may have been passing, e.g. a fork refused under load)."""
    if bwrap in _works:
        return None
    args = [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "true"]
    try:
        done = subprocess.run(args, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc) or type(exc).__name__
    if done.returncode == 0:
        _works.add(bwrap)
        return None
    err = done.stderr.decode(errors="replace").strip().splitlines()
    return err[-1] if err else f"exit status {done.returncode}"


def bwrap_works(bwrap: str) -> bool:
    return bwrap_failure(bwrap) is None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _in_container() -> bool:
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv") or (
        _read("/proc/1/cgroup") or "").find("docker") >= 0


def _userns_fixes() -> list[str]:
    """What stops unprivileged user namespaces on this host, as fixes (the sysctls that are
    set against them, or a container)."""
    fixes = []
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        fixes.append("enable unprivileged user namespaces: "
                     "`sysctl -w kernel.unprivileged_userns_clone=1`")
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        fixes.append("allow user namespaces: `sysctl -w user.max_user_namespaces=15000`")
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        fixes.append("AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+): give "
                     "bwrap a profile that allows them (see the bubblewrap package's "
                     "/etc/apparmor.d/bwrap-userns-restrict), or "
                     "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`")
    if _in_container():
        fixes.append("this looks like a container, whose seccomp profile usually blocks the "
                     "namespaces bubblewrap needs: run recursa on the host, or start the "
                     "container with `--security-opt seccomp=unconfined --security-opt "
                     "apparmor=unconfined` (or a profile allowing unshare/clone of namespaces)")
    if not fixes:
        fixes.append("make sure unprivileged user namespaces are enabled (sysctls "
                     "`kernel.unprivileged_userns_clone=1` where it exists, "
                     "`user.max_user_namespaces` above 0, and on Ubuntu 23.10+ "
                     "`kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile "
                     "for bwrap)")
    return fixes


def _alternatives() -> str:
    """The other kinds, from the registry (recursa.sandbox.kinds): those that isolate, then,
    for trusted code only, those that do not."""
    from recursa.sandbox.kinds import kind_names, sandbox_kind

    def way(name: str) -> str:
        k = sandbox_kind(name)
        what = k.description if k is not None and k.description else "an installed package's"
        if name == "docker":
            what += "; a Docker engine is installed here" if shutil.which("docker") \
                else "; needs a Docker engine"
        return f"sandbox={name!r} / --sandbox {name} ({what})"
    isolating = [way(n) for n in kind_names(isolates=True) if n != "local"]
    trusted = [way(n) for n in kind_names(isolates=False)]
    return (f"Sandboxes that can work instead: {', '.join(isolating)} (docs/sandbox.md, "
            f"docs/remote.md). Only for code and data you trust, since they run it unconfined "
            f"(your files, the network and your other processes in its reach): "
            f"{', '.join(trusted)}")


def unavailable_reason(bwrap: str | None = None) -> str | None:
    """None when the local sandbox can isolate here (with `bwrap`, else the one `find_bwrap`
    finds); else a message saying why not, how to fix it and which sandboxes can work."""
    if sys.platform != "linux":
        why = f"bubblewrap, which isolates it, needs Linux (this is {sys.platform})"
        fixes = ["run recursa on Linux, or in a Linux VM or container"]
    else:
        path = bwrap or find_bwrap()
        if path is None or not os.access(path, os.X_OK):
            named = bwrap or os.environ.get(ENV_BWRAP)
            why = (f"bubblewrap is not at {named!r}" if named
                   else "bubblewrap (bwrap) is not installed")
            fixes = ["install bubblewrap (Debian/Ubuntu: `apt install bubblewrap`; Fedora: "
                     "`dnf install bubblewrap`; Arch: `pacman -S bubblewrap`; Alpine: "
                     "`apk add bubblewrap`)"]
            if named:
                fixes.append(f"or unset {ENV_BWRAP} / point it at a working bwrap")
        else:
            failure = bwrap_failure(path)
            if failure is None:
                return None
            why = f"bubblewrap ({path}) cannot create a sandbox here: {failure}"
            fixes = [] if os.geteuid() == 0 else _userns_fixes()
            if os.geteuid() == 0:
                fixes.append("as root bubblewrap needs CAP_SYS_ADMIN to make namespaces; in a "
                             "container that means a less restricted one (e.g. docker run "
                             "--cap-add SYS_ADMIN --security-opt seccomp=unconfined "
                             "--security-opt apparmor=unconfined), or run recursa on the host")
    steps = "; ".join(fixes)
    return (f"the local sandbox refuses to run model-written code without isolation, and "
            f"cannot isolate it here: {why}. To fix: {steps}. {_alternatives()}.")


def require_isolation(bwrap: str | None = None) -> str:
    """The usable bubblewrap's path, or raise IsolationUnavailable saying why and what to do."""
    why = unavailable_reason(bwrap)
    if why is not None:
        raise IsolationUnavailable(why)
    path = bwrap or find_bwrap()
    assert path is not None
    return path
