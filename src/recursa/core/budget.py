"""Budget (the limits of a run) and Ledger (what the whole recursion tree has spent).

The Ledger owns tokens, cost and sub-calls; time is owned by its `Deadline`
(recursa.core.deadline), which the ledger only asks. One Ledger is shared by a top-level run and every child RLM under it. A model call first
*reserves* its worst case (estimated input plus its output cap); the reservation is refused if
it could push a limit past its bound, so concurrent calls cannot jointly overshoot. After the call,
`settle` replaces the reservation with the truth. The only overshoot left is one call whose real
usage exceeded its estimate, or the single last-answer turn the root gets at a limit.

A ledger may have a parent (a session's, whose limits cap its questions together): every
reservation and settlement is made in both, so the parent's limits apply to each run and its
spend is counted there as it happens, a cancelled run's included.

A cost limit is never void: once a call's cost is unknown (no price, none reported) the limit
counts as reached, so the run stops instead of spending on unmetered.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pydantic import BaseModel, Field

from recursa.base.types import BudgetExceeded, RoleUsage, Usage
from recursa.core.deadline import Deadline, default_reserve


class Budget(BaseModel):
    """Limits for one top-level run. None means unlimited."""

    max_iterations: int = Field(30, ge=1, description="root turns per RLM (each child has its own)")
    max_depth: int = Field(1, ge=0, description="rlm_query depth; at the limit it is a plain call")
    max_subcalls: int | None = Field(None, ge=0, description="sub-model calls across the tree")
    max_tokens: int | None = Field(None, ge=1, description="input+output tokens across the tree")
    max_cost_usd: float | None = Field(None, ge=0)
    max_seconds: float | None = Field(None, gt=0, description="wall time of the whole run")
    cell_timeout: float = Field(120.0, gt=0, description="seconds of code time per cell")
    max_consecutive_errors: int = Field(5, ge=1)


@dataclass
class Reservation:
    tokens: int
    cost: float
    subcall: bool
    settled: bool = False
    parent: Reservation | None = None    # the same call's reservation in the parent ledger


class Ledger:
    """Thread-safe spend accounting shared across a recursion tree."""

    def __init__(self, budget: Budget, *, start: float | None = None,
                 deadline: Deadline | None = None, parent: Ledger | None = None):
        """`deadline`: the run's time (default: `budget.max_seconds` from `start`, a quarter
        kept for the last-answer turn); `parent`: a ledger whose limits apply too."""
        self.budget = budget
        self.deadline = deadline if deadline is not None else Deadline(
            budget.max_seconds, reserve=default_reserve(budget.max_seconds),
            start=time.monotonic() if start is None else start)
        self.parent = parent
        self._lock = threading.Lock()
        self._tokens = 0
        self._cost = 0.0
        self._cost_known = True
        self._subcalls = 0
        self._reserved_tokens = 0
        self._reserved_cost = 0.0
        self._reserved_subcalls = 0
        self.by_role: dict[str, RoleUsage] = {}
        self.by_model: dict[str, RoleUsage] = {}
        self.exhausted: str | None = None   # name of the first limit that refused a call
        self.cache_hits = 0                 # calls the response cache answered (they cost 0)

    # ------------------------------------------------------------ queries
    @property
    def start(self) -> float:
        return self.deadline.start

    @property
    def elapsed(self) -> float:
        return self.deadline.elapsed

    def remaining_seconds(self) -> float | None:
        """Seconds the work has left (the deadline's, the last-answer turn's reserve kept)."""
        return self.deadline.left()

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def subcalls(self) -> int:
        return self._subcalls

    @property
    def cost_usd(self) -> float | None:
        return self._cost if self._cost_known else None

    @property
    def cost_spent(self) -> float:
        """Known cost so far (calls without a price count as 0 here)."""
        return self._cost

    def limit_reached(self, *, subcalls: bool = True) -> str | None:
        """The name of a limit already reached by settled spend (not counting reservations).

        With `subcalls=False` the sub-call limit is ignored: a root that may make no more
        sub-calls can still work with code, so it does not end the root's turns.
        """
        b = self.budget
        if self.deadline.reached():
            return "max_seconds"
        if b.max_tokens is not None and self._tokens >= b.max_tokens:
            return "max_tokens"
        if b.max_cost_usd is not None and (self._cost >= b.max_cost_usd - 1e-9
                                           or not self._cost_known):
            return "max_cost_usd"
        if subcalls and b.max_subcalls is not None and self._subcalls >= b.max_subcalls:
            return "max_subcalls"
        if self.exhausted == "max_subcalls" and not subcalls:
            return None
        return self.exhausted or (self.parent.limit_reached(subcalls=subcalls)
                                  if self.parent is not None else None)

    # ------------------------------------------------------------ reserve / settle
    def reserve(self, *, tokens: int, cost: float | None, subcall: bool,
                force: bool = False) -> Reservation:
        """Reserve a call's worst case or raise BudgetExceeded naming the limit.

        `force` admits the call regardless (the root's one last answer turn).
        """
        up, parent = None, self.parent
        if parent is not None:
            try:
                up = parent.reserve(tokens=tokens, cost=cost, subcall=subcall, force=force)
            except BudgetExceeded as e:
                self.exhausted = self.exhausted or e.limit
                raise
        try:
            r = self._reserve(tokens=tokens, cost=cost, subcall=subcall, force=force)
        except BudgetExceeded:
            if parent is not None and up is not None:
                parent.settle(up, usage=None, cost=None, role="", model="")
            raise
        r.parent = up
        return r

    def _reserve(self, *, tokens: int, cost: float | None, subcall: bool,
                 force: bool) -> Reservation:
        cost = cost or 0.0
        b = self.budget
        with self._lock:
            if not force:
                limit = None
                if self.deadline.reached():
                    limit = "max_seconds"
                elif subcall and b.max_subcalls is not None and (
                        self._subcalls + self._reserved_subcalls + 1 > b.max_subcalls):
                    limit = "max_subcalls"
                elif b.max_tokens is not None and (
                        self._tokens + self._reserved_tokens + tokens > b.max_tokens):
                    limit = "max_tokens"
                elif b.max_cost_usd is not None and (
                        self._cost + self._reserved_cost + cost > b.max_cost_usd + 1e-9
                        or not self._cost_known):
                    limit = "max_cost_usd"
                if limit:
                    self.exhausted = self.exhausted or limit
                    raise BudgetExceeded(limit)
            self._reserved_tokens += tokens
            self._reserved_cost += cost
            self._reserved_subcalls += int(subcall)
            return Reservation(tokens=tokens, cost=cost, subcall=subcall)

    def settle(self, r: Reservation, *, usage: Usage | None, cost: float | None,
               role: str, model: str) -> None:
        """Replace a reservation by what the call really spent (usage None: it failed free)."""
        if r.parent is not None and self.parent is not None:
            self.parent.settle(r.parent, usage=usage, cost=cost, role=role, model=model)
        with self._lock:
            if r.settled:
                return
            r.settled = True
            self._reserved_tokens -= r.tokens
            self._reserved_cost -= r.cost
            self._reserved_subcalls -= int(r.subcall)
            if usage is None:
                return
            self._tokens += usage.total_tokens
            self._subcalls += int(r.subcall)
            if cost is None:
                self._cost_known = False
            else:
                self._cost += cost
            for table, key in ((self.by_role, role), (self.by_model, model)):
                ru = table.setdefault(key, RoleUsage())
                ru.calls += 1
                ru.usage = ru.usage + usage
                if cost is None or ru.cost_usd is None:
                    ru.cost_usd = None
                else:
                    ru.cost_usd += cost
