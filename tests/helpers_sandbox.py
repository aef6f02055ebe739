"""Sandbox test helpers: a context payload on disk, a call handler that records what the
sandbox asked for, a started LocalSandbox, and what this host's isolation can do."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from recursa.base.types import ContextPayload, Sandbox
from recursa.sandbox import LocalSandbox
from recursa.sandbox.isolation import bwrap_works, find_bwrap
from recursa.sandbox.treelimits import cgroup_host

HAVE_BWRAP = bool(find_bwrap()) and bwrap_works(find_bwrap() or "")
# the isolation modes this host can run: bubblewrap where it works, resource limits always
MODES = ["bwrap", "limits"] if HAVE_BWRAP else ["limits"]
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap not usable here")


def payload_for(tmp_path: Path, value: Any, kind: str = "text") -> ContextPayload:
    path = tmp_path / ("context.json" if kind == "json" else "context.txt")
    data = json.dumps(value) if kind == "json" else value
    path.write_text(data, encoding="utf-8")
    raw = path.read_bytes()
    return ContextPayload(path=str(path), kind=kind, sha256=hashlib.sha256(raw).hexdigest(),
                          size_bytes=len(raw))


class Recorder:
    """A CallHandler that answers deterministically and remembers what it was asked."""

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.delay = delay
        self.fail = fail

    async def __call__(self, kind: str, args: dict[str, Any]) -> Any:
        self.calls.append((kind, args))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise ValueError("boom")
        if kind == "llm":
            return f"LLM[{args['prompt']}]"
        if kind == "llm_batch":
            return [f"LLM[{p}]" for p in args["prompts"]]
        if kind == "rlm":
            return f"RLM[{args['prompt']}|{args['context']}]"
        if kind == "rlm_batch":
            ctxs = args["contexts"] or [None] * len(args["prompts"])
            return [f"RLM[{p}|{c}]" for p, c in zip(args["prompts"], ctxs, strict=True)]
        raise AssertionError(kind)


async def run(sb: Sandbox, code: str, timeout: float = 10.0, max_output_chars: int = 10_000):
    return await sb.run(code, timeout=timeout, max_output_chars=max_output_chars)


async def started(tmp_path: Path, handler: Any = None, **opts: Any) -> LocalSandbox:
    """A LocalSandbox(**opts) started on a small text context (closed again if start fails)."""
    sb = LocalSandbox(**opts)
    try:
        await sb.start(payload_for(tmp_path, "the context"), handler or Recorder())
    except BaseException:
        await sb.close()
        raise
    return sb


# Limits on a sandbox's process tree: through its own control group where the host can make
# one, else a host-side watch. (cgroups on?, marker in the message)
HAVE_CGROUPS = cgroup_host() is not None
needs_cgroups = pytest.mark.skipif(not HAVE_CGROUPS, reason="no usable cgroups here")
MECHS = [pytest.param(True, "cgroup", marks=needs_cgroups), pytest.param(False, "host watch")]
