"""Sessions (RLM.session): one kept sandbox across questions, with scripted models and real
sandboxes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from helpers_scripted import is_root, repl, root_calls, root_script
from recursa import RLM, BudgetExceeded, ContextError
from recursa.core.session import HISTORY_VAR, SessionClosed
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_runs
from recursa.sandbox.inprocess import InProcessSandbox

CTX = "alpha beta gamma\n" * 200


@pytest.fixture(params=["inprocess", "local"])
def sandbox(request):
    return request.param


class Recording:
    """A real in-process sandbox that counts how often it was made, started and closed."""

    def __init__(self) -> None:
        self.made = self.started = self.closed = 0

    def __call__(self) -> InProcessSandbox:
        rec = self
        rec.made += 1

        class Counted(InProcessSandbox):
            async def start(self, payload, handler):
                rec.started += 1
                await super().start(payload, handler)

            async def close(self):
                rec.closed += 1
                await super().close()
        return Counted()


def test_second_question_sees_the_first_ones_variables(sandbox):
    client = ReplayClient(root_script(repl('x = 41\nFINAL("set x")'),
                                      repl("FINAL(str(x + 1))")))
    with RLM(model=client, sandbox=sandbox).session(CTX) as s:
        r1 = s.completion("Set x.")
        r2 = s.completion("What is x + 1?")
    assert (r1.answer, r1.status) == ("set x", "final")
    assert (r2.answer, r2.status) == ("42", "final")
    assert r1.run_id != r2.run_id


def test_history_variable_and_summary_in_the_next_prompt():
    client = ReplayClient(root_script(
        repl('FINAL("Paris")'),
        repl(f'FINAL(repr([(h["query"], h["answer"]) for h in {HISTORY_VAR}]))'),
        repl('FINAL(str(answer["ready"]))')))
    with RLM(model=client, sandbox="inprocess").session(CTX) as s:
        s.completion("Capital of France?")
        r2 = s.completion("What did I ask?")
        r3 = s.completion("Is a stale answer ready?")
    assert r2.answer == "[('Capital of France?', 'Paris')]"
    # `answer` is reset before each question: the earlier FINAL does not end the next one
    assert r3.answer == "False"
    firsts = [c[1]["content"] for c in root_calls(client) if len(c) == 2]
    assert "question 2 of a session" not in firsts[0]
    assert "question 2 of a session" in firsts[1]
    assert "Q: Capital of France?" in firsts[1] and "A: Paris" in firsts[1]
    assert "Q: What did I ask?" in firsts[2] and "question 3" in firsts[2]
    assert [t.answer for t in s.history] == ["Paris", r2.answer, "False"]


def test_one_sandbox_for_the_session_fresh_ones_for_children():
    rec = Recording()
    # question 2's code starts a child RLM; its reply is the child's own FINAL
    child_or_root = root_script(repl('FINAL("one")'),
                                repl('FINAL(rlm_query("child task", context="tiny ctx"))'),
                                repl('FINAL("child done")'))
    with RLM(model=ReplayClient(child_or_root), sandbox=rec, max_depth=1).session(CTX) as s:
        s.completion("q1")
        r2 = s.completion("q2")
        assert rec.closed == 1            # only the child's sandbox closed so far
    assert r2.answer == "child done"
    assert rec.made == 2 and rec.started == 2 and rec.closed == 2


def test_use_after_close_is_a_clear_error():
    client = ReplayClient(root_script(repl('FINAL("ok")')))
    s = RLM(model=client, sandbox="inprocess").session(CTX)
    assert s.completion("q").answer == "ok"
    s.close()
    s.close()                              # twice is fine
    with pytest.raises(SessionClosed, match="was closed by close"):
        s.completion("again?")
    assert s.closed and "closed by close()" in s.summary()


def test_idle_timeout_closes_the_sandbox():
    rec = Recording()
    client = ReplayClient(root_script(repl('FINAL("ok")')))
    s = RLM(model=client, sandbox=rec).session(CTX, idle_timeout=0.2)
    assert s.completion("q").answer == "ok"
    closed = threading.Event()
    for _ in range(200):                   # at most 10 s; the timeout is 0.2 s
        if s.closed and rec.closed == 1:
            closed.set()
            break
        closed.wait(0.05)
    assert closed.is_set(), "the idle session did not close its sandbox"
    with pytest.raises(SessionClosed, match="idle"):
        s.completion("still there?")


def test_session_budget_stops_the_second_question():
    # every model call costs $0.01; question 1 takes two root turns
    client = ReplayClient(root_script(repl("print(1)"), repl('FINAL("one")'),
                                      repl("print(2)"), repl('FINAL("two")')), cost_usd=0.01)
    with RLM(model=client, sandbox="inprocess").session(CTX, max_cost_usd=0.025) as s:
        r1 = s.completion("q1")
        assert r1.status == "final" and r1.cost_usd == pytest.approx(0.02)
        r2 = s.completion("q2")
        # only $0.005 was left: one turn ran, then the limit stopped the question
        assert r2.status == "limit" and r2.limit == "max_cost_usd"
        assert s.spent.questions == 2
        assert s.spent.cost_usd == pytest.approx(r1.cost_usd + r2.cost_usd)
        with pytest.raises(BudgetExceeded, match="session's max_cost_usd is spent"):
            s.completion("q3")


def test_per_question_budget_is_the_rlms():
    client = ReplayClient(root_script(repl("print(1)"), repl("print(2)"), repl('FINAL("x")')))
    with RLM(model=client, sandbox="inprocess", max_iterations=1).session(CTX) as s:
        r1 = s.completion("q1")
        r2 = s.completion("q2", max_iterations=5)
    assert r1.status == "extracted" and r1.turns == 1
    assert r2.status == "final" and s.spent.questions == 2
    assert s.spent.tokens == sum(u.usage.total_tokens for r in (r1, r2)
                                 for u in r.usage.values())


def test_session_options_are_checked():
    rlm = RLM(model=ReplayClient(["x"]), sandbox="inprocess")
    with pytest.raises(TypeError, match="max_iterations applies to each question"):
        rlm.session(CTX, max_iterations=3)
    with pytest.raises(ValueError, match="idle_timeout"):
        rlm.session(CTX, idle_timeout=0)
    with pytest.raises(Exception, match="context"):
        rlm.session(None)


def test_one_trace_file_one_run_per_question(tmp_path):
    client = ReplayClient(root_script(repl('FINAL("a")'), repl('FINAL("b")')))
    with RLM(model=client, sandbox="inprocess", trace_dir=tmp_path).session(CTX) as s:
        r1, r2 = s.completion("q1"), s.completion("q2")
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"session-{s.id}.jsonl"]
    runs = load_runs(files[0])
    assert [r.run_id for r in runs] == [r1.run_id, r2.run_id]
    assert [r.answer for r in runs] == ["a", "b"]
    assert r1.trace_path == r2.trace_path == str(files[0])


async def test_async_session_and_cancelling_a_question_keeps_the_session():
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def respond(messages):
        if not is_root(messages):        # the cell's sub-call: `y` is set by now
            loop.call_soon_threadsafe(started.set)
            return "sub"
        first = messages[1]["content"]
        if "slow?" in first and len(messages) == 2:
            return repl("y = 7\nllm_query('set')\nimport time\ntime.sleep(30)")
        if "slow?" in first:
            return repl('FINAL("late")')
        return repl('FINAL(str(y * 6))')
    rlm = RLM(model=ReplayClient(respond), sandbox="inprocess")
    async with await rlm.asession(CTX) as s:
        task = asyncio.create_task(s.acompletion("slow?"))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        res = await s.acompletion("y times 6?")
        assert res.answer == "42", res           # `y` was set before the cell was cut
        assert [t.query for t in s.history] == ["y times 6?"]
        assert s.spent.questions == 2       # the cancelled question's spend still counts
    assert s.closed


async def test_asession_loads_the_context_first_and_refuses_a_bad_one(tmp_path):
    rec = Recording()
    rlm = RLM(model=ReplayClient(root_script(repl('FINAL("ok")'))), sandbox=rec)
    s = await rlm.asession(CTX)
    assert rec.started == 1             # loaded before any question
    assert (await s.acompletion("q")).answer == "ok" and rec.made == 1
    await s.aclose()
    assert rec.closed == 1
    with pytest.raises(ContextError, match="does not exist"):
        rlm.session(tmp_path / "missing.txt")
    with pytest.raises(ContextError, match="empty"):
        await rlm.asession("")


def test_typed_answer_in_a_session():
    client = ReplayClient(root_script(repl("n = 41"), repl('FINAL("x")'), repl("FINAL(str(n + 1))")))
    with RLM(model=client, sandbox="inprocess").session(CTX) as s:
        s.completion("q1")
        res = s.completion("How many?", output=int)
    assert res.parsed == 42


async def test_a_session_on_the_callers_loop():
    rec = Recording()
    client = ReplayClient(root_script(repl('x = 5\nFINAL("set")'), repl("FINAL(str(x * 2))")))
    rlm = RLM(model=client, sandbox=rec)
    s = rlm.session(CTX, loop=asyncio.get_running_loop())
    assert (await s.acompletion("q1")).answer == "set"
    assert (await s.acompletion("q2")).answer == "10"
    with pytest.raises(RuntimeError, match="use acompletion"):
        s.completion("blocking?")
    await s.aclose()
    assert s.closed and rec.made == 1 and rec.closed == 1
    with pytest.raises(SessionClosed):
        await s.acompletion("q3")
