"""Cost limits exact, not timid: a call whose worst case does not fit beside the calls in flight
waits for them to settle instead of failing (recursa.core.budget.Ledger.areserve), parallel calls
still never jointly pass a limit, and a cost limit of 0 makes no call at all."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers_scripted import is_root, repl
from openai_testserver import OpenAITestServer
from recursa import RLM
from recursa.base.types import BudgetExceeded, Usage
from recursa.core.budget import Budget, Ledger
from recursa.core.deadline import Deadline

PRICE = {"openai:test-model": (0.25, 2.0)}   # USD per 1M tokens in / out


# ------------------------------------------------------------------ the Ledger alone
@given(cap=st.floats(0.01, 0.05), n=st.integers(2, 24),
       worst=st.floats(0.002, 0.01), share=st.floats(0.01, 0.3), seed=st.integers(0, 99))
@settings(max_examples=40, deadline=None)
def test_parallel_calls_wait_for_room_and_never_jointly_overshoot(cap, n, worst, share, seed):
    """`n` calls at once, each reserving `worst` and costing `share` of it: every call runs
    (the cap holds all their true costs), spent + reserved never passes the cap."""
    assume(n * worst * share + worst <= cap)   # the true costs leave room for a worst case
    rnd = random.Random(seed)
    ledger = Ledger(Budget(max_cost_usd=cap))
    peak = [0.0]

    async def call() -> None:
        r = await ledger.areserve(tokens=10, cost=worst, subcall=True)
        peak[0] = max(peak[0], ledger.cost_spent + ledger._reserved_cost)
        await asyncio.sleep(rnd.random() / 500)
        ledger.settle(r, usage=Usage(input_tokens=5), cost=worst * share, role="sub",
                      model="m")

    async def main() -> None:
        await asyncio.gather(*(call() for _ in range(n)))

    asyncio.run(main())
    assert ledger.subcalls == n and ledger.exhausted is None
    assert peak[0] <= cap + 1e-9
    assert ledger.cost_spent == pytest.approx(n * worst * share)


def test_a_call_is_refused_at_once_when_nothing_in_flight_could_free_enough():
    ledger = Ledger(Budget(max_cost_usd=0.01))

    async def main() -> None:
        with pytest.raises(BudgetExceeded):                 # bigger than the cap itself
            await ledger.areserve(tokens=1, cost=0.02, subcall=True)
        r = await ledger.areserve(tokens=1, cost=0.006, subcall=True)
        ledger.settle(r, usage=Usage(input_tokens=1), cost=0.006, role="sub", model="m")
        with pytest.raises(BudgetExceeded):                 # nothing in flight, no room left
            await asyncio.wait_for(ledger.areserve(tokens=1, cost=0.005, subcall=True), 2)

    asyncio.run(main())
    assert ledger.exhausted == "max_cost_usd"


def test_a_waiting_call_ends_at_the_deadline():
    ledger = Ledger(Budget(max_cost_usd=0.01), deadline=Deadline(0.3))

    async def main() -> None:
        await ledger.areserve(tokens=1, cost=0.008, subcall=True)   # never settles
        with pytest.raises(BudgetExceeded) as e:
            await asyncio.wait_for(ledger.areserve(tokens=1, cost=0.008, subcall=True), 5)
        assert e.value.limit == "max_seconds"

    asyncio.run(main())


def test_a_child_ledgers_refusal_leaves_its_parent_untouched():
    parent = Ledger(Budget(max_cost_usd=1.0))
    child = Ledger(Budget(max_cost_usd=0.01), parent=parent)
    with pytest.raises(BudgetExceeded):
        child.reserve(tokens=1, cost=0.02, subcall=True)
    assert child.exhausted == "max_cost_usd" and parent.exhausted is None
    assert parent._reserved_cost == 0 and parent._inflight == 0
    r = child.reserve(tokens=1, cost=0.005, subcall=True)
    assert parent._reserved_cost == pytest.approx(0.005)
    child.settle(r, usage=Usage(input_tokens=1), cost=0.001, role="sub", model="m")
    assert parent.cost_spent == pytest.approx(0.001) and parent._inflight == 0


# ------------------------------------------------------------------ whole runs over HTTP
def batch_responder(req: dict) -> str:
    """Root: ten sub-calls in one batch, then their answers; sub-calls answer 'ok'."""
    msgs = req["messages"]
    if not is_root(msgs):
        return "ok"
    if not any(m["role"] == "assistant" for m in msgs):
        return repl("r = llm_batch([f'part {i}' for i in range(10)])\n"
                    "print(sum(x == 'ok' for x in r))")
    return repl("FINAL(str(sum(x == 'ok' for x in r)) + ' ok')")


def run(srv: OpenAITestServer, **limits) -> object:
    return RLM(model="openai:test-model", base_url=srv.base_url, api_key="test-key",
               sandbox="inprocess", prices=PRICE, **limits).completion("count", context="ctx")


def test_parallel_sub_calls_under_a_cost_cap_finish_as_uncapped():
    """Ten sub-calls each reserving ~$0.0045 (2,048 output tokens at $2/M) under a $0.02 cap:
    they used to be refused after four, ending the run at the limit with no answer."""
    with OpenAITestServer(responder=batch_responder, latency=0.02) as srv:
        free = run(srv)
        capped = run(srv, max_cost_usd=0.02)
    assert free.status == "final" and free.answer == "10 ok"
    assert (capped.status, capped.answer, capped.limit) == ("final", "10 ok", None)
    assert capped.subcalls == 10
    assert capped.cost_usd is not None and capped.cost_usd <= 0.02


def test_a_cost_cap_of_zero_makes_no_call():
    with OpenAITestServer(responder=batch_responder) as srv:
        res = run(srv, max_cost_usd=0)
        assert srv.request_count == 0
    assert res.status == "limit" and res.limit == "max_cost_usd" and res.answer == ""
    assert res.cost_usd == 0


def test_a_worst_case_uses_the_calls_real_output_cap():
    """The reservation's output part is the call's own max_tokens, else the cap the client
    declares for calls that set none, else 2,048 tokens."""
    from recursa.core.dispatch import DEFAULT_OUTPUT_RESERVE, output_cap
    from recursa.models.openai_client import OpenAIClient
    capped = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k",
                          default_options={"max_tokens": 300})
    plain = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert output_cap(capped, {}, 100) == 300
    assert output_cap(capped, {"max_tokens": 50}, 100) == 50
    assert output_cap(plain, {}, 100) == DEFAULT_OUTPUT_RESERVE


# ------------------------------------------------------------------ a call cut to the room left
def halves(tokens_left, cost_left):
    """A `cut` that asks for half the cost left (None: nothing, when under $0.001)."""
    if cost_left is None or cost_left < 0.001:
        return None
    return 10, cost_left / 2


def test_a_call_past_the_room_left_is_cut_once_nothing_is_in_flight():
    """$0.006 spent of $0.01: a $0.005 worst case never fits; it waits for the call in flight
    (whose true cost frees the rest of its reserve), then takes the cut the room allows."""
    ledger = Ledger(Budget(max_cost_usd=0.01))
    done = ledger.reserve(tokens=1, cost=0.006, subcall=True)
    ledger.settle(done, usage=Usage(input_tokens=1), cost=0.006, role="sub", model="m")

    async def main() -> float:
        flying = ledger.reserve(tokens=1, cost=0.003, subcall=True)
        waiter = asyncio.create_task(ledger.areserve(tokens=1, cost=0.005, subcall=True,
                                                     cut=halves))
        await asyncio.sleep(0.05)
        assert not waiter.done()               # a cut now would be sized beside a reserve
        ledger.settle(flying, usage=Usage(input_tokens=1), cost=0.001, role="sub", model="m")
        r = await asyncio.wait_for(waiter, 2)
        return r.cost

    assert asyncio.run(main()) == pytest.approx(0.0015)    # half of 0.01 - 0.007
    assert ledger.exhausted is None


def test_a_cut_below_its_floor_is_refused():
    from recursa.core.dispatch import MIN_CUT_OUTPUT, output_cut
    from recursa.models.openai_client import OpenAIClient
    client = OpenAIClient("gpt-5-mini", base_url="http://127.0.0.1:9/v1", api_key="k")
    cut = output_cut(client, 1000, 2048)
    tokens, cost = cut(None, 0.003)              # $0.25 / $2 per 1M: 1,375 tokens of output
    assert tokens == 1000 + 1375 and cost is not None and cost <= 0.003
    assert cut(None, 0.0008) == (1000 + 275, 0.0008)
    assert cut(None, 0.0007) is None             # 225 tokens of room: under the floor
    assert cut(1000 + MIN_CUT_OUTPUT - 1, None) is None
    assert cut(1600, None)[0] == 1600              # a token limit alone
    ledger = Ledger(Budget(max_cost_usd=0.0007))
    with pytest.raises(BudgetExceeded):
        asyncio.run(ledger.areserve(tokens=3048, cost=0.0043, subcall=True, cut=cut))
    assert ledger.exhausted == "max_cost_usd"


def long_plan_responder(req: dict) -> str:
    """Root: a long first turn (1,200 words of plan, ~$0.0025 of output) and one sub-call,
    then the sub-call's answer."""
    msgs = req["messages"]
    if not is_root(msgs):
        return "ok"
    if not any(m["role"] == "assistant" for m in msgs):
        return repl("# " + "plan " * 1200 + "\nr = llm_query('part')\nprint(r)")
    return repl("FINAL(r + ' done')")


def test_a_call_whose_worst_case_no_longer_fits_is_sent_with_a_smaller_cap():
    """A run that costs ~$0.0039 under a $0.005 cap: after the long first turn, neither the
    sub-call's worst case (2,048 output tokens) nor the next root turn's fits beside what is
    spent; they used to be refused, ending the run with no answer. Now each goes out with
    max_tokens cut to what the rest of the cap pays for, and the run answers as uncapped."""
    with OpenAITestServer(responder=long_plan_responder) as srv:
        free = RLM(model="openai:test-model", base_url=srv.base_url, api_key="test-key",
                   sandbox="inprocess", prices=PRICE).completion("q", context="ctx")
        srv.requests.clear()
        capped = RLM(model="openai:test-model", base_url=srv.base_url, api_key="test-key",
                     sandbox="inprocess", prices=PRICE,
                     max_cost_usd=0.005).completion("q", context="ctx")
        caps = [r.get("max_tokens") for r in srv.requests]
    assert free.status == "final" and free.answer == "ok done"
    assert (capped.status, capped.answer) == ("final", "ok done"), capped.error
    assert capped.cost_usd is not None and capped.cost_usd <= 0.005
    assert caps[0] is None and all(c is not None and 256 <= c < 2048 for c in caps[1:]), caps
