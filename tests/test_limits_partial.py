"""A limit never turns finished work into "none": a map cut by the time limit answers from the
part it finished and says so, a plan that cannot finish in time is not started, and a map's
progress is in the trace (scripted models, the in-process sandbox, the real dispatcher)."""

from __future__ import annotations

import json
from pathlib import Path

from recursa import RLM
from recursa.base.types import Completion, Timing, Usage
from recursa.core.combinators import leaf_item
from recursa.core.pace import Pace
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

RECORDS = "\n".join(f"Note {i} | Desk: {'North' if i % 2 else 'South'} | " +
                    ("the pump leaked again" if i % 3 == 0 else "all dry this week")
                    for i in range(1, 41))


def _root(plan: dict, count: str = '{"op": "how_many"}', timing: Timing | None = None,
          name: str = "local:fake"):
    def respond(messages):
        first = messages[0]["content"]
        if first.startswith("You plan"):
            text = json.dumps(plan)
            return Completion(text=text, usage=Usage(input_tokens=700, output_tokens=30),
                              timing=timing) if timing else text
        if first.startswith("A program has labelled every record"):
            return count
        if first.startswith("A program has read"):
            return "none"
        return '```repl\nFINAL("from the code loop")\n```'
    return ReplayClient(respond, name=name)


def _judge(messages) -> str:
    record = leaf_item(messages[-1]["content"])    # the record, not the question
    return "pump leaked" if "leaked" in record else "dry"


PLAN = {"plan": "label_count", "label": "pump leaked", "opposite": "dry", "group_by": ""}


def test_a_map_cut_by_the_time_limit_answers_from_the_records_it_judged(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    sub = ReplayClient(_judge, name="local:fake-sub", latency=0.25)
    rlm = RLM(model=_root(PLAN), sub_model=sub, sandbox="inprocess", strategy="plan",
              preflight=False, trace_path=trace, max_seconds=5, concurrency=1)
    res = rlm.completion("How many of the notes say the pump leaked?", context=RECORDS)
    # the answer is the count of the leaks among the notes judged, said to rest on part
    assert (res.status, res.limit) == ("limit", "max_seconds"), (res.status, res.error)
    assert res.partial and res.partial.endswith("of 40 records judged before max_seconds")
    done = int(res.partial.split()[0])
    assert 0 < done < 40, res.partial
    assert res.answer == str(sum(1 for i in range(1, done + 1) if i % 3 == 0))
    evs = load_events(trace)
    end = next(e for e in evs if e.kind == "combinator" and e.phase == "end")
    assert end.data["partial"] == {"done": done, "total": 40, "limit": "max_seconds"}
    final = next(e for e in evs if e.kind == "final")
    assert final.data["partial"] == res.partial
    # no leaf outlived the map, and the cell was not cut (its counts reached the root)
    starts = {e.id for e in evs if e.kind == "subcall" and e.phase == "start"}
    ends = {e.id for e in evs if e.kind == "subcall" and e.phase == "end"}
    assert starts == ends
    cells = [e.data for e in evs if e.kind == "cell" and e.phase == "end"]
    assert not any(c.get("timed_out") for c in cells)
    assert any("partial:" in c["output"] and "records labelled" in c["output"] for c in cells)


def test_a_map_reports_its_progress_as_it_goes(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    sub = ReplayClient(_judge, name="local:fake-sub", latency=0.12)
    rlm = RLM(model=_root(PLAN), sub_model=sub, sandbox="inprocess", strategy="plan",
              preflight=False, trace_path=trace, concurrency=2)
    res = rlm.completion("How many of the notes say the pump leaked?", context=RECORDS)
    assert res.status == "final" and res.answer == "13" and res.partial is None
    ups = [e.data for e in load_events(trace) if e.kind == "combinator" and e.phase == "update"]
    assert len(ups) >= 2                                  # during the map, not only at its end
    assert [u["done"] for u in ups] == sorted(u["done"] for u in ups)
    assert ups[-1]["done"] == ups[-1]["total"] == 40
    mid = [u for u in ups if 0 < u["done"] < 40]
    assert mid and all(u["rate_per_s"] > 0 and u["eta_s"] >= 0 for u in mid)


def test_a_plan_that_cannot_finish_in_time_at_the_measured_pace_is_not_started(tmp_path):
    # the planning call says this machine reads 20 tokens a second: 40 leaves cannot fit 30 s
    slow = Timing(prompt_tokens=700, prompt_s=35.0, output_tokens=30, output_s=3.0)
    root = _root(PLAN, timing=slow)
    sub = ReplayClient(_judge, name="local:fake")      # the same model: the same server
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=root, sub_model=sub, sandbox="inprocess", strategy="plan",
              preflight=False, trace_path=trace, max_seconds=30)
    res = rlm.completion("How many of the notes say the pump leaked?", context=RECORDS)
    assert (res.status, res.limit) == ("limit", "max_seconds")
    assert "not started" in res.error and "pace measured on this machine" in res.error
    assert sub.calls == [] and res.subcalls == 0
    plan_end = next(e for e in load_events(trace) if e.kind == "plan" and e.phase == "end")
    assert "not started" in plan_end.data["error"]


def test_the_same_plan_runs_when_the_pace_says_it_fits():
    fast = Timing(prompt_tokens=700, prompt_s=0.5, output_tokens=30, output_s=0.3)
    root = _root(PLAN, timing=fast)
    sub = ReplayClient(_judge, name="local:fake")
    rlm = RLM(model=root, sub_model=sub, sandbox="inprocess", strategy="plan",
              preflight=False, max_seconds=30)
    res = rlm.completion("How many of the notes say the pump leaked?", context=RECORDS)
    assert (res.status, res.answer) == ("final", "13") and len(sub.calls) == 40


def test_a_plan_that_may_fit_is_started_though_its_worst_case_would_not(tmp_path):
    # reads fast, writes slowly (2 reply tokens a second): every reply at its cap would
    # overrun the limit, but the least the map can take (inputs once, a token a call) fits
    slow_replies = Timing(prompt_tokens=700, prompt_s=0.5, output_tokens=30, output_s=15.0)
    root = _root(PLAN, timing=slow_replies)
    sub = ReplayClient(_judge, name="local:fake")
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=root, sub_model=sub, sandbox="inprocess", strategy="plan",
              preflight=False, trace_path=trace, max_seconds=60)
    res = rlm.completion("How many of the notes say the pump leaked?", context=RECORDS)
    bound = next(e.data["bound"] for e in load_events(trace)
                 if e.kind == "plan" and e.phase == "point")
    assert bound["output_tokens"] / 2 > 60            # the worst case is over the limit
    assert (res.status, res.answer) == ("final", "13") and len(sub.calls) == 40


def test_pace_from_server_timings_and_from_latencies():
    pace = Pace()
    assert pace.seconds("m", calls=3, input_tokens=300, output_tokens=30,
                        concurrency=4) is None        # nothing measured: no guess
    pace.record("m", Completion(text="x", timing=Timing(prompt_tokens=200, prompt_s=2.0,
                                                         output_tokens=20, output_s=1.0)))
    # 100 prompt tokens / s and 20 reply tokens / s; a local server's calls add up
    assert pace.seconds("m", calls=3, input_tokens=300, output_tokens=30,
                        concurrency=4) == 3.0 + 1.5
    pace.record("h", Completion(text="x", latency_s=2.0))
    pace.record("h", Completion(text="x", latency_s=4.0))
    # hosted: calls run `concurrency` at a time, each the mean latency
    assert pace.seconds("h", calls=10, input_tokens=1, output_tokens=1, concurrency=4) == 9.0
