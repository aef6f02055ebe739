"""The batch budget: one cap on cost, tokens and time across every item of a batch.

`BatchLedger` keeps recursa.core.budget's reserve / settle contract one level up: before an item
*attempt* starts, it reserves the attempt's worst case (the item's own cost and token caps);
the reservation is refused if spent + reserved + this one could pass a batch limit; after the
attempt, `settle` replaces the reservation with what it really spent. So concurrent items
cannot jointly overshoot, and the only overshoot left is what one item can spend past its own
caps (one call beyond its estimate, or the run's single last-answer turn).

A refusal while other attempts are in flight is not final (they may settle for less than they
reserved): the caller waits for one to finish and asks again; a refusal with nothing in flight,
or a limit reached by settled spend, stops the batch.

On Ray the same object runs as one actor (`ray_ledger`); workers `report` an attempt's spend as
it grows, so an attempt whose worker died is settled (`lost`) with what it was last known to
have spent, and its retry is a new attempt with a reservation of its own: every attempt is
settled exactly once, and nothing is counted twice.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from recursa.base.types import BudgetExceeded, Usage
from recursa.core.budget import Budget, Ledger, Reservation


class BatchBudget(BaseModel):
    """Limits across a whole batch. None means unlimited."""

    max_cost_usd: float | None = Field(None, ge=0, description="USD across all items")
    max_tokens: int | None = Field(None, ge=1, description="input+output tokens across all items")
    max_seconds: float | None = Field(None, gt=0, description="wall time of the batch; no item "
                                      "starts after it, and running items are capped to end by it")

    @property
    def empty(self) -> bool:
        return self.max_cost_usd is None and self.max_tokens is None and self.max_seconds is None


@dataclass
class _Attempt:
    reservation: Reservation
    input_tokens: int = 0          # what the attempt is known to have spent so far
    output_tokens: int = 0
    cost: float | None = 0.0


@dataclass
class _Totals:
    items: int = 0                 # attempts settled as finished
    lost: int = 0                  # attempts settled as lost (worker died)
    lost_cost: float = 0.0
    lost_tokens: int = 0
    refused: int = 0
    attempts: dict[str, int] = field(default_factory=dict)


class BatchLedger:
    """Thread-safe accounting of a batch's spend; see the module docstring.

    item_tokens / item_cost: what one attempt reserves (its own caps); None reserves nothing of
    that kind (allowed only when the batch has no limit of that kind).
    """

    def __init__(self, budget: BatchBudget, *, item_tokens: int | None = None,
                 item_cost: float | None = None, start: float | None = None):
        if budget.max_tokens is not None and not item_tokens:
            raise ValueError("a batch max_tokens needs a per-item token cap to reserve")
        if budget.max_cost_usd is not None and item_cost is None:
            raise ValueError("a batch max_cost_usd needs a per-item cost cap to reserve")
        self.budget = budget
        self.item_tokens = int(item_tokens or 0)
        self.item_cost = item_cost
        self._ledger = Ledger(Budget(max_tokens=budget.max_tokens,
                                     max_cost_usd=budget.max_cost_usd,
                                     max_seconds=budget.max_seconds), start=start)
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], _Attempt] = {}
        self._t = _Totals()
        self.stopped: str | None = None     # the limit that stopped the batch, once it did

    # ------------------------------------------------------------ reserve / settle
    def reserve(self, key: str, *, final: bool = True) -> tuple[int | None, str | None]:
        """Open the next attempt of item `key`: (attempt number, None), or (None, limit) when
        the batch cannot afford it. `final=False` (other attempts in flight): a refusal does
        not stop the batch, the caller asks again after one of them settles."""
        with self._lock:
            if self.stopped:
                return None, self.stopped
            try:
                r = self._ledger.reserve(tokens=self.item_tokens, cost=self.item_cost,
                                         subcall=False)
            except BudgetExceeded as e:
                self._t.refused += 1
                self._ledger.exhausted = None    # a refusal alone does not end the batch...
                reached = self._ledger.limit_reached()   # ...settled spend at a limit does
                if final or reached:
                    self.stopped = reached or e.limit
                return None, self.stopped or e.limit
            n = self._t.attempts.get(key, 0) + 1
            self._t.attempts[key] = n
            self._open[(key, n)] = _Attempt(r)
            return n, None

    def report(self, key: str, attempt: int, *, input_tokens: int, output_tokens: int,
               cost: float | None) -> None:
        """What a running attempt has spent so far (cumulative; kept if its worker dies)."""
        with self._lock:
            a = self._open.get((key, attempt))
            if a is not None:
                a.input_tokens, a.output_tokens, a.cost = input_tokens, output_tokens, cost

    def settle(self, key: str, attempt: int, *, input_tokens: int, output_tokens: int,
               cost: float | None) -> bool:
        """A finished attempt's real spend replaces its reservation. False: that attempt was
        already settled (e.g. as lost), and this call changed nothing."""
        with self._lock:
            a = self._open.pop((key, attempt), None)
            if a is None:
                return False
            self._settle(a, input_tokens, output_tokens, cost)
            self._t.items += 1
            return True

    def lost(self, key: str, attempt: int) -> bool:
        """An attempt that will never settle (its worker or node died): settled with what it
        last reported. False: it had settled already."""
        with self._lock:
            a = self._open.pop((key, attempt), None)
            if a is None:
                return False
            self._settle(a, a.input_tokens, a.output_tokens, a.cost)
            self._t.lost += 1
            self._t.lost_cost += a.cost or 0.0
            self._t.lost_tokens += a.input_tokens + a.output_tokens
            return True

    def _settle(self, a: _Attempt, inp: int, out: int, cost: float | None) -> None:
        self._ledger.settle(a.reservation, usage=Usage(input_tokens=inp, output_tokens=out),
                            cost=cost, role="item", model="batch")

    # ------------------------------------------------------------ queries
    def remaining_seconds(self) -> float | None:
        return self._ledger.remaining_seconds()

    def limit_reached(self) -> str | None:
        with self._lock:
            return self.stopped or self._ledger.limit_reached()

    def snapshot(self) -> dict[str, Any]:
        """Spend and counts so far (plain data: what a Ray actor call returns)."""
        with self._lock:
            led = self._ledger
            return {"cost_usd": led.cost_usd, "tokens": led.tokens, "items": self._t.items,
                    "lost_attempts": self._t.lost, "lost_cost_usd": self._t.lost_cost,
                    "lost_tokens": self._t.lost_tokens, "in_flight": len(self._open),
                    "refused": self._t.refused, "stopped": self.stopped,
                    "elapsed_s": round(led.elapsed, 3),
                    "reserve_tokens": self.item_tokens, "reserve_cost_usd": self.item_cost,
                    "budget": self.budget.model_dump()}


def item_caps(budget: BatchBudget, limits: dict[str, Any],
              concurrency: int) -> tuple[dict[str, Any], int | None, float | None]:
    """Per-item limits and what each item reserves. An item's own max_cost_usd / max_tokens
    is its reservation; without one, a batch cap is shared out: each item runs capped at the
    batch's cap divided by `concurrency` (so `concurrency` items fit at once)."""
    caps = dict(limits)
    if budget.max_cost_usd is not None and caps.get("max_cost_usd") is None:
        caps["max_cost_usd"] = budget.max_cost_usd / concurrency
    if budget.max_tokens is not None and caps.get("max_tokens") is None:
        caps["max_tokens"] = max(1, budget.max_tokens // concurrency)
    tokens = caps.get("max_tokens") if budget.max_tokens is not None else None
    cost = caps.get("max_cost_usd") if budget.max_cost_usd is not None else None
    return caps, tokens, cost


def ray_ledger(ray: Any, budget: BatchBudget, **kw: Any) -> Any:
    """The BatchLedger as one Ray actor pinned to this (the driver's) node, so losing a worker
    node never loses the ledger; it takes no CPU slot from the tasks."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=0, max_concurrency=1)(BatchLedger).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False))
    return actor.remote(budget, **kw)


class RemoteLedger:
    """A BatchLedger actor handle with the plain object's (blocking) methods."""

    def __init__(self, handle: Any):
        self.handle = handle

    def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        import ray
        return ray.get(getattr(self.handle, name).remote(*args, **kw))

    def reserve(self, key: str, *, final: bool = True) -> tuple[int | None, str | None]:
        return tuple(self._call("reserve", key, final=final))  # type: ignore[return-value]

    def report(self, key: str, attempt: int, **spend: Any) -> None:
        self.handle.report.remote(key, attempt, **spend)    # fire and forget: ordered per caller

    def settle(self, key: str, attempt: int, **spend: Any) -> bool:
        return bool(self._call("settle", key, attempt, **spend))

    def lost(self, key: str, attempt: int) -> bool:
        return bool(self._call("lost", key, attempt))

    def remaining_seconds(self) -> float | None:
        return self._call("remaining_seconds")   # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        return self._call("snapshot")     # type: ignore[no-any-return]
