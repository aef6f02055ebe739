"""The loop as a step machine (recursa.core.loop.Run), driven step by step with a scripted `replay:`
model and a real in-process sandbox; guards and compaction as functions of the run's state."""

from __future__ import annotations

from typing import Any

import pytest

from recursa.base.types import BudgetExceeded, Completion, Event, Result
from recursa.core.budget import Budget, Ledger
from recursa.core.compaction import compact, history_code, msg_tokens, over
from recursa.core.guards import hold_ungrounded, prose
from recursa.core.loop import Ask, Run, RunEnv, run_loop
from recursa.core.state import RunState
from recursa.models.replay import ReplayClient
from recursa.obs.trace import CallbackSink, Tracer
from recursa.sandbox.inprocess import InProcessSandbox

CTX = "alpha beta gamma\n" * 50


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


def make_env(client: ReplayClient, events: list[Event] | None = None,
             **limits: Any) -> RunEnv:
    budget = Budget(**limits)
    sinks = [CallbackSink(events.append)] if events is not None else []
    return RunEnv(budget=budget, ledger=Ledger(budget), tracer=Tracer(sinks),
                  root_client=client, make_sandbox=InProcessSandbox)


async def test_each_step_returns_what_the_model_sees_next() -> None:
    client = ReplayClient([repl("x = 6 * 7\nprint(x)"), repl("x = 6 * 7\nprint(x)"),
                           repl("FINAL(str(x))")], name="replay:script")
    run = Run(make_env(client), "What is six times seven?")
    ask = await run.start(CTX)
    assert isinstance(ask, Ask) and not ask.last and ask.feedback is None
    assert [m["role"] for m in ask.messages] == ["system", "user"]
    assert "What is six times seven?" in ask.messages[1]["content"]

    ask = await run.step(await run.call(ask))        # the cell ran: its output comes back
    assert isinstance(ask, Ask) and ask.feedback is not None and "42" in ask.feedback
    assert ask.messages[-1] == {"role": "user", "content": ask.feedback}
    assert run.st.turns == 1 and run.st.cells_run == 1

    ask = await run.step(await run.call(ask))        # the same code again: a guard, not a run
    assert isinstance(ask, Ask) and "same code as in turn 1" in (ask.feedback or "")
    assert run.st.cells_run == 1

    res = await run.step(await run.call(ask))
    assert isinstance(res, Result)
    assert (res.status, res.answer, res.turns) == ("final", "42", 3)
    assert len(client.calls) == 3
    assert await run.close() is res                   # closing again is harmless


async def test_a_driver_that_owns_the_model_gives_the_replies() -> None:
    # as a verifiers environment does: no call through the run, just the policy's text
    client = ReplayClient([], name="replay:unused")
    run = Run(make_env(client), "Count the lines.")
    ask = await run.start(CTX)
    assert isinstance(ask, Ask)
    ask = await run.step(Completion(text="I will look first."))   # prose before any code
    assert isinstance(ask, Ask) and "no ```repl code block" in (ask.feedback or "")
    ask = await run.step(Completion(text=repl("n = len(context.splitlines())\nprint(n)")))
    assert isinstance(ask, Ask) and "50" in (ask.feedback or "")
    res = await run.step(Completion(text="Final answer: 50"))       # the prose rule commits
    assert isinstance(res, Result) and (res.status, res.answer) == ("final", "50")
    assert client.calls == []


async def test_a_limit_leads_to_the_last_answer_turn() -> None:
    client = ReplayClient([repl('answer["content"] = "draft"\nprint("ok")'),
                           BudgetExceeded("max_tokens"), "KEEP"])
    run = Run(make_env(client), "q?")
    ask = await run.start(CTX)
    assert isinstance(ask, Ask)
    ask = await run.step(await run.call(ask))
    assert isinstance(ask, Ask) and not ask.last
    reply = await run.call(ask)                       # the limit comes back as the reply
    assert isinstance(reply, BudgetExceeded)
    ask = await run.step(reply)
    assert isinstance(ask, Ask) and ask.last
    assert "reached its limit (max_tokens)" in ask.messages[-1]["content"]
    assert "KEEP" in ask.messages[-1]["content"]      # a draft exists: it may be kept
    res = await run.step(await run.call(ask))
    assert isinstance(res, Result)
    assert (res.status, res.limit, res.answer) == ("limit", "max_tokens", "draft")


async def test_step_without_an_ask_is_an_error_and_close_ends_an_abandoned_run() -> None:
    events: list[Event] = []
    run = Run(make_env(ReplayClient([]), events), "q?")
    with pytest.raises(RuntimeError, match="answers the Ask"):
        await run.step(Completion(text="x"))
    ask = await run.start(CTX)
    assert isinstance(ask, Ask)
    await run.step(Completion(text=repl('answer["content"] = "so far"')))
    res = await run.close()                           # the driver stopped (e.g. max_turns)
    assert (res.answer, res.answer_source) == ("so far", "answer_variable")
    ends = [e for e in events if e.kind == "run" and e.phase == "end"]
    assert len(ends) == 1


async def test_run_loop_is_the_same_machine_driven_to_the_end() -> None:
    client = ReplayClient([repl("print(len(context))"), repl('FINAL("done")')])
    res = await run_loop(make_env(client), "q?", CTX)
    assert (res.status, res.answer, res.turns) == ("final", "done", 2)


# ------------------------------------------------------------------ guards and compaction
def test_guards_decide_on_the_state_and_name_the_repl_code() -> None:
    st = RunState(cells_run=1, first_user="How many?")
    extra: dict[str, Any] = {}
    nudge = prose(st, "Answer: 1234", extra)
    assert st.answer == {"content": "1234", "ready": False}
    assert nudge.text and "1234" in nudge.text and nudge.repl is not None
    assert "answer['content'] = '1234'" in nudge.repl
    st.final = "1234"      # a commit of a number no output showed is held once
    held = hold_ungrounded(st, 'FINAL("1234")', True, extra)
    assert held is not None and st.final is None and held.repl is not None
    assert extra["held"]["number"] == "1234"
    st.final = "1234"      # the second time it is accepted
    assert hold_ungrounded(st, 'FINAL("1234")', True, extra) is None


def test_compaction_decides_the_replacement_without_the_loop() -> None:
    st = RunState(first_user="the query", turns=6, variables=["x"])
    st.messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "the query"}]
    for i in range(6):
        st.append({"role": "assistant", "content": f"turn {i} " + "code " * 200})
        st.append({"role": "user", "content": f"output {i} " + "out " * 200})
        st.log.append(f"Turn {i + 1} ran: something")
    budget = msg_tokens(st.messages) // 2
    assert over(budget, st.messages)
    name, code = history_code(st)
    assert name == "history" and code.startswith("history = ")
    c = compact(st, st.messages, budget, 0, name)
    after = [*st.messages[:c.start], *c.new, *st.messages[c.end:]]
    assert msg_tokens(after) <= budget == c.note["budget"]
    assert c.note["tokens_after"] == msg_tokens(after)
    assert after[1]["content"].startswith("the query") and "history" in after[1]["content"]
