"""Sub-model tools with native tool calls, over real HTTP to an OpenAI-protocol server."""

from __future__ import annotations

import json

from helpers_scripted import LOOKUPS, lookup
from helpers_scripted import tool_responder as responder
from openai_testserver import OpenAITestServer
from recursa import RLM
from recursa.models import make_client
from recursa.models.replay import ReplayClient


def test_native_tool_call_roundtrip_and_root_never_sees_tool_output():
    LOOKUPS.clear()
    root = ReplayClient(["```repl\nr = llm_query('How many people live in Paris?')\nprint(r)\n```",
                         "```repl\nFINAL(r)\n```"])
    with OpenAITestServer(responder=responder) as srv:
        sub = make_client("openai:sub-model", base_url=srv.base_url, api_key="k")
        res = RLM(model=root, sub_model=sub, sandbox="inprocess",
                  sub_tools=[lookup]).completion("q", context="ctx")
        assert srv.request_count == 2       # a tool turn, then the answer
    assert res.answer == "about two million"
    assert LOOKUPS == [{"city": "Paris"}]
    root_text = json.dumps(root.calls)
    assert "MARKER" not in root_text          # raw tool output never reaches the root
    assert "lookup" in root.calls[0][0]["content"]   # the root is told its sub-models' tools
