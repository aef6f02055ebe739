"""Property tests: no limit (calls, tokens, cost, time, depth) is overshot by more than one call,
with 64 parallel sub-calls and nested children, whatever the limits and the models' sizes."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers_scripted import SYSTEM_MARK
from recursa import RLM
from recursa.base.types import BudgetExceeded, Usage
from recursa.core.budget import Budget, Ledger
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load

FAST = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------ the Ledger alone
@given(limit_tokens=st.integers(1, 5000), limit_calls=st.integers(0, 40),
       limit_cost=st.floats(0, 2, allow_nan=False),
       calls=st.lists(st.tuples(st.integers(1, 800), st.floats(0, 0.3, allow_nan=False),
                                st.floats(0.05, 1.0, allow_nan=False), st.booleans()),
                      min_size=1, max_size=120),
       threads=st.sampled_from([1, 8]))
@settings(max_examples=150, deadline=None)
def test_ledger_never_overshoots(limit_tokens, limit_calls, limit_cost, calls, threads):
    """Interleaved reserve/settle from 8 threads, real usage at most the reservation (the
    dispatcher reserves the output cap): no limit is overshot at all."""
    ledger = Ledger(Budget(max_tokens=limit_tokens, max_subcalls=limit_calls,
                           max_cost_usd=limit_cost))
    biggest = {"tokens": 0, "cost": 0.0}
    lock = threading.Lock()
    work = list(calls)

    def worker() -> None:
        while True:
            with lock:
                if not work:
                    return
                tokens, cost, factor, sub = work.pop()
            try:
                r = ledger.reserve(tokens=tokens, cost=cost, subcall=sub)
            except BudgetExceeded:
                continue
            real_t = max(1, int(tokens * factor))
            real_c = cost * factor
            with lock:
                biggest["tokens"] = max(biggest["tokens"], real_t)
                biggest["cost"] = max(biggest["cost"], real_c)
            time.sleep(random.random() / 5000)
            ledger.settle(r, usage=Usage(input_tokens=real_t), cost=real_c, role="sub",
                          model="m")

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert ledger.subcalls <= limit_calls
    assert ledger.tokens <= limit_tokens
    assert ledger.cost_spent <= limit_cost + 1e-9


@given(limit=st.integers(1, 3000),
       calls=st.lists(st.tuples(st.integers(1, 400), st.floats(1.0, 4.0, allow_nan=False)),
                      min_size=1, max_size=60))
@settings(max_examples=150, deadline=None)
def test_sequential_underestimates_overshoot_by_at_most_one_call(limit, calls):
    """A call may use more than it reserved (a tokenizer denser than the estimate): one at a
    time, the limit is then overshot by that one call only."""
    ledger = Ledger(Budget(max_tokens=limit))
    biggest = 0
    for tokens, factor in calls:
        if ledger.limit_reached():
            break
        try:
            r = ledger.reserve(tokens=tokens, cost=0.0, subcall=True)
        except BudgetExceeded:
            continue
        real = max(1, int(tokens * factor))
        biggest = max(biggest, real)
        ledger.settle(r, usage=Usage(input_tokens=real), cost=0.0, role="sub", model="m")
    assert ledger.tokens <= limit + biggest


# ------------------------------------------------------------------ whole runs
class PricedReplay(ReplayClient):
    """A scripted model with a known price: every call costs (and is estimated at) $0.01."""

    def estimate_cost(self, input_tokens: int, output_tokens: int) -> float:
        return 0.01


def tree_client(fan_out: int, children: int, child_fan: int, latency: float):
    """Root: one cell with a batch of `fan_out` sub-calls and `children` child RLMs (each
    making `child_fan` sub-calls), then FINAL. Sub-calls answer 'ok'."""
    root_code = (f"r = llm_batch([f'p{{i}}' for i in range({fan_out})])\n"
                 f"c = rlm_batch([f'child {{i}}' for i in range({children})])\n"
                 "print(sum(x.startswith('Error') for x in r + c), 'failed')")
    child_code = (f"r = llm_batch([f'cp{{i}}' for i in range({child_fan})])\n"
                  "FINAL(str(sum(not x.startswith('Error') for x in r)))")
    turns = {"root": 0}

    def respond(messages):
        if SYSTEM_MARK not in messages[0]["content"]:
            return "ok"
        if "child " in messages[1]["content"]:
            return f"```repl\n{child_code}\n```"
        turns["root"] += 1
        return f"```repl\n{root_code}\n```" if turns["root"] == 1 else \
            "```repl\nFINAL('done')\n```"
    return PricedReplay(respond, cost_usd=0.01, latency=latency)


@pytest.mark.slow
@given(max_subcalls=st.integers(0, 80), children=st.integers(0, 4),
       child_fan=st.integers(0, 16))
@FAST
def test_subcall_limit_with_64_parallel_calls_and_children(max_subcalls, children, child_fan,
                                                          tmp_path):
    client = tree_client(64, children, child_fan, latency=0.001)
    res = RLM(model=client, sandbox="inprocess", max_subcalls=max_subcalls, max_depth=1,
              concurrency=64).completion("q", context="ctx")
    assert res.subcalls <= max_subcalls
    assert res.subcalls == min(max_subcalls, 64 + children * child_fan) or res.subcalls <= \
        max_subcalls


@pytest.mark.slow
@given(max_tokens=st.integers(2000, 60000), children=st.integers(0, 3))
@FAST
def test_token_limit_with_parallel_calls_and_children(max_tokens, children, tmp_path):
    client = tree_client(64, children, 8, latency=0.001)
    res = RLM(model=client, sandbox="inprocess", max_tokens=max_tokens, max_depth=1,
              concurrency=64).completion("q", context="ctx")
    spent = sum(u.usage.total_tokens for u in res.usage.values())
    biggest = max(max(1, sum(len(m["content"]) for m in c) // 4) + 10 for c in client.calls)
    # the single last-answer turn is admitted past the limit: it is the "one call"
    assert spent <= max_tokens + biggest


@pytest.mark.slow
@given(max_cost=st.floats(0.0, 1.2, allow_nan=False))
@FAST
def test_cost_limit_with_64_parallel_calls(max_cost, tmp_path):
    client = tree_client(64, 0, 0, latency=0.001)
    res = RLM(model=client, sandbox="inprocess", max_cost_usd=max_cost,
              concurrency=64).completion("q", context="ctx")
    assert res.cost_usd is not None
    assert res.cost_usd <= max_cost + 0.01 + 1e-9     # every call costs 0.01


def test_cost_limit_with_children_at_the_limit_overshoots_by_one_call_only():
    # 1 root turn + 49 sub-calls reach $0.50; the child then gets a forced last turn, and so
    # does the root: $0.52, two calls over.
    client = tree_client(64, 1, 8, latency=0.001)
    res = RLM(model=client, sandbox="inprocess", max_cost_usd=0.5, max_depth=1,
              concurrency=64).completion("q", context="ctx")
    assert res.cost_usd is not None
    assert res.cost_usd <= 0.5 + 0.01 + 1e-9


def test_cost_limit_with_an_unpriced_sub_model_first_batch():
    code = "r = llm_batch([f'p{i}' for i in range(64)])\nFINAL('x')"
    root = ReplayClient(lambda m: f"```repl\n{code}\n```", cost_usd=0.0, name="replay:root")
    sub = ReplayClient(lambda m: "ok", cost_usd=0.01, name="replay:sub")
    res = RLM(model=root, sub_model=sub, sandbox="inprocess", max_cost_usd=0.05,
              concurrency=64).completion("q", context="ctx")
    assert res.cost_usd <= 0.05 + 0.01 + 1e-9


@pytest.mark.slow
@given(max_depth=st.integers(0, 3))
@settings(max_examples=4, deadline=None)
def test_depth_limit_is_never_exceeded(max_depth, tmp_path_factory):
    code = "print(rlm_query('go deeper', context='deeper context'))\nFINAL('d')"

    def respond(messages):
        if SYSTEM_MARK not in messages[0]["content"]:
            return "leaf"
        return f"```repl\n{code}\n```"

    trace = tmp_path_factory.mktemp("depth") / "t.jsonl"
    res = RLM(model=ReplayClient(respond), sandbox="inprocess", max_depth=max_depth,
              trace_path=trace).completion("q", context="ctx")
    assert res.status == "final"
    run = load(trace)
    depths = [n.depth for n in run.nodes.values() if n.kind == "child"]
    assert max(depths, default=0) == max_depth
    assert sorted(depths) == list(range(1, max_depth + 1))


@pytest.mark.slow
@given(max_seconds=st.floats(0.5, 2.0), latency=st.floats(0.05, 0.3))
@settings(max_examples=5, deadline=None)
def test_time_limit_overshoots_by_at_most_one_call(max_seconds, latency):
    code = ("import itertools\n"
            "for i in itertools.count():\n"
            "    r = llm_batch([f'p{i}-{j}' for j in range(64)])\n"
            "    if all(x.startswith('Error') for x in r): break\n"
            "print(i)")
    async def respond(messages):
        if SYSTEM_MARK in messages[0]["content"]:
            return f"```repl\n{code}\n```"
        await asyncio.sleep(latency)
        return "ok"

    client = ReplayClient(respond)
    t0 = time.monotonic()
    res = RLM(model=client, sandbox="inprocess", max_seconds=max_seconds, concurrency=64,
              max_iterations=3).completion("q", context="ctx")
    took = time.monotonic() - t0
    assert res.status in ("limit", "extracted")
    # one sub-call round and the last-answer turn may run past the limit
    assert took <= max_seconds + latency + 1.5


def test_an_unknown_cost_ends_the_room_of_a_cost_cap():
    """A cost limit is never void: once a call's cost is unknown, the limit counts as reached
    (the root still gets its one forced last turn); without a cap nothing changes."""
    from recursa.base.types import BudgetExceeded, Usage
    from recursa.core.budget import Budget, Ledger
    led = Ledger(Budget(max_cost_usd=1.0))
    r = led.reserve(tokens=10, cost=None, subcall=True)
    led.settle(r, usage=Usage(input_tokens=5), cost=None, role="sub", model="m")
    assert led.limit_reached() == "max_cost_usd" and led.cost_usd is None
    with pytest.raises(BudgetExceeded) as e:
        led.reserve(tokens=1, cost=0.0, subcall=False)
    assert e.value.limit == "max_cost_usd"
    led.reserve(tokens=1, cost=None, subcall=False, force=True)
    free = Ledger(Budget())
    r = free.reserve(tokens=10, cost=None, subcall=True)
    free.settle(r, usage=Usage(input_tokens=5), cost=None, role="sub", model="m")
    assert free.limit_reached() is None
    free.reserve(tokens=10, cost=None, subcall=True)
