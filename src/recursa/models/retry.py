"""One retry policy for every hosted model client: exponential backoff with full jitter.

The SDKs' own retries are switched off (`max_retries=0`) so that every retry happens here (in
the shared control flow, hosted.py), is counted, honours `Retry-After`, and follows the same
rules for every provider.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from recursa.base.types import ModelError

log = logging.getLogger("recursa.models")

T = TypeVar("T")

# Statuses where trying again may help: request timeout, conflict, too early, rate limit, and
# every 5xx (including Anthropic's 529 "overloaded").
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})


class EmptyResponseError(ModelError):
    """The server answered but gave no text. Retried at most once: sampling may differ the
    second time, but a model that keeps answering nothing will not be fixed by hammering it."""

    def __init__(self, message: str):
        super().__init__(message, retryable=True)


@dataclass
class RetryPolicy:
    max_retries: int = 4            # retries after the first attempt
    base_delay: float = 0.5         # seconds; attempt k waits uniform(0, base * 2**k)
    max_delay: float = 30.0         # cap of one backoff sleep
    max_retry_after: float = 120.0  # a Retry-After longer than this is not waited for: we give up
    max_empty_retries: int = 1


@dataclass
class RetryStats:
    """Counters a client exposes as `.stats` (tests and benchmarks read them)."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    slept_s: float = 0.0
    last_errors: list[str] = field(default_factory=list)

    def note_error(self, msg: str) -> None:
        self.last_errors.append(msg)
        del self.last_errors[:-10]  # keep the last few only


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms`, `Retry-After: <seconds>` or `Retry-After: <HTTP date>`."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random | None = None) -> float:
    """Full jitter (uniform in [0, min(cap, base * 2**attempt)]): spreads a herd of clients
    that all hit the same 429 so they do not retry in lock-step."""
    r = rng or random
    return r.uniform(0.0, min(policy.max_delay, policy.base_delay * (2 ** attempt)))


async def with_retries(
    attempt_fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    stats: RetryStats | None = None,
    *,
    what: str = "model call",
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> T:
    """Run `attempt_fn` until it succeeds, raises a non-retryable ModelError, or retries run out.

    `attempt_fn` must raise ModelError (with `retryable` / `retry_after` set) for failures.
    """
    stats = stats if stats is not None else RetryStats()
    stats.calls += 1
    retries = 0
    empty_retries = 0
    while True:
        stats.attempts += 1
        try:
            return await attempt_fn()
        except ModelError as err:
            stats.note_error(str(err))
            give_up = not err.retryable or retries >= policy.max_retries
            if isinstance(err, EmptyResponseError):
                give_up = give_up or empty_retries >= policy.max_empty_retries
                empty_retries += 1
            if not give_up and err.retry_after is not None and err.retry_after > policy.max_retry_after:
                log.warning("%s: server asks to retry after %.0fs (> %.0fs); giving up",
                            what, err.retry_after, policy.max_retry_after)
                give_up = True
            if give_up:
                stats.failures += 1
                if retries and err.retryable:
                    raise ModelError(f"{err} (gave up after {retries + 1} attempts)",
                                     retryable=False, status=err.status,
                                     retry_after=err.retry_after) from err
                raise
            if err.retry_after is not None:
                delay = err.retry_after
            else:
                delay = backoff_delay(retries, policy)
            retries += 1
            stats.retries += 1
            stats.slept_s += delay
            log.info("%s failed (%s); retry %d/%d in %.2fs",
                     what, err, retries, policy.max_retries, delay)
            await sleep(delay)
