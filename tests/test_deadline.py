"""The deadline owns `max_seconds` as a wall-clock promise (recursa.core.deadline): the last-answer
turn is reserved inside the limit; a session's questions share an allowance; a parent ledger
caps its children's spend."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from recursa import RLM
from recursa.base.types import BudgetExceeded, Usage
from recursa.core.budget import Budget, Ledger
from recursa.core.deadline import Allowance, Deadline, default_reserve
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load

SLACK = 0.5     # the promise is the limit itself; this covers scheduling on a loaded machine


def test_the_two_second_run_with_six_second_replies_ends_within_its_promise(
        tmp_path: Path) -> None:
    # before the deadline owned the time: the work was cut at 2 s and the last-answer turn's
    # own 5 s came on top (ended at ~7 s, status limit)
    client = ReplayClient(lambda m: "```repl\nprint(len(context))\n```", latency=6.0)
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=client, sandbox="inprocess", max_seconds=2, trace_path=trace)
    t0 = time.monotonic()
    res = rlm.completion("How long is it?", context="abc " * 100)
    wall = time.monotonic() - t0
    assert wall < 2 + SLACK, wall
    assert (res.status, res.limit) == ("limit", "max_seconds")
    assert res.trace_path == str(trace)
    turns = [n for n in load(trace).walk() if n.kind == "turn"]
    # the work stopped early enough for the last-answer turn to have its reserved time
    assert len(turns) == 2 and turns[-1].data.get("last")
    assert "max_seconds" in turns[0].data["error"] and "max_seconds" in turns[-1].data["error"]
    assert turns[-1].start - turns[0].start == pytest.approx(2 - default_reserve(2), abs=0.3)


def test_the_last_answer_turn_answers_in_its_reserve(tmp_path: Path) -> None:
    def respond(messages: list[dict[str, str]]) -> str:
        if "reached its limit" in messages[-1]["content"]:
            return "The answer is 400."
        return "```repl\nimport time\ntime.sleep(30)\n```"
    rlm = RLM(model=ReplayClient(respond), sandbox="inprocess", max_seconds=2)
    t0 = time.monotonic()
    res = rlm.completion("How long is it?", context="abc " * 100)
    assert time.monotonic() - t0 < 2 + SLACK
    assert (res.status, res.answer, res.answer_source) == (
        "limit", "The answer is 400.", "extraction_turn")


def test_default_reserve() -> None:
    assert default_reserve(None) == 0.0 and default_reserve(None, 5.0) == 0.0
    assert default_reserve(2.0) == 0.5                  # a quarter
    assert default_reserve(1000.0) == 60.0              # at most a minute
    assert default_reserve(10.0, 3.0) == 3.0            # as set ...
    assert default_reserve(10.0, 8.0) == 5.0            # ... never more than half the limit


async def test_cut_stops_what_runs_at_the_work_end_or_the_final_end() -> None:
    d = Deadline(0.4, reserve=0.2)
    t0 = time.monotonic()
    with pytest.raises(BudgetExceeded, match="during the wait"):
        async with d.cut("the wait"):
            await asyncio.sleep(5)
    assert 0.15 < time.monotonic() - t0 < 0.35 and d.reached() and not d.reached(final=True)
    with pytest.raises(BudgetExceeded, match="before more work"):
        async with d.cut("more work"):
            pass
    with pytest.raises(BudgetExceeded, match="during the last turn"):
        async with d.cut("the last turn", final=True):
            await asyncio.sleep(5)
    assert time.monotonic() - t0 < 0.55 and d.reached(final=True)
    async with Deadline(None).cut("anything"):     # no limit: nothing is cut
        await asyncio.sleep(0)


def test_an_allowance_gives_each_run_what_is_left() -> None:
    a = Allowance(10.0)
    d1 = a.deadline(None)
    assert d1.seconds == 10.0 and d1.reserve == 2.5
    d1.start -= 7.0                                   # the first run took 7 s
    d1.close()
    d1.close()                                        # counted once
    assert a.used == pytest.approx(7.0, abs=0.05)
    d2 = a.deadline(5.0, last_turn_seconds=1.0)
    assert d2.seconds == pytest.approx(3.0, abs=0.05) and d2.reserve == 1.0
    assert Allowance(None).deadline(None).seconds is None


def test_a_parent_ledger_caps_and_counts_its_childrens_spend() -> None:
    parent = Ledger(Budget(max_tokens=1000))
    a, b = Ledger(Budget(), parent=parent), Ledger(Budget(), parent=parent)
    r = a.reserve(tokens=600, cost=0.0, subcall=True)
    with pytest.raises(BudgetExceeded) as e:          # the parent's room is reserved
        b.reserve(tokens=600, cost=0.0, subcall=True)
    assert e.value.limit == "max_tokens" and b.exhausted == "max_tokens"
    a.settle(r, usage=Usage(input_tokens=500, output_tokens=100), cost=0.01, role="sub",
             model="m")
    assert (a.tokens, parent.tokens, parent.subcalls) == (600, 600, 1)
    assert parent.cost_usd == pytest.approx(0.01)
    r2 = b.reserve(tokens=300, cost=0.0, subcall=False)
    b.settle(r2, usage=Usage(input_tokens=300, output_tokens=100), cost=None, role="root",
             model="m")
    assert parent.tokens == 1000 and parent.cost_usd is None
    assert b.limit_reached() == "max_tokens"          # reached in the parent
    with pytest.raises(BudgetExceeded):
        a.reserve(tokens=1, cost=0.0, subcall=False)


def test_session_seconds_are_an_allowance_across_questions() -> None:
    client = ReplayClient(lambda m: "```repl\nimport time\ntime.sleep(0.6)\nFINAL('ok')\n```")
    with RLM(model=client, sandbox="inprocess").session("abc " * 50, max_seconds=60) as s:
        r1 = s.completion("q1")
        r2 = s.completion("q2")
        assert (r1.answer, r2.answer) == ("ok", "ok")
        assert s.spent.elapsed_s == pytest.approx(r1.elapsed_s + r2.elapsed_s, abs=0.2)
        assert s.spent.elapsed_s >= 1.2
