"""Budget (the limits of a run) and Ledger (what the whole recursion tree has spent).

The Ledger owns tokens, cost and sub-calls; time is owned by its `Deadline`
(recursa.core.deadline), which the ledger only asks. One Ledger is shared by a top-level run and
every child RLM under it. A model call first *reserves* its worst case (estimated input plus its
output cap); a reservation is never granted if it could push a limit past its bound, so
concurrent calls cannot jointly overshoot. After the call, `settle` replaces the reservation with
the truth. The only overshoot left is one call whose real usage exceeded its estimate, or the
single last-answer turn the root gets at a limit.

Reserving is patient (`areserve`, what the dispatcher uses): a call whose worst case does not fit
*beside the calls in flight* waits for them to settle (a call's true cost is usually far below
its worst case, and settling frees the rest of its reservation), and is refused only when it
could not fit even if every call in flight cost nothing, or nothing is in flight. So ten
parallel sub-calls under a cap that holds only four worst cases all run, four or so at a time,
instead of six failing. A wait ends at the run's deadline. The blocking `reserve` refuses at
once (the batch ledger asks again itself).

A call may also be cut to fit (`areserve(..., cut=...)`): when its worst case does not fit a
cost or token limit even with nothing in flight, it waits until nothing is in flight, then
`cut(tokens_left, cost_left)` may name a smaller worst case that fits the room left (the
dispatcher lowers the call's max_tokens to what that pays for, down to a floor); only when it
names none is the call refused. A cut reservation fits beside nothing in flight, so parallel
calls still never jointly pass a limit.

A cost limit of 0 means no spend at all: even the last-answer turn, which may otherwise pass a
limit, is refused when it has a price.

A ledger may have a parent (a session's, whose limits cap its questions together): every
reservation and settlement is made in both, so the parent's limits apply to each run and its
spend is counted there as it happens, a cancelled run's included.

A cost limit is never void: once a call's cost is unknown (no price, none reported) the limit
counts as reached, so the run stops instead of spending on unmetered.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
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


# (tokens left, cost left) under a run's limits, None where unlimited -> a smaller worst case
# (tokens, cost) that fits them, or None: see `Ledger.areserve`
Cut = Callable[[int | None, float | None], tuple[int, float | None] | None]


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
        self._inflight = 0                  # reservations not settled yet
        self._gen = 0                       # settlements so far (what a waiting call watches)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.exhausted: str | None = None   # name of the first limit that refused a call
        self.cache_hits = 0                 # calls the response cache answered (they cost 0)

    # ------------------------------------------------------------ waiting calls
    def _wake(self) -> None:
        """A reservation settled: wake the calls waiting for room (on whatever loop)."""
        with self._lock:
            self._gen += 1
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, fut)

    def _watch(self, seen: int, fut: asyncio.Future[None]) -> bool:
        """Wake `fut` at the next settlement; False if one happened since `seen` already."""
        with self._lock:
            if self._gen != seen:
                return False
            self._waiters.append((asyncio.get_running_loop(), fut))
            return True

    def _unwatch(self, fut: asyncio.Future[None]) -> None:
        with self._lock:
            self._waiters = [(lp, f) for lp, f in self._waiters if f is not fut]

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
        """Reserve a call's worst case or raise BudgetExceeded naming the limit (at once, even
        when calls in flight could free enough: `areserve` waits for them).

        `force` admits the call regardless (the root's one last answer turn), but for a cost
        limit of 0.
        """
        r = self._try(tokens, cost, subcall, force)
        if isinstance(r, Reservation):
            return r
        raise BudgetExceeded(self._refused(*r))

    async def areserve(self, *, tokens: int, cost: float | None, subcall: bool,
                       force: bool = False, cut: Cut | None = None) -> Reservation:
        """`reserve`, patient: while the call's worst case does not fit only because of what
        calls in flight have reserved, wait for them to settle and try again. Refused (as
        `reserve` refuses) when it could not fit with nothing in flight; at the deadline,
        BudgetExceeded("max_seconds"). With `cut`, a call that does not fit a cost or token
        limit even then waits until nothing is in flight and reserves the smaller worst case
        `cut(tokens_left, cost_left)` names, if any (the reservation's `tokens` and `cost`
        say which)."""
        while True:
            ledgers = self._chain()
            seen = [led._gen for led in ledgers]
            r = self._try(tokens, cost, subcall, force)
            if isinstance(r, Reservation):
                return r
            if not self._could_fit(tokens, cost, subcall):
                if cut is None or r[0] not in ("max_cost_usd", "max_tokens"):
                    raise BudgetExceeded(self._refused(*r))
                if not r[1]._inflight:    # the limiting ledger's calls (its runs' too)
                    smaller = self._cut(cut, subcall)
                    if smaller is None:
                        raise BudgetExceeded(self._refused(*r))
                    return smaller
                # room for a cut is what is left once the calls in flight settle: wait
            left = self.deadline.left(final=force)
            if left is not None and left <= 0:
                raise BudgetExceeded(self._refused("max_seconds", self),
                                     "max_seconds reached while a call waited for calls in "
                                     "flight to settle")
            await _changed(ledgers, seen, left)

    def _cut(self, cut: Cut, subcall: bool) -> Reservation | None:
        """The reservation `cut` names for the room the chain has left (nothing in flight),
        or None when it names none or that does not fit either."""
        tokens_left: int | None = None
        cost_left: float | None = None
        for led in self._chain():
            b = led.budget
            with led._lock:
                if b.max_cost_usd is not None:
                    if not led._cost_known:
                        return None
                    left = b.max_cost_usd - led._cost - led._reserved_cost
                    cost_left = left if cost_left is None else min(cost_left, left)
                if b.max_tokens is not None:
                    n = b.max_tokens - led._tokens - led._reserved_tokens
                    tokens_left = n if tokens_left is None else min(tokens_left, n)
        smaller = cut(tokens_left, cost_left)
        if smaller is None:
            return None
        r = self._try(smaller[0], smaller[1], subcall, False)
        return r if isinstance(r, Reservation) else None

    def _chain(self) -> list[Ledger]:
        out: list[Ledger] = []
        led: Ledger | None = self
        while led is not None:
            out.append(led)
            led = led.parent
        return out

    def _refused(self, limit: str, by: Ledger) -> str:
        """A final refusal by ledger `by`: it and the ledgers between it and this one note
        the limit (a parent's limit ends its children's runs; a child's, not its parent's)."""
        for led in self._chain():
            led.exhausted = led.exhausted or limit
            if led is by:
                break
        return limit

    def _try(self, tokens: int, cost: float | None, subcall: bool,
             force: bool) -> Reservation | tuple[str, Ledger]:
        """A reservation in this ledger and its parents, or (the limit that refused it, the
        ledger whose limit it is); nothing stays reserved then."""
        up: Reservation | None = None
        if self.parent is not None:
            got = self.parent._try(tokens, cost, subcall, force)
            if not isinstance(got, Reservation):
                return got
            up = got
        with self._lock:
            limit = self._over(tokens, cost or 0.0, subcall, force, reserved=True)
            if limit is None:
                self._reserved_tokens += tokens
                self._reserved_cost += cost or 0.0
                self._reserved_subcalls += int(subcall)
                self._inflight += 1
                r = Reservation(tokens=tokens, cost=cost or 0.0, subcall=subcall)
                r.parent = up
                return r
        if up is not None and self.parent is not None:
            self.parent.settle(up, usage=None, cost=None, role="", model="")
        return limit, self

    def _could_fit(self, tokens: int, cost: float | None, subcall: bool) -> bool:
        """Whether the call would fit in every ledger of the chain if the calls in flight
        settled for nothing, and there are such calls to wait for."""
        waitable = False
        for led in self._chain():
            with led._lock:
                if led._over(tokens, cost or 0.0, subcall, False, reserved=False):
                    return False
                if led._over(tokens, cost or 0.0, subcall, False, reserved=True):
                    waitable = waitable or led._inflight > 0
        return waitable

    def _over(self, tokens: int, cost: float, subcall: bool, force: bool, *,
              reserved: bool) -> str | None:
        """The limit this call would pass (with the lock held); `reserved`: counting what
        calls in flight have reserved."""
        b = self.budget
        if b.max_cost_usd is not None and b.max_cost_usd <= 0 and cost > 0:
            return "max_cost_usd"          # no spend at all, not even a forced last turn
        if force:
            return None
        rt, rc, rs = (self._reserved_tokens, self._reserved_cost, self._reserved_subcalls) \
            if reserved else (0, 0.0, 0)
        if self.deadline.reached():
            return "max_seconds"
        if subcall and b.max_subcalls is not None and \
                self._subcalls + rs + 1 > b.max_subcalls:
            return "max_subcalls"
        if b.max_tokens is not None and self._tokens + rt + tokens > b.max_tokens:
            return "max_tokens"
        if b.max_cost_usd is not None and (self._cost + rc + cost > b.max_cost_usd + 1e-9
                                           or not self._cost_known):
            return "max_cost_usd"
        return None

    def settle(self, r: Reservation, *, usage: Usage | None, cost: float | None,
               role: str, model: str) -> None:
        """Replace a reservation by what the call really spent (usage None: it failed free)."""
        if r.parent is not None and self.parent is not None:
            self.parent.settle(r.parent, usage=usage, cost=cost, role=role, model=model)
        try:
            self._settle(r, usage, cost, role, model)
        finally:
            self._wake()

    def _settle(self, r: Reservation, usage: Usage | None, cost: float | None,
                role: str, model: str) -> None:
        with self._lock:
            if r.settled:
                return
            r.settled = True
            self._reserved_tokens -= r.tokens
            self._reserved_cost -= r.cost
            self._reserved_subcalls -= int(r.subcall)
            self._inflight -= 1
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


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _changed(ledgers: list[Ledger], seen: list[int], timeout: float | None) -> None:
    """Return when any of `ledgers` settled a reservation since `seen` (its settlement
    counters), or after `timeout` seconds."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    try:
        if all(led._watch(g, fut) for led, g in zip(ledgers, seen, strict=True)):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout)
    finally:
        for led in ledgers:
            led._unwatch(fut)
