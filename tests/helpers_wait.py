"""Waiting in tests for what the code under test offers no event for (another process's exit, a
file a sweep removes): poll a condition until it holds or a timeout passes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(pred: Callable[[], object], timeout: float = 30.0, every: float = 0.05) -> bool:
    """True once `pred()` is true; False if it is still false after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())
