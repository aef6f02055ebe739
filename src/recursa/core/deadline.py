"""Deadline: the one owner of `max_seconds`.

A run's time limit is a wall-clock promise: the run ends by `start + seconds`, its last-answer
turn included. That turn is reserved inside the limit, not added after it: the work (root
turns, cells, sub-calls, child RLMs, waits for a slot) stops `reserve` seconds early, and the
last-answer turn runs in what is left. One Deadline is shared by a top-level run and every
child under it; whatever runs is cut with `cut()` (a client's own timeout cannot promise this:
retries start its clock again, and a streamed reply resets it with every chunk).

An `Allowance` is seconds shared by runs one after another (a session's questions): each run's
Deadline gets the smaller of its own limit and what is left, and counts its time when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from recursa.base.types import BudgetExceeded

LAST_TURN_SHARE = 0.25      # the default reserve: a quarter of the limit ...
LAST_TURN_MAX = 60.0        # ... at most a minute
RESERVE_MAX_SHARE = 0.5     # a reserve never takes more than half the limit from the work


def default_reserve(seconds: float | None, last_turn_seconds: float | None = None) -> float:
    """The time kept for the last-answer turn: `last_turn_seconds` when set, else a quarter of
    the limit (at most 60 s); never more than half the limit. No limit: nothing is kept."""
    if seconds is None:
        return 0.0
    want = last_turn_seconds if last_turn_seconds is not None else \
        min(LAST_TURN_MAX, seconds * LAST_TURN_SHARE)
    return max(0.0, min(want, seconds * RESERVE_MAX_SHARE))


class Deadline:
    """`seconds` of wall time from now (None: no limit), `reserve` of them kept for the
    last-answer turn."""

    def __init__(self, seconds: float | None = None, *, reserve: float = 0.0,
                 start: float | None = None,
                 on_close: Callable[[float], None] | None = None):
        if seconds is not None and seconds < 0:
            raise ValueError("a deadline's seconds must not be negative")
        self.seconds = seconds
        self.reserve = 0.0 if seconds is None else \
            max(0.0, min(reserve, seconds * RESERVE_MAX_SHARE))
        self.start = time.monotonic() if start is None else start
        self._on_close = on_close

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, *, final: bool = False) -> float | None:
        """Seconds until the work must stop (`final`: until the end, the reserved last-answer
        turn included); None without a limit."""
        if self.seconds is None:
            return None
        end = self.seconds if final else self.seconds - self.reserve
        return end - self.elapsed

    def reached(self, *, final: bool = False) -> bool:
        left = self.left(final=final)
        return left is not None and left <= 0

    @contextlib.asynccontextmanager
    async def cut(self, what: str, *, final: bool = False) -> AsyncIterator[None]:
        """Cut whatever runs inside when the time is up (`final`: at the very end, for the
        last-answer turn): it is cancelled there and `BudgetExceeded("max_seconds")` raised."""
        left = self.left(final=final)
        if left is None:
            yield
            return
        if left <= 0:
            raise BudgetExceeded("max_seconds", f"max_seconds reached before {what}")
        cm = asyncio.timeout(left)
        try:
            async with cm:
                yield
        except TimeoutError as e:
            if not cm.expired():
                raise
            raise BudgetExceeded("max_seconds", f"max_seconds reached during {what}") from e

    def close(self) -> None:
        """The run is over: its time counts against the allowance it came from (once)."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self.elapsed)


class Allowance:
    """Seconds shared by runs one after another (None: no limit); see the module docstring."""

    def __init__(self, seconds: float | None = None):
        self.seconds = seconds
        self.used = 0.0

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - self.used

    def deadline(self, seconds: float | None, *, last_turn_seconds: float | None = None
                 ) -> Deadline:
        """A run's Deadline: its own `seconds` or what is left, whichever is less."""
        left = self.left()
        if left is not None:
            seconds = max(0.0, left if seconds is None else min(seconds, left))
        return Deadline(seconds, reserve=default_reserve(seconds, last_turn_seconds),
                        on_close=self._spend)

    def _spend(self, seconds: float) -> None:
        self.used += seconds
