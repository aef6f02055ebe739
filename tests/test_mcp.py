"""`recursa mcp`: the official MCP SDK's client spawns the real command over stdio, with the
test-only scripted model (`--model replay-file:...`) and the in-process sandbox."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

# The scripted root model: one turn that describes `context` and calls a sub-model once.
SCRIPT = {"cycle": [
    "```repl\ns = llm_query('hi')\n"
    "FINAL('type=' + type(context).__name__ + ' n=' + str(len(context)) + ' sub=' + s[:2])\n```"
]}


def params(tmp_path: Path, *extra: str, sandbox: str = "inprocess",
           cwd: Path | None = None) -> StdioServerParameters:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return StdioServerParameters(command=sys.executable, args=[
        "-m", "recursa.cli", "mcp", "--model", f"replay-file:{script}",
        "--sandbox", sandbox, *extra], cwd=str(cwd or tmp_path))


async def call(p: StdioServerParameters, args: dict[str, Any],
               progress: list[str] | None = None) -> Any:
    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if progress is not None:
            progress.append(message or "")

    async with stdio_client(p) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        assert [t.name for t in tools.tools] == ["rlm_answer"]
        schema = tools.tools[0].input_schema
        assert {"question", "path", "text"} <= set(schema["properties"])
        assert schema["required"] == ["question"]
        return await session.call_tool("rlm_answer", args, progress_callback=on_progress)


async def test_mcp_answers_over_text_file_and_directory(tmp_path: Path) -> None:
    p = params(tmp_path)
    seen: list[str] = []
    res = await call(p, {"question": "How long?", "text": "x" * 321}, seen)
    assert not res.is_error
    out = res.structured_content
    assert out["answer"].startswith("type=str n=321 sub=")
    assert out["status"] == "final" and out["turns"] == 1 and out["subcalls"] == 1
    assert out["total_tokens"] == out["input_tokens"] + out["output_tokens"] > 0
    assert out["cost_usd"] == 0.0
    assert any("turn 1" in s for s in seen), seen      # progress notifications arrived

    f = tmp_path / "notes.txt"
    f.write_text("hello world")
    res = await call(p, {"question": "q", "path": str(f)})
    assert res.structured_content["answer"].startswith("type=str n=11")

    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.md").write_text("a")
    (d / "b.md").write_text("b")
    res = await call(p, {"question": "q", "path": str(d), "max_iterations": 2})
    assert res.structured_content["answer"].startswith("type=dict n=2")


async def test_mcp_tool_errors_are_reported(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    root = tmp_path / "root"
    root.mkdir()
    p = params(tmp_path, "--root", str(root))
    res = await call(p, {"question": "q"})
    assert res.is_error and "exactly one" in res.content[0].text
    res = await call(p, {"question": "q", "path": str(outside)})
    assert res.is_error and "outside this server's root" in res.content[0].text
    res = await call(p, {"question": "q", "path": "missing.txt"})
    assert res.is_error and "does not exist" in res.content[0].text


async def test_mcp_without_root_serves_only_the_directory_it_started_in(tmp_path: Path) -> None:
    """A client may not read any file the user can (a credentials file) without `--root`."""
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key=abc")
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("hello")
    (work / "link").symlink_to(secret)       # a symlink out of the root is outside too
    p = params(tmp_path, cwd=work)
    res = await call(p, {"question": "q", "path": "notes.txt"})
    assert not res.is_error and res.structured_content["answer"].startswith("type=str n=5")
    for path in (str(secret), "../credentials", "link"):
        res = await call(p, {"question": "q", "path": path})
        assert res.is_error and "outside this server's root" in res.content[0].text, path
    # an explicit --root / restores access to every readable file
    res = await call(params(tmp_path, "--root", "/", cwd=work),
                     {"question": "q", "path": str(secret)})
    assert not res.is_error and res.structured_content["answer"].startswith("type=str n=25")


async def test_mcp_with_the_isolated_local_sandbox(tmp_path: Path) -> None:
    """The default sandbox: a worker process whose output must not reach the MCP wire."""
    res = await call(params(tmp_path, sandbox="local"),
                     {"question": "q", "text": "hello", "max_cost_usd": 1.0})
    assert not res.is_error, res.content
    assert res.structured_content["answer"].startswith("type=str n=5")
    assert json.loads(res.content[0].text)["status"] == "final"   # text content: the same JSON
