"""Sandboxes: where model-written code runs. See local.py (default) and inprocess.py.

The sandbox classes are imported on first use: a run imports only its own sandbox's modules
(the local sandbox's zygote, cgroup and transport code is not needed by an in-process run)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recursa.base.types import Sandbox
    from recursa.sandbox.inprocess import InProcessSandbox
    from recursa.sandbox.kinds import SandboxKind, register_sandbox
    from recursa.sandbox.local import LocalSandbox
    from recursa.sandbox.session import WorkerSession
    from recursa.sandbox.transport import SubprocessTransport, Transport

_WHERE = {
    "InProcessSandbox": "recursa.sandbox.inprocess",
    "LocalSandbox": "recursa.sandbox.local",
    "WorkerSession": "recursa.sandbox.session",
    "SubprocessTransport": "recursa.sandbox.transport",
    "Transport": "recursa.sandbox.transport",
    "Sandbox": "recursa.base.types",
    "SandboxKind": "recursa.sandbox.kinds",
    "register_sandbox": "recursa.sandbox.kinds",
}

__all__ = ["InProcessSandbox", "LocalSandbox", "SandboxKind", "SubprocessTransport", "Transport",
           "WorkerSession", "make_sandbox", "register_sandbox"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'recursa.sandbox' has no attribute {name!r}")


def make_sandbox(kind: str = "local", **opts: Any) -> Sandbox:
    """Build a sandbox by name: "local" (subprocess under bubblewrap; refuses to start where
    bubblewrap cannot work, saying why), "limits" (the same subprocess with resource limits
    only, NOT isolated from the host: an explicit choice), "inprocess", a remote one:
    "docker", "modal", "e2b", "daytona" (optional extras; see docs/remote.md), or a kind
    another package registers (recursa.sandbox.kinds)."""
    from recursa.sandbox.kinds import kind_names, sandbox_kind
    k = sandbox_kind(kind)
    if k is None:
        raise ValueError(f"unknown sandbox kind {kind!r}; expected one of "
                         f"{', '.join(kind_names())}")
    return k.factory(**opts)
