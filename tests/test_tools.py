"""Sub-model tools: schemas, the tool-calling loop (text and native), failures, isolation."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Literal

import pytest

from recursa import RLM
from recursa.base.types import Capabilities, Completion, Usage
from recursa.core.budget import Budget, Ledger
from recursa.core.dispatch import Dispatcher, Node
from recursa.core.tools import (
    FORCE_ANSWER,
    ToolSet,
    call_tool,
    make_tool,
    parse_text_calls,
    run_tool_loop,
)
from recursa.models import ReplayClient
from recursa.obs.trace import Tracer, load


# ------------------------------------------------------------------ schemas
def search(query: str, k: int = 5, exact: bool = False) -> str:
    """Search the collection.

    Args:
        query: words to look for.
        k: how many hits
            to return.
        exact: match whole words only.

    Returns:
        One line per hit.
    """
    return f"hits for {query}"


async def fetch(url: str, tags: list[str] | None = None,
                mode: Literal["fast", "full"] = "fast", weight: float = 1.0) -> dict[str, Any]:
    """Fetch a page.

    :param url: the address.
    :param tags: labels to attach.
    """
    return {"url": url, "tags": tags}


def test_schema_from_google_docstring() -> None:
    t = make_tool(search)
    s = t.schema()
    assert s["type"] == "function"
    f = s["function"]
    assert f["name"] == "search"
    assert f["description"] == "Search the collection."
    props = f["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "words to look for."}
    assert props["k"] == {"type": "integer", "description": "how many hits to return.",
                          "default": 5}
    assert props["exact"]["type"] == "boolean"
    assert f["parameters"]["required"] == ["query"]
    assert not t.is_async


def test_schema_from_sphinx_docstring_and_rich_types() -> None:
    t = make_tool(fetch, timeout=3)
    props = t.parameters["properties"]
    assert t.is_async and t.timeout == 3
    assert t.description == "Fetch a page."
    assert props["url"] == {"type": "string", "description": "the address."}
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert props["tags"]["description"] == "labels to attach."
    assert props["mode"]["enum"] == ["fast", "full"]
    assert props["weight"]["type"] == "number"
    assert t.parameters["required"] == ["url"]
    json.dumps(t.schema())   # serialisable as sent to an API


def test_schema_without_docstring_or_hints_and_bad_names() -> None:
    def bare(x, *args, **kw):  # type: ignore[no-untyped-def]
        return x
    t = make_tool(bare)
    assert t.description == "bare"
    assert t.parameters == {"type": "object", "properties": {"x": {}}, "required": ["x"]}
    with pytest.raises(ValueError):
        make_tool(search, name="bad name")
    with pytest.raises(ValueError):
        ToolSet.of([search, search])
    with pytest.raises(TypeError):
        make_tool("not a function")  # type: ignore[arg-type]


def test_parse_text_calls() -> None:
    known = ["search", "open_page"]
    text = 'Let me look.\n```tool\n{"name": "search", "arguments": {"query": "x"}}\n```'
    [c] = parse_text_calls(text, known)
    assert (c.name, c.arguments, c.error) == ("search", {"query": "x"}, None)
    qwen = '<tool_call>\n{"name": "open_page", "arguments": "{\\"doc_id\\": \\"d1\\"}"}\n</tool_call>'
    [c] = parse_text_calls(qwen, known)
    assert c.name == "open_page" and c.arguments == {"doc_id": "d1"}
    [c] = parse_text_calls('```json\n{"name": "delete_all", "arguments": {}}\n```', known)
    assert c.error and "unknown tool" in c.error
    [c] = parse_text_calls('```tool\n{"name": "search", "arguments": {query}}\n```', known)
    assert c.error and "invalid JSON" in c.error
    assert parse_text_calls("The answer is 42.", known) == []
    assert parse_text_calls("```json\n{\"answer\": 42}\n```", known) == []


# ------------------------------------------------------------------ running tools
async def test_call_tool_errors_and_timeouts() -> None:
    def boom(x: int) -> str:
        raise ValueError(f"bad {x}")

    def hang_sync() -> str:
        time.sleep(3)
        return "never"

    async def hang_async() -> str:
        await asyncio.sleep(30)
        return "never"

    assert await call_tool(make_tool(search), {"query": "q"}) == "hits for q"
    assert await call_tool(make_tool(boom), {"x": 1}) == "Error: tool boom raised ValueError: bad 1"
    out = await call_tool(make_tool(search), {"nope": 1})
    assert out.startswith("Error: bad arguments for search")
    t0 = time.monotonic()
    assert "timed out after 0.2s" in await call_tool(make_tool(hang_sync, timeout=0.2), {})
    assert "timed out after 0.2s" in await call_tool(make_tool(hang_async, timeout=0.2), {})
    assert time.monotonic() - t0 < 2.0
    assert json.loads(await call_tool(make_tool(fetch), {"url": "u"})) == {"url": "u",
                                                                          "tags": None}


def _dispatcher(client: Any, events: list[Any] | None = None, **budget: Any) -> Dispatcher:
    from recursa.obs.trace import CallbackSink
    sinks = [CallbackSink(events.append)] if events is not None else []
    return Dispatcher(ledger=Ledger(Budget(**budget)), tracer=Tracer(sinks), sub_client=client,
                      clients={})


def _call(name: str, **args: Any) -> str:
    return "```tool\n" + json.dumps({"name": name, "arguments": args}) + "\n```"


async def test_text_loop_runs_tools_and_returns_only_the_answer() -> None:
    sub = ReplayClient([_call("search", query="whale"), "The whale is blue."])
    events: list[Any] = []
    disp = _dispatcher(sub, events)
    ts = ToolSet.of([search])
    res = await run_tool_loop(disp, sub, [{"role": "user", "content": "What colour?"}], ts,
                              node=Node(depth=0, parent="p"), parent="sc")
    assert res.completion.text == "The whale is blue."
    assert (res.turns, res.tool_calls, res.tool_errors, res.forced) == (2, 1, 0, False)
    # usage is summed over both model turns
    assert res.completion.usage.input_tokens == sum(max(1, sum(len(m["content"]) for m in c) // 4)
                                                    for c in sub.calls)
    first, second = sub.calls
    assert first[0]["role"] == "system" and "<tool_call>" in first[0]["content"]
    assert json.dumps(make_tool(search).schema()) in first[0]["content"]
    assert second[-1] == {"role": "user", "content": "Result of search:\nhits for whale"}
    tool_evs = [e for e in events if e.kind == "tool"]
    assert [e.phase for e in tool_evs] == ["start", "end"]
    assert tool_evs[0].parent == "sc" and tool_evs[1].data["output"] == "hits for whale"
    assert ts.calls == 1 and ts.by_tool == {"search": 1}
    assert disp.ledger.subcalls == 1   # one sub-call, however many model turns it took


async def test_loop_reports_raising_and_hanging_tools_to_the_model() -> None:
    def boom() -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    def hang() -> str:
        time.sleep(2)
        return "late"

    sub = ReplayClient([_call("boom") + "\n" + "<tool_call>{\"name\": \"hang\"}</tool_call>",
                        _call("nosuch"), "gave up"])
    ts = ToolSet([make_tool(boom), make_tool(hang, timeout=0.3)])
    t0 = time.monotonic()
    res = await run_tool_loop(_dispatcher(sub), sub, [{"role": "user", "content": "go"}], ts,
                              node=Node(depth=0, parent="p"), parent="sc")
    assert time.monotonic() - t0 < 1.5
    assert res.completion.text == "gave up"
    assert (res.tool_calls, res.tool_errors) == (3, 3)
    msgs = [m["content"] for m in sub.calls[1][-2:]]
    assert "Error: tool hang timed out after 0.3s" in msgs[0] + msgs[1]
    assert "Error: tool boom raised RuntimeError: disk on fire" in msgs[0] + msgs[1]
    assert "unknown tool 'nosuch'" in sub.calls[2][-1]["content"]
    assert ts.errors == 3 and ts.seconds >= 0.3


async def test_loop_forces_an_answer_after_max_turns() -> None:
    sub = ReplayClient([_call("search", query=str(i)) for i in range(3)] + ["final words"])
    ts = ToolSet.of([search], max_turns=3)
    res = await run_tool_loop(_dispatcher(sub), sub, [{"role": "user", "content": "go"}], ts,
                              node=Node(depth=0, parent="p"), parent="sc")
    assert res.forced and res.turns == 4 and res.tool_calls == 3
    assert res.completion.text == "final words"
    assert sub.calls[-1][-1]["content"] == FORCE_ANSWER


async def test_loop_caps_tool_output() -> None:
    def big() -> str:
        return "x" * 10_000
    sub = ReplayClient([_call("big"), "ok"])
    ts = ToolSet([make_tool(big)], max_output_chars=500)
    await run_tool_loop(_dispatcher(sub), sub, [{"role": "user", "content": "go"}], ts,
                        node=Node(depth=0, parent="p"), parent="sc")
    assert len(sub.calls[1][-1]["content"]) < 700
    assert "9,500 more characters cut" in sub.calls[1][-1]["content"]


class NativeClient:
    """A client that speaks OpenAI tool calls (what openai_client would need to return)."""

    name = "native:test"
    capabilities = Capabilities(tools=True)

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], **options: Any) -> Completion:
        self.calls.append((messages, options))
        if len(self.calls) == 1:
            raw = {"choices": [{"message": {"content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "search", "arguments": "{\"query\": \"q\"}"}}]}}]}
            return Completion(text="", usage=Usage(input_tokens=10, output_tokens=5), raw=raw,
                              cost_usd=0.001)
        return Completion(text="native answer", usage=Usage(input_tokens=20, output_tokens=3),
                          cost_usd=0.002, raw={"choices": [{"message": {"content": "x"}}]})

    async def aclose(self) -> None:
        pass


async def test_native_tool_calls() -> None:
    client = NativeClient()
    disp = _dispatcher(client)
    res = await run_tool_loop(disp, client, [{"role": "user", "content": "go"}],
                              ToolSet.of([search]), node=Node(depth=0, parent="p"), parent="sc")
    assert res.completion.text == "native answer"
    assert res.completion.usage == Usage(input_tokens=30, output_tokens=8)
    assert res.completion.cost_usd == pytest.approx(0.003)
    first_msgs, first_opts = client.calls[0]
    assert first_opts["tools"][0]["function"]["name"] == "search"
    assert all(m["role"] != "system" for m in first_msgs)   # no text protocol
    msgs, _ = client.calls[1]
    assert msgs[-2]["tool_calls"][0]["id"] == "call_1"
    assert msgs[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "hits for q"}
    assert disp.ledger.by_role["sub"].usage.total_tokens == 38


# ------------------------------------------------------------------ inside a real RLM run
SECRET = "SECRET-TOOL-OUTPUT-7f3a"


def lookup(key: str) -> str:
    """Look a key up in the private registry.

    Args:
        key: the key.
    """
    return f"{SECRET}: the code for {key} is 42. " + "verbose " * 500


def test_tool_output_never_reaches_the_root(tmp_path: Any) -> None:
    root = ReplayClient(["```repl\nr = llm_query('What is the code for x? Use lookup.')\n"
                         "print(r)\n```",
                         "```repl\nFINAL(r)\n```"])
    sub = ReplayClient([_call("lookup", key="x"), "The code is 42."])
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=root, sub_model=sub, sandbox="inprocess", sub_tools=[lookup],
              trace_path=trace)
    assert rlm.tool_names == ["lookup"]
    res = rlm.completion("What is the code for x?", context="some context")
    assert res.answer == "The code is 42."
    root_text = json.dumps(root.calls)
    assert SECRET not in root_text and "verbose" not in root_text
    assert "lookup" in root.calls[0][0]["content"]   # the system prompt names the tool
    assert "The code is 42." in root.calls[1][-1]["content"]   # the REPL saw the answer
    assert SECRET in json.dumps(sub.calls)             # the sub-model did see it
    run = load(trace)
    [sc] = [n for n in run.walk() if n.kind == "subcall"]
    assert sc.data["response"] == "The code is 42."
    assert (sc.data["tool_calls"], sc.data["tool_errors"], sc.data["model_turns"]) == (1, 0, 2)
    [tool] = [n for n in run.walk() if n.kind == "tool"]
    assert tool.parent == sc.id and tool.data["name"] == "lookup"
    assert tool.data["output_chars"] > 4000 and len(tool.data["output"]) < 2100
    assert res.usage["sub"].usage.input_tokens == sc.usage.input_tokens
    assert rlm.sub_tools is not None and rlm.sub_tools.calls == 1


def test_rlm_without_tools_is_unchanged() -> None:
    rlm = RLM(model=ReplayClient(["```repl\nFINAL('x')\n```"]), sandbox="inprocess")
    assert rlm.tool_names is None and rlm.sub_tools is None
    assert rlm.completion("q", context="c").answer == "x"
