"""Sub-model tools with native tool calls, over real HTTP to an OpenAI-protocol server."""

from __future__ import annotations

import json

from openai_testserver import OpenAITestServer
from recursa import RLM
from recursa.models import make_client
from recursa.models.replay import ReplayClient

SEEN: list[dict] = []


def lookup(city: str) -> str:
    """Population of a city.

    Args:
        city: the city's name.
    """
    SEEN.append({"city": city})
    return f"{city}: 2,1 million people (RAW TOOL OUTPUT MARKER)"


def responder(req: dict):
    msgs = req["messages"]
    if req.get("tools") and not any(m.get("role") == "tool" for m in msgs):
        assert req["tools"][0]["function"]["name"] == "lookup"
        return {"content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"city": "Paris"})}}]}
    tool_msgs = [m for m in msgs if m.get("role") == "tool"]
    return "about two million" if tool_msgs and "MARKER" in tool_msgs[0]["content"] else "no"


def test_native_tool_call_roundtrip_and_root_never_sees_tool_output():
    SEEN.clear()
    root = ReplayClient(["```repl\nr = llm_query('How many people live in Paris?')\nprint(r)\n```",
                         "```repl\nFINAL(r)\n```"])
    with OpenAITestServer(responder=responder) as srv:
        sub = make_client("openai:sub-model", base_url=srv.base_url, api_key="k")
        res = RLM(model=root, sub_model=sub, sandbox="inprocess",
                  sub_tools=[lookup]).completion("q", context="ctx")
        assert srv.request_count == 2       # a tool turn, then the answer
    assert res.answer == "about two million"
    assert SEEN == [{"city": "Paris"}]
    root_text = json.dumps(root.calls)
    assert "MARKER" not in root_text          # raw tool output never reaches the root
    assert "lookup" in root.calls[0][0]["content"]   # the root is told its sub-models' tools
