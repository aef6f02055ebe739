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
    """Build a sandbox by name: "local" (subprocess, bwrap when present) or "inprocess"."""
    if kind == "local":
        return LocalSandbox(**opts)
    if kind in ("inprocess", "in-process", "in_process"):
        return InProcessSandbox(**opts)
    raise ValueError(f"unknown sandbox kind {kind!r}; expected 'local' or 'inprocess'")
