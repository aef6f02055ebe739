"""Sandboxes: where model-written code runs. See local.py (default) and inprocess.py.

The sandbox classes are imported on first use: a run imports only its own sandbox's modules
(the local sandbox's zygote, cgroup and transport code is not needed by an in-process run)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from recursa.types import Sandbox

if TYPE_CHECKING:
    from recursa.sandbox.inprocess import InProcessSandbox
    from recursa.sandbox.local import LocalSandbox
    from recursa.sandbox.session import WorkerSession
    from recursa.sandbox.transport import SubprocessTransport, Transport

_WHERE = {
    "InProcessSandbox": "recursa.sandbox.inprocess",
    "LocalSandbox": "recursa.sandbox.local",
    "WorkerSession": "recursa.sandbox.session",
    "SubprocessTransport": "recursa.sandbox.transport",
    "Transport": "recursa.sandbox.transport",
}

__all__ = ["InProcessSandbox", "LocalSandbox", "SubprocessTransport", "Transport",
           "WorkerSession", "make_sandbox"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'recursa.sandbox' has no attribute {name!r}")


def make_sandbox(kind: str = "local", **opts: Any) -> Sandbox:
    """Build a sandbox by name: "local" (subprocess under bubblewrap; refuses to start where
    bubblewrap cannot work, saying why), "limits" (the same subprocess with resource limits
    only, NOT isolated from the host: an explicit choice), "inprocess", or a remote one:
    "docker", "modal", "e2b", "daytona" (optional extras; see docs/remote.md)."""
    if kind in ("local", "limits"):
        from recursa.sandbox.local import LocalSandbox
        if kind == "limits":
            if opts.get("isolation", "limits") != "limits":
                raise ValueError(f"sandbox 'limits' is the local sandbox without isolation; "
                                 f"isolation={opts['isolation']!r} contradicts it")
            opts = {**opts, "isolation": "limits"}
        return LocalSandbox(**opts)
    if kind in ("inprocess", "in-process", "in_process"):
        from recursa.sandbox.inprocess import InProcessSandbox
        return InProcessSandbox(**opts)
    from recursa.sandbox.remote import KINDS, make_remote_sandbox
    if kind in KINDS:
        return make_remote_sandbox(kind, **opts)
    raise ValueError(f"unknown sandbox kind {kind!r}; expected 'local', 'limits', 'inprocess' "
                     f"or one of {', '.join(sorted(KINDS))}")
