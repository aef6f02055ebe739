"""Remote sandboxes: the same worker and framed protocol over a remote process's stdio.

    make_remote_sandbox("docker", image="python:3.12-slim")
    make_remote_sandbox("modal", timeout=1800)
    make_remote_sandbox("e2b", template="base")
    make_remote_sandbox("daytona", image="python:3.12-slim")

Provider SDKs are optional extras (`pip install 'recursa[modal]'` etc.) imported only when a
sandbox starts. See docs/remote.md for what each provider isolates and how to try it.
"""

from __future__ import annotations

from typing import Any

from recursa.base.types import Sandbox
from recursa.sandbox.kinds import REMOTE_KINDS, launcher_for
from recursa.sandbox.remote.base import Launcher, RemoteSandbox, StreamTransport

__all__ = ["KINDS", "Launcher", "RemoteSandbox", "StreamTransport", "make_remote_sandbox"]

KINDS = REMOTE_KINDS          # listed once, in recursa.sandbox.kinds
_SANDBOX_OPTS = ("start_timeout", "interrupt_grace")


def _launcher(kind: str, opts: dict[str, Any]) -> Launcher:
    # the launcher modules import their SDKs only in prepare()
    launcher: Launcher = launcher_for(kind, opts)
    return launcher


def make_remote_sandbox(kind: str, **opts: Any) -> Sandbox:
    """A `RemoteSandbox` for `kind`; `start_timeout` and `interrupt_grace` go to the sandbox,
    every other option to the provider's launcher (see its class for the list)."""
    sandbox_opts = {k: opts.pop(k) for k in _SANDBOX_OPTS if k in opts}
    return RemoteSandbox(_launcher(kind, opts), **sandbox_opts)
