"""Sandboxes: where model-written code runs. See local.py (default) and inprocess.py."""

from __future__ import annotations

from typing import Any

from recursa.sandbox.inprocess import InProcessSandbox
from recursa.sandbox.local import LocalSandbox
from recursa.sandbox.session import WorkerSession
from recursa.sandbox.transport import SubprocessTransport, Transport
from recursa.types import Sandbox

__all__ = [
    "InProcessSandbox",
    "LocalSandbox",
    "SubprocessTransport",
    "Transport",
    "WorkerSession",
    "make_sandbox",
]


def make_sandbox(kind: str = "local", **opts: Any) -> Sandbox:
    """Build a sandbox by name: "local" (subprocess, bwrap when present), "inprocess", or a
    remote one: "docker", "modal", "e2b", "daytona" (optional extras; see docs/remote.md)."""
    if kind == "local":
        return LocalSandbox(**opts)
    if kind in ("inprocess", "in-process", "in_process"):
        return InProcessSandbox(**opts)
    from recursa.sandbox.remote import KINDS, make_remote_sandbox
    if kind in KINDS:
        return make_remote_sandbox(kind, **opts)
    raise ValueError(f"unknown sandbox kind {kind!r}; expected 'local', 'inprocess' or one of "
                     f"{', '.join(sorted(KINDS))}")
