"""REPL semantics shared by every sandbox (local subprocess and in-process)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from helpers_sandbox import Recorder, payload_for, run
from recursa.base.types import ContextPayload, Sandbox
from recursa.sandbox import InProcessSandbox, LocalSandbox, make_sandbox

KINDS = ["local", "inprocess"]


@pytest.fixture
async def sandboxes():
    made: list[Sandbox] = []

    async def make(kind: str, payload: ContextPayload, handler: Any = None, **opts: Any
                   ) -> Sandbox:
        sb = make_sandbox(kind, **opts)
        made.append(sb)
        await sb.start(payload, handler or Recorder())
        return sb

    yield make
    for sb in made:
        await sb.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_text_context_and_persistence(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "héllo\nworld"))
    c1 = await run(sb, "n = len(context)\nfirst = context.splitlines()[0]")
    assert c1.error is None and c1.value is None
    assert set(c1.variables) == {"n", "first"}
    c2 = await run(sb, "n * 10, first")
    assert c2.value == "(110, 'héllo')"
    assert c2.error is None


@pytest.mark.parametrize("kind", KINDS)
async def test_json_context(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, {"docs": [1, 2, {"x": "y"}]}, "json"))
    cell = await run(sb, "type(context).__name__, context['docs'][2]['x']")
    assert cell.value == "('dict', 'y')"


@pytest.mark.parametrize("kind", KINDS)
async def test_trailing_expression_print_and_none(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, "print('a')\nprint('b', file=__import__('sys').stderr)\n[1, 2]")
    assert (cell.stdout, cell.stderr, cell.value) == ("a\n", "b\n", "[1, 2]")
    assert (cell.stdout_chars, cell.stderr_chars) == (2, 2)
    assert (await run(sb, "None")).value is None
    assert (await run(sb, "for i in range(3):\n    i")).value is None


@pytest.mark.parametrize("kind", KINDS)
async def test_traceback_is_trimmed_to_cell_frames(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, "def f(x):\n    return 1 / x\n\nf(0)")
    assert cell.error is not None
    assert "ZeroDivisionError" in cell.error
    assert 'File "<cell-1>", line 4' in cell.error and "return 1 / x" in cell.error
    assert "worker.py" not in cell.error
    # The REPL survives and the function defined before the error is kept.
    assert (await run(sb, "f(2)")).value == "0.5"


@pytest.mark.parametrize("kind", KINDS)
async def test_syntax_error_runs_nothing(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, "a = 1\nif True\n    b = 2")
    assert cell.error is not None and "SyntaxError" in cell.error
    assert "line 2" in cell.error and "was not run" in cell.error
    assert "a" not in cell.variables


@pytest.mark.parametrize("kind", KINDS)
async def test_output_is_capped_but_counted(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    code = ("import sys\nchunk = 'x' * 10_000\n"
            "for _ in range(5_000):\n    sys.stdout.write(chunk)\n"
            "for _ in range(100):\n    print('e' * 99, file=sys.stderr)\n"
            "'v' * 5000")
    cell = await run(sb, code, max_output_chars=1000)
    assert cell.stdout == "x" * 1000
    assert cell.stdout_chars == 50_000_000
    assert cell.stderr == ("e" * 99 + "\n") * 10
    assert cell.stderr_chars == 10_000
    assert cell.value is not None and cell.value.startswith("'vvv") and len(cell.value) < 1100
    assert "5000" in cell.value  # the truncation note names the full size


async def test_printing_50mb_keeps_worker_memory_bounded(tmp_path, sandboxes):
    sb = await sandboxes("local", payload_for(tmp_path, "c"), isolation="limits")
    base = await run(sb, "import resource\nresource.getrusage(resource.RUSAGE_SELF).ru_maxrss")
    cell = await run(sb, "for _ in range(5_000):\n    print('y' * 9_999)", max_output_chars=500)
    assert cell.stdout_chars == 50_000_000 and len(cell.stdout) == 500
    after = await run(sb, "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss")
    grown_kb = int(after.value) - int(base.value)
    assert grown_kb < 20_000, f"worker grew by {grown_kb} kB while printing 50 MB"


# ------------------------------------------------------------------ finalization
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("code, final", [
    ("FINAL('forty two')", "forty two"),
    ("FINAL(42)", "42"),
    ("result = [1, 2]\nFINAL_VAR('result')", "[1, 2]"),
    ("result = 'r'\nFINAL_VAR(\" 'result' \\n\")", "r"),
    ("answer['content'] = 'item'\nanswer['ready'] = True", "item"),
    ("answer.update(content='upd', ready=True)", "upd"),
    ("answer = {'content': 'rebound', 'ready': 1}", "rebound"),
    ("answer['content'] = 'draft'", None),
])
async def test_finalization_forms(kind, code, final, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, code)
    assert cell.error is None
    assert cell.final == final
    assert cell.answer["ready"] is (final is not None)
    if final is None:
        assert cell.answer["content"] == "draft"


@pytest.mark.parametrize("kind", KINDS)
async def test_final_var_missing_name_does_not_finalize(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, "have = 1\nFINAL_VAR('nope')")
    assert cell.final is None and cell.answer["ready"] is False
    assert "no variable named 'nope'" in cell.stdout and "have" in cell.stdout


@pytest.mark.parametrize("kind", KINDS)
async def test_answer_rebound_to_non_dict(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, "answer = 'done'")
    assert cell.final is None and cell.answer == {"content": "", "ready": False}
    assert "`answer` is a str" in cell.stderr


@pytest.mark.parametrize("kind", KINDS)
async def test_show_vars_and_variables_exclude_helpers(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"))
    cell = await run(sb, "import json\nrows = [1]\ndef helper():\n    pass\nSHOW_VARS()")
    assert cell.variables == ["rows", "helper"]
    assert cell.stdout == "rows: list\nhelper: function\n"


@pytest.mark.parametrize("kind", KINDS)
async def test_deleted_helper_still_reaches_host(kind, tmp_path, sandboxes):
    handler = Recorder()
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), handler)
    cell = await run(sb, "del llm_query\nllm_query('still here')")
    assert cell.value == "'LLM[still here]'"
    assert handler.calls == [("llm", {"prompt": "still here", "model": None, "opts": {}})]


# ------------------------------------------------------------------ host calls
@pytest.mark.parametrize("kind", KINDS)
async def test_call_round_trips(kind, tmp_path, sandboxes):
    handler = Recorder()
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), handler)
    cell = await run(sb, "\n".join([
        "a = llm_query('p1', model='m', temperature=0)",
        "b = llm_batch(['p2', 'p3'])",
        "c = llm_query_batched(['p4'])",
        "d = rlm_query('q', context=[1, 2])",
        "e = rlm_batch(['q1', 'q2'], contexts=['c1', 'c2'])",
        "f = rlm_query_batched(['q3'])",
        "a, b, c, d, e, f",
    ]))
    assert cell.error is None, cell.error
    assert cell.value == repr(("LLM[p1]", ["LLM[p2]", "LLM[p3]"], ["LLM[p4]"], "RLM[q|[1, 2]]",
                               ["RLM[q1|c1]", "RLM[q2|c2]"], ["RLM[q3|None]"]))
    assert handler.calls[0] == ("llm", {"prompt": "p1", "model": "m", "opts": {"temperature": 0}})
    assert handler.calls[3] == ("rlm", {"prompt": "q", "context": [1, 2], "opts": {}})
    assert [k for k, _ in handler.calls] == ["llm", "llm_batch", "llm_batch", "rlm",
                                             "rlm_batch", "rlm_batch"]


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_calls_from_user_threads(kind, tmp_path, sandboxes):
    handler = Recorder(delay=0.4)
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), handler)
    code = ("from concurrent.futures import ThreadPoolExecutor\n"
            "with ThreadPoolExecutor(8) as ex:\n"
            "    out = list(ex.map(llm_query, [f'q{i}' for i in range(8)]))\n"
            "out")
    t0 = time.perf_counter()
    cell = await run(sb, code)
    elapsed = time.perf_counter() - t0
    assert cell.error is None, cell.error
    assert cell.value == repr([f"LLM[q{i}]" for i in range(8)])
    assert elapsed < 1.6, f"8 calls of 0.4 s took {elapsed:.2f} s: not concurrent"


@pytest.mark.parametrize("kind", KINDS)
async def test_handler_error_becomes_error_string(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), Recorder(fail=True))
    cell = await run(sb, "one = llm_query('x')\nmany = llm_batch(['a', 'b', 'c'])\none, many")
    assert cell.error is None
    err = "Error: ValueError: boom"
    assert cell.value == repr((err, [err, err, err]))


@pytest.mark.parametrize("kind", KINDS)
async def test_time_waiting_for_calls_does_not_count(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), Recorder(delay=1.2))
    cell = await run(sb, "llm_query('slow')", timeout=0.8)
    assert not cell.timed_out and cell.error is None
    assert cell.value == "'LLM[slow]'"


@pytest.mark.parametrize("kind", KINDS)
async def test_busy_loop_is_interrupted_and_state_kept(kind, tmp_path, sandboxes):
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), interrupt_grace=2.0)
    await run(sb, "keep = 7")
    t0 = time.perf_counter()
    cell = await run(sb, "while True:\n    pass", timeout=0.5)
    assert time.perf_counter() - t0 < 2.5
    assert cell.timed_out and not cell.restarted
    assert "exceeded 0.5 s" in cell.error and "KeyboardInterrupt" in cell.error
    assert (await run(sb, "keep")).value == "7"


async def test_concurrent_inprocess_runs_keep_their_own_output(tmp_path):
    sbs = [InProcessSandbox() for _ in range(4)]
    p = payload_for(tmp_path, "c")
    for sb in sbs:
        await sb.start(p, Recorder())
    code = "import time\nfor i in range(20):\n    print(TAG)\n    time.sleep(0.005)"
    for i, sb in enumerate(sbs):
        await run(sb, f"TAG = 'sandbox-{i}'")
    cells = await asyncio.gather(*(run(sb, code) for sb in sbs))
    for i, cell in enumerate(cells):
        assert cell.stdout == f"sandbox-{i}\n" * 20
    for sb in sbs:
        await sb.close()


async def test_print_from_user_thread_is_captured(tmp_path, sandboxes):
    sb = await sandboxes("local", payload_for(tmp_path, "c"))
    cell = await run(sb, "import threading\nt = threading.Thread(target=print, args=('hi',))\n"
                         "t.start(); t.join()")
    assert cell.stdout == "hi\n"


def test_make_sandbox_kinds():
    assert isinstance(make_sandbox("inprocess"), InProcessSandbox)
    assert isinstance(make_sandbox("local", isolation="limits"), LocalSandbox)
    with pytest.raises(ValueError):
        make_sandbox("docker-on-mars")


def test_inprocess_cells_and_the_host_parse_under_one_lock() -> None:
    """CPython < 3.11.9 fails two threads building ASTs at once (python/cpython#106905): the
    in-process worker compiles cells under the host's parse lock, so while the host holds it a
    cell's compile waits."""
    import threading

    from recursa.core.parse import AST_LOCK, parse_python
    from recursa.sandbox.inprocess import worker_module

    mod = worker_module()
    assert mod.AST_LOCK is AST_LOCK
    repl = mod.Repl(lambda kind, args: None, None, None)
    done = threading.Event()

    def compile_cell() -> None:
        repl._compile("x = 1\nx", "<cell-t>")
        done.set()

    with AST_LOCK:
        t = threading.Thread(target=compile_cell)
        t.start()
        assert not done.wait(0.3)        # blocked on the lock the host holds
    assert done.wait(10)
    t.join()
    assert parse_python("y = 2").body    # and the host's own parse still works


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancel_that_lands_as_a_call_returns_still_cancels_the_cell(
        kind, tmp_path, sandboxes):
    """Cancelled right as the cell's llm_query is answered, the run stops at once. (Python
    3.11's asyncio.wait_for returned the event that had just arrived and dropped the cancel, so
    the cell ran to its end.)"""
    answered = asyncio.Event()

    async def handler(kind: str, args: dict[str, Any]) -> Any:
        answered.set()
        return "ok"
    sb = await sandboxes(kind, payload_for(tmp_path, "c"), handler)
    task = asyncio.create_task(run(sb, "llm_query('go')\nimport time\ntime.sleep(5)"))
    await asyncio.wait_for(answered.wait(), 20)
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 2
