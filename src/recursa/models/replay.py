"""ReplayClient: a scripted model for deterministic tests of the RLM loop."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelError,
    Pricing,
    Usage,
    model_identity,
)

from .declared import Declares


class ReplayExhausted(ModelError):
    """The script has no response left for this call."""


def _chars(messages: list[Message]) -> int:
    n = 0
    for m in messages:
        c = m.get("content")
        n += len(c) if isinstance(c, str) else len(str(c or ""))
    return n


class ReplayClient(Declares):
    """Answers from a script.

    `responses`: a list of items used in order (a `str` is returned, an `Exception` is raised,
    so error paths can be scripted too), or a callable `(messages) -> str` (sync or async)
    that is asked every time. `.calls` records the messages of each call, `.options` the options.
    Usage is estimated at ~4 characters per token; cost is `cost_usd` per call (default 0.0;
    None: no known price). `context_window`, `tools` and `stop` are what it declares (a test may
    set them to stand in for a model that has a window, takes native tools, or ends its reply
    at stop strings as a server does).
    An empty string is raised as ModelError, as a real client would (the contract says
    `complete` never returns empty text).
    """

    def __init__(self, responses: Sequence[str | BaseException] | Callable[..., Any] = (), *,
                 name: str = "replay:", latency: float = 0.0, cost_usd: float | None = 0.0,
                 model: str = "replay", context_window: int | None = None,
                 tools: bool = False, stop: bool = False) -> None:
        self.name = name
        self.stop = stop
        self.model = model
        self.context_window = context_window
        self.tools = tools
        self.latency = latency
        self.cost_usd = cost_usd
        self._fn: Callable[..., Any] | None = responses if callable(responses) else None
        self._script: list[str | BaseException] = [] if callable(responses) else list(responses)
        self._lock = threading.Lock()  # no await inside: safe across loops and threads
        self.calls: list[list[Message]] = []
        self.options: list[dict[str, Any]] = []
        self.closed = False

    def _declare(self) -> Capabilities:
        return Capabilities(
            context_window=self.context_window, tools=self.tools, stop=self.stop,
            pricing=Pricing() if self.cost_usd is None else Pricing(per_call=self.cost_usd),
            identity=model_identity(self.name, self.model))

    @property
    def remaining(self) -> int:
        """Scripted responses not used yet (0 for a callable)."""
        return len(self._script)

    def add(self, *responses: str | BaseException) -> None:
        self._script.extend(responses)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        t0 = time.perf_counter()
        # Record and pick under one lock so concurrent callers get responses in call order.
        with self._lock:
            index = len(self.calls)
            self.calls.append([dict(m) for m in messages])
            self.options.append(dict(options))
            if self._fn is None:
                if not self._script:
                    last = messages[-1].get("content") if messages else ""
                    raise ReplayExhausted(
                        f"ReplayClient script exhausted: call #{index + 1} has no scripted "
                        f"response ({index} were given); last message: {str(last)[:200]!r}")
                item: Any = self._script.pop(0)
        if self._fn is not None:
            item = self._fn(messages)
            if inspect.isawaitable(item):
                item = await item
        if self.latency:
            await asyncio.sleep(self.latency)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Completion):     # a whole reply (with logprobs, say), as given
            return item
        text = str(item)
        if self.stop:       # as a server does: the reply ends before the first stop string
            ends = [i for i in (text.find(s) for s in options.get("stop") or ()) if i >= 0]
            text = text[:min(ends)] if ends else text
        if not text:
            raise ModelError(f"replay response #{index + 1} returned no text")
        usage = Usage(input_tokens=max(1, _chars(messages) // 4),
                      output_tokens=max(1, len(text) // 4))
        return Completion(text=text, usage=usage, cost_usd=self.cost_usd, model=self.model,
                          latency_s=time.perf_counter() - t0, raw=None)

    async def aclose(self) -> None:
        self.closed = True


REPLAY_FILE_PREFIX = "replay-file:"


def load_replay_file(spec: str) -> ReplayClient:
    """`replay-file:PATH` (TEST-ONLY): a scripted model read from a JSON file — a list of
    responses used once each, in order, or `{"cycle": [...]}` repeated forever. It lets tests
    drive a real `recursa run` / `serve` / `mcp` process without a model."""
    import itertools
    import json
    from pathlib import Path

    path = Path(spec.removeprefix(REPLAY_FILE_PREFIX))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{spec}: cannot read a JSON script: {e}") from e
    if isinstance(data, dict) and isinstance(data.get("cycle"), list) and data["cycle"]:
        items = itertools.cycle([str(x) for x in data["cycle"]])
        lock = threading.Lock()

        def next_item(_messages: Any) -> str:
            with lock:   # concurrent runs share one script
                return next(items)
        return ReplayClient(next_item, name=spec)
    if isinstance(data, list):
        return ReplayClient([str(x) for x in data], name=spec)
    raise ValueError(f"{spec}: expected a JSON list of responses or {{\"cycle\": [...]}}")
