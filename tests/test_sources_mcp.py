"""`recursa mcp`'s rlm_answer returns the answer's checked sources: the official MCP SDK's client
spawns the real command over stdio, with a scripted model and the in-process sandbox."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

COMMIT = ('```repl\nFINAL("Lyon", sources=["The Ada meeting was held in Lyon", '
          '"It was held in Paris, said the minutes"])\n```')


async def test_rlm_answer_carries_checked_sources(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"cycle": [COMMIT]}))
    doc = tmp_path / "minutes.txt"
    doc.write_text("Minutes.\nThe Ada meeting was held in Lyon on 3 May.\n")
    p = StdioServerParameters(command=sys.executable, args=[
        "-m", "recursa.cli", "mcp", "--model", f"replay-file:{script}", "--sandbox",
        "inprocess"], cwd=str(tmp_path), env=dict(os.environ))   # the SDK passes only a few
                                                                # variables: PYTHONPATH too
    async with stdio_client(p) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        assert "sources" in tools.tools[0].input_schema["properties"]
        res = await session.call_tool("rlm_answer", {"question": "Where?", "path": str(doc),
                                                     "sources": True})
    assert not res.is_error
    out = res.structured_content
    assert out["answer"] == "Lyon" and out["sources_verified"] is False
    found, unfound = out["sources"]
    assert found["found"] and found["location"]["label"] == "line 2"
    assert not unfound["found"] and unfound["note"] == "not found in the context"
