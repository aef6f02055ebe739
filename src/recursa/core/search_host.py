"""The REPL's `search(query, k)`, answered on the host from an index of the run's context.

Why on the host and not in the sandboxed worker (both hold the context):
- the worker is a stdlib-only program (`python -I -S`, in bubblewrap, a container or a remote
  sandbox) that cannot import numpy / bm25s / wordllama, and should not: the remote sandboxes
  do not have them, and each import widens what model-written code can reach;
- the worker runs under an address-space and CPU limit sized for user code, not for an index;
- an index on the host outlives a worker restart (a crash, a timed-out cell), is built once
  per context and shared by the questions of a session and by every run over the same
  context (cached by the payload's sha256);
- only a query goes in and k passages come out over the channel.
The index is built lazily, on the first `search` of a context, in a thread (the event loop
keeps serving the run's other calls), under a lock so concurrent first searches build it once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import OrderedDict
from typing import Any

from recursa.base.types import CallHandler, ContextPayload

CACHE_SIZE = 2            # indexes kept (a 1M-token one holds ~60 MB)
MAX_K = 50

_lock = threading.Lock()
_building: dict[str, threading.Lock] = {}
_cache: OrderedDict[str, Any] = OrderedDict()


@functools.cache       # asked for every run's prompt; what is installed does not change
def available() -> bool:
    """Whether the `search` extra is installed (found, not imported: wordllama's import
    configures logging, and the root's prompt only needs to know whether to offer search)."""
    from importlib.util import find_spec
    return all(find_spec(m) is not None for m in ("wordllama", "bm25s", "numpy"))


def load_payload(payload: ContextPayload) -> Any:
    """The context as the worker sees it, read back from the payload file on the host."""
    from recursa.documents.model import revive  # documents are indexed as their text
    with open(payload.path, encoding="utf-8", errors="replace") as f:
        return json.load(f, object_hook=revive) if payload.kind == "json" else f.read()


def index_for(payload: ContextPayload) -> Any:
    """The SemanticIndex of this payload's context: cached, built once (blocking)."""
    from recursa.core.semantic import SemanticIndex
    key = payload.sha256
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        build_lock = _building.setdefault(key, threading.Lock())
    with build_lock:
        with _lock:
            if key in _cache:
                return _cache[key]
        index = SemanticIndex(load_payload(payload))
        with _lock:
            _cache[key] = index
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
            _building.pop(key, None)
    return index


def clear_cache() -> None:
    with _lock:
        _cache.clear()


async def search(payload: ContextPayload, args: dict[str, Any]) -> list[dict[str, Any]]:
    """One `search` call from the REPL: {"query": str, "k": int, "mode": str}."""
    from recursa.core.semantic import MODES
    query = str(args.get("query", ""))
    try:
        k = int(args.get("k", 5))
    except (TypeError, ValueError):
        raise ValueError(f"search: k must be an int, not {args.get('k')!r}") from None
    if k < 1:
        raise ValueError(f"search: k must be at least 1, not {k}")
    mode = str(args.get("mode") or "hybrid")
    if mode not in MODES:
        raise ValueError(f"search: mode must be one of {', '.join(MODES)}, not {mode!r}")
    index = await asyncio.to_thread(index_for, payload)
    return await asyncio.to_thread(index.search, query, min(k, MAX_K), mode)


def with_search(handler: CallHandler, payload: ContextPayload) -> CallHandler:
    """`handler`, answering the REPL's "search" calls from the index of `payload`'s context."""
    async def handle(kind: str, args: dict[str, Any]) -> Any:
        if kind == "search":
            return await search(payload, args)
        return await handler(kind, args)
    return handle
