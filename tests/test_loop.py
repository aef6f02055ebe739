"""The RLM loop end to end with scripted models and real sandboxes (in-process and local)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from helpers_scripted import is_root, repl, root_calls, root_script
from recursa import RLM, Budget
from recursa.base.types import ContextError, ModelError
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

CTX = "alpha beta gamma\n" * 200


@pytest.fixture(params=["inprocess", "local"])
def sandbox(request):
    return request.param


@pytest.mark.parametrize("final_code, expected", [
    ('FINAL("forty-two")', "forty-two"),
    ('x = "from var"\nFINAL_VAR("x")', "from var"),
    ('answer["content"] = "by item"\nanswer["ready"] = True', "by item"),
    ('answer.update(content="by update", ready=True)', "by update"),
    ('answer = {"content": "rebound", "ready": True}', "rebound"),
])
def test_finalization_forms(final_code, expected, sandbox):
    rlm = RLM(model=ReplayClient(root_script(repl("print(len(context))"), repl(final_code))),
              sandbox=sandbox)
    res = rlm.completion("q?", context=CTX)
    assert res.status == "final" and res.ready
    assert res.answer == expected
    assert res.turns == 2


def test_mentioning_final_outside_code_does_not_end_run():
    client = ReplayClient(root_script(
        "I will call FINAL(done) once I know. FINAL_VAR(x)", repl('FINAL("real")')))
    res = RLM(model=client, sandbox="inprocess").completion("q?", context=CTX)
    assert res.answer == "real" and res.turns == 2
    # the model was told that nothing ran
    assert "no ```repl code block" in client.calls[1][-1]["content"]


def test_first_block_that_finalizes_stops_the_turn():
    reply = "```repl\nFINAL('one')\n```\n```repl\nFINAL('two')\n```"
    res = RLM(model=ReplayClient(root_script(reply)), sandbox="inprocess").completion(
        "q", context=CTX)
    assert res.answer == "one"


def test_made_up_output_and_the_turn_after_it_are_not_run(tmp_path: Path):
    """A small model imitating the prompt's example writes the REPL's output itself and then
    commits a guess; only the code before the made-up output runs, and the model sees the
    real output."""
    reply = ("```repl\nx = context[:5]\nprint(x)\n```\nOutput: beta\nTurn 3:\n"
             "```repl\nFINAL('beta')\n```")
    client = ReplayClient(root_script(reply, repl("FINAL(x)")))
    res = RLM(model=client, sandbox="inprocess", trace_path=tmp_path / "t.jsonl").completion(
        "q", context=CTX)
    assert res.answer == "alpha" and res.turns == 2
    second = root_calls(client)[1]
    assert "FINAL('beta')" not in second[-2]["content"] and "alpha" in second[-1]["content"]
    ends = [e for e in load_events(tmp_path / "t.jsonl") if e.kind == "turn" and e.phase == "end"]
    assert ends[0].data["imagined_output"] > 0


def test_a_client_that_takes_stop_strings_ends_the_turn_at_made_up_output():
    """A root client that declares `stop` is asked to end its reply where made-up REPL output
    starts; the fence the stop string left open is closed again in the history."""
    reply = ("```repl\nx = context[:5]\nprint(x)\n```\nOutput: beta\n"
             "```repl\nFINAL('beta')\n```")
    client = ReplayClient(root_script(reply, repl("FINAL(x)")), stop=True)
    res = RLM(model=client, sandbox="inprocess").completion("q", context=CTX)
    assert res.answer == "alpha" and res.turns == 2
    assert "```\nOutput:" in client.options[0]["stop"]
    assert root_calls(client)[1][-2]["content"] == "```repl\nx = context[:5]\nprint(x)\n```"
    plain = ReplayClient(root_script(repl("FINAL('a')")))
    RLM(model=plain, sandbox="inprocess").completion("q", context=CTX)
    assert "stop" not in plain.options[0]       # a client that does not declare it


def test_close_fence_closes_only_an_open_block():
    from recursa.core.parse import close_fence
    assert close_fence("```repl\nprint(1)\n") == "```repl\nprint(1)\n```"
    assert close_fence("```repl\nprint(1)\n```") == "```repl\nprint(1)\n```"
    assert close_fence("no code here") == "no code here"


def test_python_fence_accepted_without_repl_fence():
    res = RLM(model=ReplayClient(root_script("```python\nFINAL(context[:5])\n```")),
              sandbox="inprocess").completion("q", context=CTX)
    assert res.answer == "alpha"


def test_root_never_sees_whole_context_and_output_is_capped():
    big = "x" * 300_000
    client = ReplayClient(root_script(repl("print(context)"), repl("FINAL('ok')")))
    res = RLM(model=client, sandbox="local", max_output_chars=1000).completion("q", context=big)
    assert res.status == "final"
    first = "\n".join(m["content"] for m in client.calls[0])
    assert len(first) < 8000                  # description, not the context
    feedback = client.calls[1][-1]["content"]
    assert "output truncated: 299,001 of 300,001 characters" in feedback
    assert len(feedback) < 1500


def test_max_iterations_gives_last_turn_and_extracted_status():
    client = ReplayClient(root_script(
        repl('answer["content"] = "draft"'), repl("print(1)"), repl("print(2)"), "KEEP"))
    res = RLM(model=client, sandbox="inprocess", max_iterations=3).completion("q", context=CTX)
    assert res.status == "extracted" and not res.ready
    assert res.answer == "draft"            # the model chose to keep its draft
    assert res.limit == "max_iterations"
    assert "reached its limit (max_iterations)" in client.calls[-1][-1]["content"]


def test_last_turn_text_is_the_answer_when_no_draft():
    client = ReplayClient(root_script(repl("print(1)"), "The answer is 7."))
    res = RLM(model=client, sandbox="inprocess", max_iterations=1).completion("q", context=CTX)
    assert res.answer == "The answer is 7." and res.status == "extracted"


def test_subcall_limit_is_shared_and_never_overshot():
    code = "r = llm_batch([f'p{i}' for i in range(10)])\nprint(sum(x.startswith('Error') for x in r))"
    client = ReplayClient(root_script(repl(code), repl("FINAL('x')")))
    res = RLM(model=client, sandbox="inprocess", max_subcalls=4).completion("q", context=CTX)
    assert res.subcalls == 4
    assert res.usage["sub"].calls == 4
    feedback = root_calls(client)[1][-1]["content"]
    assert feedback.split("\n")[0] == "6"     # six slots carry an error string


def test_cost_limit_stops_run_with_limit_status():
    client = ReplayClient(root_script(*[repl("print(llm_query('hi'))")] * 20, "final words"),
                          cost_usd=0.01)
    res = RLM(model=client, sandbox="inprocess", max_cost_usd=0.05).completion("q", context=CTX)
    assert res.status == "limit" and res.limit == "max_cost_usd"
    # at most one call past the limit: the forced last answer turn
    assert res.cost_usd <= 0.05 + 0.01 + 1e-9


def test_model_error_keeps_partial_answer_spend_and_trace(tmp_path: Path):
    client = ReplayClient([repl('answer["content"] = "partial"'),
                           ModelError("provider down", retryable=False)])
    rlm = RLM(model=client, sandbox="inprocess", trace_path=tmp_path / "t.jsonl")
    res = rlm.completion("q", context=CTX)
    assert res.status == "error" and "provider down" in res.error
    assert res.answer == "partial"
    assert res.usage["root"].calls == 1
    kinds = [e.kind for e in load_events(tmp_path / "t.jsonl")]
    assert kinds[0] == "run" and "final" in kinds


def test_consecutive_failing_turns_end_the_run():
    client = ReplayClient(root_script(repl("1/0")))
    res = RLM(model=client, sandbox="inprocess", max_consecutive_errors=3).completion(
        "q", context=CTX)
    assert res.status == "error" and res.turns == 3
    assert "ZeroDivisionError" in client.calls[1][-1]["content"]


def test_empty_context_is_a_clear_error():
    with pytest.raises(ContextError, match="empty"):
        RLM(model=ReplayClient(["x"]), sandbox="inprocess").completion("q", context="")
    with pytest.raises(ValueError, match="query"):
        RLM(model=ReplayClient(["x"]), sandbox="inprocess").completion("", context="x")
    with pytest.raises(TypeError, match="max_iteration"):
        RLM(model=ReplayClient(["x"]), max_iteration=3)


def test_batch_runs_in_parallel(sandbox):
    def respond(messages):
        if is_root(messages):
            n = sum(m["role"] == "assistant" for m in messages)
            return repl("r = llm_batch([str(i) for i in range(20)])\nprint(len(r))") if n == 0 \
                else repl("FINAL(str(len(r)))")
        return "ok"
    sub = ReplayClient(lambda m: "ok", latency=0.3, name="replay:sub")
    rlm = RLM(model=ReplayClient(respond), sub_model=sub, sandbox=sandbox, concurrency=32)
    t0 = time.monotonic()
    res = rlm.completion("q", context=CTX)
    wall = time.monotonic() - t0
    assert res.answer == "20" and res.subcalls == 20
    assert wall < 0.3 * 20 / 2, wall      # serial would take 6 s


def test_concurrency_limit_is_respected():
    sub = ReplayClient(lambda m: "ok", latency=0.1, name="replay:sub")
    client = ReplayClient(root_script(repl("r = llm_batch(['a'] * 12)"), repl("FINAL('d')")))
    rlm = RLM(model=client, sub_model=sub, sandbox="inprocess", concurrency=3)
    t0 = time.monotonic()
    rlm.completion("q", context=CTX)
    assert time.monotonic() - t0 >= 0.4       # 12 calls, 3 at a time, 0.1 s each


def test_depth_two_children_run_and_are_traced(tmp_path: Path, sandbox):
    """Root -> rlm_batch of 2 children -> each child -> rlm_query grandchild (plain call at depth 2)."""
    def respond(messages):
        sys_ok = is_root(messages)
        user = messages[1]["content"] if sys_ok else messages[-1]["content"]
        n = sum(m["role"] == "assistant" for m in messages)
        if not sys_ok:
            return "leaf(" + user[:12] + ")"
        if "TOP" in user:
            return repl("r = rlm_batch(['child A', 'child B'], contexts=['ctxA', 'ctxB'])\n"
                        "FINAL(' | '.join(r))")
        if n == 0:   # a child
            return repl("FINAL(context + ':' + rlm_query('grand ' + context))")
        return repl("FINAL('unexpected')")
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=ReplayClient(respond), sandbox=sandbox, max_depth=2, trace_path=trace)
    res = rlm.completion("TOP question", context=CTX)
    assert res.status == "final"
    assert res.answer.startswith("ctxA:") and " | ctxB:" in res.answer
    events = load_events(trace)
    children = [e for e in events if e.kind == "child" and e.phase == "start"]
    assert len(children) == 4                    # 2 children, each with a grandchild RLM
    assert {e.depth for e in children} == {1, 2}
    assert res.usage["child"].calls >= 4
    # the grandchildren at depth 2 = max_depth: their rlm_query would be plain calls
    assert all(e.parent for e in children)


def test_rlm_query_at_max_depth_is_a_plain_call():
    client = ReplayClient(root_script(repl("FINAL(rlm_query('hello'))")))
    res = RLM(model=client, sandbox="inprocess", max_depth=0).completion("q", context=CTX)
    assert res.answer == "sub:hello"
    assert res.subcalls == 1


def test_trace_does_not_grow_with_context(tmp_path: Path):
    sizes = []
    for n in (10_000, 2_000_000):
        client = ReplayClient(root_script(repl("print(context[:100])"), repl("FINAL('x')")))
        t = tmp_path / f"t{n}.jsonl"
        RLM(model=client, sandbox="local", trace_path=t).completion("q", context="y" * n)
        sizes.append(t.stat().st_size)
    assert abs(sizes[1] - sizes[0]) < 2000, sizes
    first = next(e for e in load_events(t) if "context_bytes" in e.data).model_dump()
    assert first["data"]["context_bytes"] == 2_000_000 and len(first["data"]["context_sha256"]) == 64


def test_secrets_are_redacted_from_trace(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_API_KEY", "supersecretvalue123")
    client = ReplayClient(root_script(repl("print('key is supersecretvalue123')"),
                                      repl("FINAL('sk-abcdefghijklmnopqrstuvwx')")))
    t = tmp_path / "t.jsonl"
    RLM(model=client, sandbox="inprocess", trace_path=t).completion("q", context=CTX)
    text = t.read_text()
    assert "supersecretvalue123" not in text and "sk-abcdefghijklmnop" not in text
    assert "[REDACTED]" in text


async def test_many_concurrent_runs_do_not_cross_talk():
    async def one(i: int):
        client = ReplayClient(root_script(repl(f"v = {i}\nprint('run', v)"),
                                          repl("FINAL(str(v))")))
        return await RLM(model=client, sandbox="inprocess").acompletion("q", context=f"c{i}")
    results = await asyncio.gather(*(one(i) for i in range(16)))
    assert [r.answer for r in results] == [str(i) for i in range(16)]


def test_budget_object_and_per_call_override():
    client = ReplayClient(root_script(repl("print(1)")))
    rlm = RLM(model=client, sandbox="inprocess", budget=Budget(max_iterations=5))
    res = rlm.completion("q", context=CTX, max_iterations=2)
    assert res.turns == 2


def test_on_event_receives_every_event_and_a_failing_callback_is_harmless():
    seen = []

    def cb(ev):
        seen.append(ev.kind)
        raise RuntimeError("callback bug")
    client = ReplayClient(root_script(repl("llm_query('x')\nFINAL('y')")))
    res = RLM(model=client, sandbox="inprocess", on_event=cb).completion("q", context=CTX)
    assert res.answer == "y"
    assert {"run", "turn", "cell", "subcall", "final"} <= set(seen)


def test_final_of_the_answer_dict_commits_its_content():
    code = 'answer["content"] = "built up"\nFINAL(answer)'
    res = RLM(model=ReplayClient(root_script(repl(code))), sandbox="local").completion(
        "q", context=CTX)
    assert res.answer == "built up" and res.status == "final"


def test_a_model_call_cut_by_max_seconds_is_a_limit_not_an_error(tmp_path: Path):
    """The client gives up at the run's deadline (the timeout the dispatcher passed it)."""
    import asyncio as _asyncio

    from recursa.base.types import ModelError

    class Slow:
        name = "replay:slow"

        async def complete(self, messages, **options):
            await _asyncio.sleep(float(options.get("timeout") or 5))
            raise ModelError(f"no reply within {options.get('timeout')} s", retryable=True)

        async def aclose(self):
            pass

    res = RLM(model=Slow(), sandbox="inprocess", max_seconds=1.0).completion("q", context="x")
    assert (res.status, res.limit) == ("limit", "max_seconds"), (res.status, res.error)


# ------------------------------------------------------------------ how the answer was obtained
@pytest.mark.parametrize("script, answer, source", [
    ((repl('FINAL("x")'),), "x", "final"),
    ((repl('answer["content"] = "draft"'), "KEEP"), "draft", "answer_variable"),
    ((repl("print(1)"), "The answer is 7."), "The answer is 7.", "extraction_turn"),
    # a last reply in code is never the answer text: the literal it commits, or nothing
    ((repl("print(1)"), "Here:\n```repl\nFINAL('Lyon')\n```"), "Lyon", "extraction_turn"),
    ((repl("print(1)"), "Let me look again.\n```repl\nprint(context[:9])\n```"), "", "none"),
    ((repl('answer["content"] = "draft"'), "Checking:\n```repl\nprint(x)\n```"), "draft",
     "answer_variable"),
])
def test_answer_source_says_how_the_answer_was_obtained(script, answer, source, tmp_path):
    client = ReplayClient(root_script(*script))
    res = RLM(model=client, sandbox="inprocess", max_iterations=1,
              trace_path=tmp_path / "t.jsonl").completion("q", context=CTX)
    assert (res.answer, res.answer_source) == (answer, source)
    assert "```" not in res.answer
    from recursa.obs.trace import load
    run = load(tmp_path / "t.jsonl")
    assert (run.answer, run.answer_source) == (answer, source)


# ------------------------------------------------------------------ typed answers
class City(BaseModel):
    name: str
    population: int


def test_typed_answer_is_validated_and_parsed():
    client = ReplayClient(root_script(
        repl('import json\nFINAL(json.dumps({"name": "Lyon", "population": 522000}))')))
    res = RLM(model=client, sandbox="inprocess").completion("q", context=CTX, output=City)
    assert res.status == "final" and res.parsed == City(name="Lyon", population=522000)
    assert res.output_error is None
    # the root was told the schema with the query
    assert '"population"' in client.calls[0][1]["content"]


def test_invalid_typed_answer_goes_back_with_the_error(tmp_path):
    client = ReplayClient(root_script(
        repl('FINAL({"name": "Lyon"})'),                                # population missing
        repl('FINAL({"name": "Lyon", "population": 42})')))   # a dict repr: parsed
    res = RLM(model=client, sandbox="inprocess", trace_path=tmp_path / "t.jsonl").completion(
        "q", context=CTX, output=City)
    assert (res.status, res.turns) == ("final", 2)
    assert res.parsed == City(name="Lyon", population=42)
    feedback = client.calls[1][-1]["content"]
    assert "does not match the required JSON schema" in feedback
    assert "$.population: Field required" in feedback
    held = [e for e in load_events(tmp_path / "t.jsonl")
            if e.kind == "turn" and e.phase == "end" and "held" in e.data]
    assert held[0].data["held"]["invalid"].startswith("$.population")


def test_json_schema_output_gives_a_dict():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
              "required": ["n"]}
    client = ReplayClient(root_script(repl('FINAL(\'{"n": -1}\')'), repl('FINAL(\'{"n": 3}\')')))
    res = RLM(model=client, sandbox="inprocess").completion("q", context=CTX, output=schema)
    assert res.parsed == {"n": 3} and res.answer == '{"n": 3}'
    assert "$.n: -1 is less than the minimum of 0" in client.calls[1][-1]["content"]


def test_a_plain_text_answer_is_structured_by_one_sub_call(tmp_path):
    """A root that commits prose gets its answer filled into the schema by a sub-call."""
    root = root_script(repl("print('Lyon: 522000')"), repl('FINAL("Lyon, with 522000 people")'))

    def respond(messages):
        if is_root(messages):
            return root(messages)
        assert "Lyon, with 522000 people" in messages[-1]["content"]
        return '{"name": "Lyon", "population": 522000}'
    client = ReplayClient(respond)
    res = RLM(model=client, sandbox="inprocess", trace_path=tmp_path / "t.jsonl").completion(
        "q", context=CTX, output=City)
    assert (res.status, res.turns) == ("final", 2)
    assert res.parsed == City(name="Lyon", population=522000)
    assert res.usage["sub"].calls == 1
    ends = [e for e in load_events(tmp_path / "t.jsonl") if e.kind == "turn" and e.phase == "end"]
    assert ends[1].data["structured"]["from"] == "Lyon, with 522000 people"


def test_structuring_asks_for_a_constrained_reply_where_the_client_can():
    from recursa.core.output import OutputSpec
    spec = OutputSpec.of(City)
    _, local = spec.structuring_request("text", "local:qwen2.5-coder-1.5b")
    _, hosted = spec.structuring_request("text", "openai:gpt-5-mini")
    _, other = spec.structuring_request("text", "anthropic:claude-haiku-4-5")
    assert local["json_schema"] == spec.schema
    assert hosted["response_format"]["json_schema"]["schema"] == spec.schema
    assert "json_schema" not in other and "response_format" not in other


def test_a_schema_never_satisfied_ends_with_a_clear_output_error():
    client = ReplayClient(root_script(repl('FINAL("Lyon")')))      # never JSON
    res = RLM(model=client, sandbox="inprocess", max_iterations=3).completion(
        "q", context=CTX, output=City)
    assert res.status == "extracted" and res.limit == "max_iterations"
    assert res.parsed is None
    assert res.output_error.startswith("the answer does not match the output schema: "
                                       "the answer is not JSON")
    assert "JSON matching the schema" in client.calls[-1][-1]["content"]   # the last turn


@pytest.mark.parametrize("output, error, match", [
    ({"type": "no-such-type"}, ValueError, "not a valid JSON schema"),
    (5, TypeError, "pydantic model class or a JSON schema dict"),
    (object(), TypeError, "pydantic cannot validate"),
])
def test_bad_output_spec_is_refused_before_the_run(output, error, match):
    client = ReplayClient(root_script(repl('FINAL("x")')))
    with pytest.raises(error, match=match):
        RLM(model=client, sandbox="inprocess").completion("q", context=CTX, output=output)
    assert client.calls == []


def test_last_turn_seconds_must_be_positive():
    with pytest.raises(ValueError, match="last_turn_seconds must be positive"):
        RLM(model=ReplayClient(["x"]), last_turn_seconds=0)
