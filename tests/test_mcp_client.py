"""MCP tools in the REPL (recursa.core.mcp_tools): a real stdio server (tests/mcp_sqlite_server.py,
the official SDK's MCPServer) started by the run, called by the host for sandboxed code."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers_scripted import SYSTEM_MARK, repl, root_calls, root_script
from recursa import RLM
from recursa.core.budget import Budget, Ledger
from recursa.core.mcp_tools import (
    McpConfigError,
    McpError,
    McpHub,
    McpTool,
    ServerConfig,
    function_name,
    load_servers,
)
from recursa.models import ReplayClient
from recursa.obs.trace import Tracer, load, load_events

pytest.importorskip("mcp")

SERVER = str(Path(__file__).with_name("mcp_sqlite_server.py"))
SECRET = "s3cret-token-for-the-server-only"


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "fruit.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE fruit (name TEXT, color TEXT)")
        c.executemany("INSERT INTO fruit VALUES (?, ?)",
                      [("banana", "yellow"), ("cherry", "red"), ("kiwi", "green")])
    return str(path)


def config(db: str, pidfile: Path | None = None, **extra: Any) -> dict[str, Any]:
    env = {"RECURSA_TEST_SECRET": SECRET}
    if pidfile is not None:
        env["RECURSA_TEST_PIDFILE"] = str(pidfile)
    return {"mcpServers": {"db": {"command": sys.executable, "args": [SERVER, db], "env": env,
                                  **extra}}}


def gone(pidfile: Path) -> bool:
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")      # a zombie not reaped yet is stopped too
    return stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z")


def cells(trace: Path) -> list[str]:
    return [e.data.get("output", "") for e in load_events(trace)
            if e.kind == "cell" and e.phase == "end"]


# ------------------------------------------------------------------ a whole run
def test_repl_calls_mcp_tools_through_the_host(db: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's code calls the allowed tools as typed functions and answers from a result;
    the sandbox never holds the server's env; a tool off the allow-list, past a cap or past
    the budget is refused with an error naming why; each call is a traced sub-call."""
    pidfile = tmp_path / "server.pid"
    root = ReplayClient(root_script(
        repl("import inspect, os\n"
             "print(inspect.signature(mcp_db_query))\n"
             "print('doc:', mcp_db_query.__doc__.splitlines()[0])\n"
             "print('sandbox env:', repr(os.environ.get('RECURSA_TEST_SECRET')))\n"
             f"print('in any env value:', any({SECRET!r} in v for v in os.environ.values()))\n"
             "print('server env:', mcp_db_secret_env())\n"
             "print('host key at the server:', repr(mcp_db_secret_env('RECURSA_HOST_KEY')))\n"
             "print('list_tables defined:', 'mcp_db_list_tables' in globals())"),
        repl("try:\n    mcp_db_describe(500)\nexcept ValueError as e:\n    print('cap:', e)\n"
             "try:\n    mcp_db_query('SELECT ' + repr('x' * 300))\n"
             "except ValueError as e:\n    print('argcap:', e)\n"
             "print('raw:', llm_query.__self__._call('host_function', "
             "{'name': 'mcp_db_list_tables', 'arguments': {}}))"),
        repl("import os\nos._exit(3)"),      # the worker dies: its restart defines them again
        repl("rows = mcp_db_query(\"SELECT name FROM fruit WHERE color = 'yellow'\")\n"
             "print(rows)\n"
             "try:\n    mcp_db_query('SELECT 1')\nexcept RuntimeError as e:\n"
             "    print('budget:', e)\n"
             "FINAL(rows[0]['name'])")))
    monkeypatch.setenv("RECURSA_HOST_KEY", "a model API key of the host")
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=root, sandbox="local", trace_path=trace, max_subcalls=4,
              mcp_servers=config(db, pidfile, allow=["query", "describe", "secret_env"],
                                 max_result_chars=100, max_argument_chars=200))
    res = rlm.completion("Which fruit is yellow?", context="the fruit table is in the db")
    assert res.status == "final" and res.answer == "banana", res
    out = cells(trace)
    # typed: signature and docstring from the tool's inputSchema and description
    assert "(sql: str, limit: int = 100)" in out[0]
    assert "doc: Run one read-only SQL SELECT" in out[0]
    # the env reaches the server (the host started it) and never the sandbox
    assert "sandbox env: None" in out[0] and "in any env value: False" in out[0]
    assert f"server env: {SECRET}" in out[0]
    assert "RECURSA_TEST_SECRET" not in os.environ      # nor the host's own environment
    assert "host key at the server: ''" in out[0]     # the host's env is not the server's
    assert "list_tables defined: False" in out[0]
    assert "cap:" in out[1] and "max_result_chars" in out[1] and "100" in out[1]
    assert "argcap:" in out[1] and "max_argument_chars" in out[1] and "200" in out[1]
    assert "raw: {'error':" in out[1] and "not an allowed MCP tool" in out[1]
    assert "PermissionError" in out[1]
    assert "restarted" in out[2]
    assert "[{'name': 'banana'}]" in out[3]
    assert "budget:" in out[3] and "max_subcalls" in out[3]
    # counted: secret_env twice, describe (it ran; its result was over the cap), the query
    assert res.subcalls == 4
    assert res.usage["mcp"].calls == 4 and res.usage["mcp"].usage.total_tokens == 0
    assert res.usage_by_model["mcp:db"].calls == 4
    # traced: a tool span per call that went to the server, under its cell
    events = load_events(trace)
    ends = [e for e in events if e.kind == "tool" and e.phase == "end"]
    assert [(e.data["server"], e.data["tool"]) for e in ends] == \
        [("db", "secret_env"), ("db", "secret_env"), ("db", "describe"), ("db", "query")]
    assert ends[2].data["error"] and "max_result_chars" in ends[2].data["error"]
    assert ends[3].data["output"] == json.dumps([{"name": "banana"}])
    cell_ids = {e.id for e in events if e.kind == "cell"}
    assert all(e.parent in cell_ids for e in ends)
    assert load(trace).status == "final"       # the trace reader takes the new spans
    # the root was told about the tools, briefly
    system = root_calls(root)[0][0]["content"]
    assert SYSTEM_MARK in system
    assert "`mcp_db_query(sql: str, limit: int = 100)`: Run one read-only SQL SELECT" in system
    assert "mcp_db_list_tables" not in system
    # the server was stopped when the run ended
    assert gone(pidfile)


def test_sub_models_call_mcp_tools_when_asked(db: str, tmp_path: Path) -> None:
    """`"sub_models": true`: the tools are sub-model tools too; their calls count and are
    traced by the tool loop."""
    root = ReplayClient(root_script(
        repl("r = llm_query('What colour is the kiwi? Use the database.')\nFINAL(r)")))
    call = {"name": "mcp_db_query",
            "arguments": {"sql": "SELECT color FROM fruit WHERE name = 'kiwi'"}}
    sub = ReplayClient([f"<tool_call>{json.dumps(call)}</tool_call>", "green"])
    trace = tmp_path / "t.jsonl"
    rlm = RLM(model=root, sub_model=sub, sandbox="inprocess", trace_path=trace, route="auto",
              mcp_servers=config(db, allow=["query"], sub_models=True))   # "x" would go direct
    assert rlm.route_for("kiwi colour?", "x").path == "direct"   # were there no MCP tools
    res = rlm.completion("kiwi colour?", context="x")
    assert res.answer == "green" and res.route == "rlm"
    assert "Result of mcp_db_query:\n[{\"color\": \"green\"}]" in sub.calls[1][-1]["content"]
    assert res.subcalls == 2 and res.usage["mcp"].calls == 1
    tools = [e for e in load_events(trace) if e.kind == "tool" and e.phase == "end"]
    assert [e.data["name"] for e in tools] == ["mcp_db_query"] and not tools[0].data["error"]
    system = root_calls(root)[0][0]["content"]
    assert "sub-models (llm_query, llm_batch) can use these tools" in system


# ------------------------------------------------------------------ starting and stopping
def test_a_server_that_fails_to_start_is_named(tmp_path: Path) -> None:
    cfg = {"mcpServers": {"broken": {
        "command": sys.executable, "allow": ["x"],
        "args": ["-c", "import sys; sys.stderr.write('boom: no such database\\n'); sys.exit(3)"]}}}
    rlm = RLM(model=ReplayClient([repl("FINAL('x')")]), sandbox="inprocess", mcp_servers=cfg)
    with pytest.raises(McpError) as e:
        rlm.completion("q", context="x")
    assert "MCP server 'broken'" in str(e.value) and "boom: no such database" in str(e.value)


def test_an_allowed_tool_the_server_lacks_is_an_error_and_the_server_is_stopped(
        db: str, tmp_path: Path) -> None:
    """The server started, its tools did not match: the run fails before its first model call,
    naming what is missing and what there is, and the server is closed all the same."""
    pidfile = tmp_path / "server.pid"
    root = ReplayClient([repl("FINAL('x')")])
    rlm = RLM(model=root, sandbox="inprocess",
              mcp_servers=config(db, pidfile, allow=["query", "drop_everything"]))
    with pytest.raises(McpError, match=r"'db'.*no tool named drop_everything.*it has: "
                       r"describe, list_tables, query, secret_env"):
        rlm.completion("q", context="x")
    assert root.calls == []
    assert gone(pidfile)


def test_a_command_that_does_not_exist_is_named() -> None:
    rlm = RLM(model=ReplayClient([repl("FINAL('x')")]), sandbox="inprocess",
              mcp_servers={"mcpServers": {"ghost": {"command": "/nonexistent/mcp-ghost",
                                                     "allow": "*"}}})
    with pytest.raises(McpError, match=r"MCP server 'ghost' \(/nonexistent/mcp-ghost\) could "
                       "not start"):
        rlm.completion("q", context="x")


def test_mcp_servers_are_refused_in_sessions(db: str) -> None:
    rlm = RLM(model=ReplayClient([]), sandbox="inprocess", mcp_servers=config(db, allow="*"))
    with pytest.raises(McpConfigError, match="not available in sessions"):
        rlm.session("x")


# ------------------------------------------------------------------ the config
def test_config_shapes_and_errors(tmp_path: Path) -> None:
    entry = {"command": "srv", "args": ["-x"], "env": {"K": "key-123"}, "allow": ["a"]}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"one": entry}}))
    for spec in (tmp_path / "mcp.json", str(tmp_path / "mcp.json"),
                 {"mcpServers": {"one": entry}}, {"one": entry}):
        [s] = load_servers(spec)
        assert (s.name, s.command, s.args, dict(s.env), s.allow) == \
            ("one", "srv", ("-x",), {"K": "key-123"}, ("a",))
        assert "key-123" not in repr(s)      # the env (keys) never shows in a repr
    assert load_servers({"off": {**entry, "disabled": True}}) == []
    assert load_servers({"s": {"command": "c", "allow": "*"}})[0].allows("anything")
    assert not load_servers({"s": {"command": "c"}})[0].allows("a")   # nothing by default
    bad = [({"s": {"command": "c", "alow": ["a"]}}, "unknown key.*alow"),
           ({"s": {"url": "http://x"}}, "only stdio"),
           ({"s": {"command": "c", "allow": "all"}}, "'s'.*\"allow\" must be a list"),
           ({"s": {"command": ""}}, "'s'.*command"),
           ({"s": {"command": "c", "env": {"K": 1}}}, "'s'.*env"),
           ({"s": {"command": "c", "max_result_chars": 0}}, "max_result_chars.*positive"),
           ({"bad name": {"command": "c"}}, "'bad name'"),
           ({"mcpServers": []}, "must be an object"),
           (42, "path to a JSON file")]
    for spec, msg in bad:
        with pytest.raises(McpConfigError, match=msg):
            load_servers(spec)
    with pytest.raises(McpConfigError, match="missing.json"):
        load_servers(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(McpConfigError, match="broken.json is not JSON"):
        load_servers(tmp_path / "broken.json")


def test_a_server_with_nothing_allowed_is_not_started() -> None:
    hub = McpHub(load_servers({"s": {"command": "/nonexistent"}}), ledger=Ledger(Budget()),
                 tracer=Tracer([], "r"))
    assert hub.servers == []


def test_names_are_namespaced_identifiers_and_specs_typed() -> None:
    assert function_name("my-db", "read.query") == "mcp_my_db_read_query"
    server = ServerConfig(name="db", command="c", allow="*")
    tool = McpTool(server=server, tool="q", name="mcp_db_q", description="Query it. More.",
                   input_schema={"type": "object", "required": ["sql"], "properties": {
                       "limit": {"type": "integer", "default": 10},
                       "sql": {"type": "string", "description": "the SELECT"},
                       "from": {"type": "string"}, "odd-name": {}}})
    spec = tool.spec()
    assert [p["name"] for p in spec["params"]] == ["limit", "sql"]   # keywords go as **extra
    assert spec["extra"] == "extra"
    assert tool.signature() == "mcp_db_q(sql: str, limit: int = 10)"
    assert tool.summary() == "Query it."
    assert "sql (string, required): the SELECT" in tool.doc()


def test_worker_defines_typed_host_functions() -> None:
    """The worker side (stdlib only): a typed function that sends what was given."""
    from recursa.sandbox.inprocess import worker_module
    mod = worker_module()
    sent: list[tuple[str, dict[str, Any]]] = []

    def call(kind: str, args: dict[str, Any]) -> Any:
        sent.append((kind, args))
        if args["arguments"].get("sql") == "boom":
            return {"error": "not allowed", "type": "PermissionError"}
        return {"value": [1, 2]}
    r = mod.Repl(call, mod.StreamRouter(None, "o"), mod.StreamRouter(None, "e"))
    r.define_functions([{"name": "mcp_db_q", "doc": "Query.", "extra": "extra", "params": [
        {"name": "limit", "type": "integer", "required": False, "default": 10},
        {"name": "sql", "type": "string", "required": True}]}])
    fn = r.globals["mcp_db_q"]
    import inspect
    assert str(inspect.signature(fn)) == "(sql: str, limit: int = 10, **extra)"
    assert fn.__doc__ == "Query." and "mcp_db_q" not in r.user_variables()
    assert fn("SELECT 1", **{"odd-name": 2}) == [1, 2]
    assert sent[-1] == ("host_function", {"name": "mcp_db_q",
                                          "arguments": {"sql": "SELECT 1", "odd-name": 2}})
    with pytest.raises(PermissionError, match="not allowed"):
        fn(sql="boom")
    with pytest.raises(TypeError, match="mcp_db_q\\(\\): missing a required argument"):
        fn()
    for bad in ("llm_query", "_x", "class", "a b"):
        with pytest.raises(ValueError, match="bad host function name"):
            r.define_functions([{"name": bad}])


# ------------------------------------------------------------------ the command line
def test_recursa_run_mcp_config(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                ) -> None:
    """`recursa run --mcp CONFIG` (its main(), in this process: the subprocess start-up of
    recursa would double the test's time): the config file the user wrote, a scripted model; a
    config with an error is a usage error naming the server and the key."""
    from recursa.cli import main
    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps(config(db, allow=["query"])))
    replies = tmp_path / "script.json"
    replies.write_text(json.dumps([repl(
        "FINAL(mcp_db_query(\"SELECT name FROM fruit WHERE color = 'red'\")[0]['name'])")]))
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("the fruit are in the database")
    base = ["run", "Which fruit is red?", "--context", str(ctx), "--model",
            f"replay-file:{replies}", "--sandbox", "inprocess", "--quiet"]
    assert main([*base, "--mcp", str(cfg)]) == 0
    assert capsys.readouterr().out.strip() == "cherry"
    cfg.write_text(json.dumps({"mcpServers": {"db": {"command": "x", "allowed": ["query"]}}}))
    assert main([*base, "--mcp", str(cfg)]) == 2
    assert "MCP server 'db': unknown key(s) allowed" in capsys.readouterr().err


def test_the_prompt_lists_tools_only_when_there_are_some() -> None:
    from recursa.core.prompts import system_prompt
    plain = system_prompt(context_type="str", max_output_chars=1000)
    assert "MCP" not in plain
    line = "`mcp_db_q(sql: str)`: Query it."
    with_tools = system_prompt(context_type="str", max_output_chars=1000, repl_tools=[line])
    assert "Tools of MCP servers" in with_tools and f"  - {line}\n" in with_tools


def test_a_run_with_mcp_tools_writes_code_even_with_a_small_root() -> None:
    """`strategy="auto"` plans for small roots, but a plan cannot call MCP tools."""
    from recursa.core.strategy import choose
    assert choose("auto", "local:qwen2.5-coder-1.5b")[0] == "plan"
    assert choose("auto", "local:qwen2.5-coder-1.5b", code_tools=True) == \
        ("code", "auto: the run has MCP tools, which only code can call")
    assert choose("plan", "local:qwen2.5-coder-1.5b", code_tools=True)[0] == "plan"


async def test_a_server_that_never_answers_times_out_by_name() -> None:
    """A server that starts but never speaks MCP: refused after the start timeout, named."""
    servers = load_servers({"mute": {"command": sys.executable, "allow": "*",
                                     "args": ["-c", "import sys; sys.stdin.read()"]}})
    hub = McpHub(servers, ledger=Ledger(Budget()), tracer=Tracer([], "r"), start_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(McpError, match=r"MCP server 'mute' .* did not start within 0.5 s"):
        async with hub:
            pass
    assert time.monotonic() - t0 < 10.0     # and stopped: not the 30 s default, no hang


def test_mcp_tools_reach_the_wasm_sandbox(db: str, tmp_path: Path) -> None:
    """The functions ride in the worker's init message, so a sandbox that starts its own
    worker session must pass them on: the WebAssembly one too."""
    from recursa.sandbox.wasm_runtime import unavailable_reason
    why = unavailable_reason()
    if why:
        pytest.skip(why)
    root = ReplayClient(root_script(
        repl("rows = mcp_db_query(\"SELECT name FROM fruit WHERE color = 'yellow'\")\n"
             "FINAL(rows[0]['name'])")))
    rlm = RLM(model=root, sandbox="wasm", trace_path=tmp_path / "t.jsonl",
              mcp_servers=config(db, allow=["query"]))
    res = rlm.completion("Which fruit is yellow?", context="the fruit table is in the db")
    assert res.status == "final" and res.answer == "banana", res
    assert res.usage["mcp"].calls == 1
