"""A local model's server starts in a thread of its own: a call cut while it still starts (a
cold, loaded machine) returns at once, and `asyncio.run` does not wait for the start at shutdown
(it joins its default executor's threads). No model needed: the start is made slow by hand."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from recursa.models.local import LocalClient


class SlowStart(LocalClient):
    def __init__(self, seconds: float, error: BaseException | None = None) -> None:
        super().__init__("/nowhere/model.gguf")
        self.seconds, self.error = seconds, error
        self.finished = threading.Event()

    def _ensure_server(self):  # type: ignore[override]
        time.sleep(self.seconds)
        self.finished.set()
        if self.error is not None:
            raise self.error
        raise RuntimeError("no server here")


def test_a_call_cut_while_the_server_starts_returns_at_once() -> None:
    client = SlowStart(3.0)

    async def cut() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.complete([{"role": "user", "content": "hi"}])

    t0 = time.monotonic()
    asyncio.run(cut())
    assert time.monotonic() - t0 < 1.5           # not the 3 s start
    assert not client.finished.is_set()
    assert client.finished.wait(5)               # the start ran on and ended by itself


def test_a_failed_start_reaches_the_caller() -> None:
    client = SlowStart(0.05, error=ValueError("the build failed"))
    with pytest.raises(ValueError, match="the build failed"):
        asyncio.run(client.load())
