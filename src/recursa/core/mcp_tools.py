"""MCP tools in the REPL: the host runs a run's MCP servers and calls their allowed tools for the
sandboxed code (and, when a server says `"sub_models": true`, for sub-models too).

    rlm = RLM(model=..., mcp_servers={"mcpServers": {"db": {
        "command": "uvx", "args": ["mcp-server-sqlite", "--db-path", "shop.db"],
        "env": {"SOME_KEY": "..."}, "allow": ["read_query", "list_tables"]}}})

The config is the JSON shape MCP clients already use, plus an allow-list per server: nothing
is allowed unless named in `"allow"` (or `"allow": "*"`, every tool the server lists). A
server with nothing allowed is not started. Each allowed tool becomes a typed function in the
REPL, `mcp_<server>_<tool>(...)` (names reduced to [A-Za-z0-9_]; the `mcp_` prefix keeps them off
the helpers' names), with its signature and docstring from the tool's `inputSchema` and
description. Calling it sends a `host_function` call over the worker protocol; the *host*
makes the MCP call with the official `mcp` SDK. The sandbox keeps no network, never sees the
server's command, env or keys, and cannot reach a tool that is not allowed: the host refuses it.

Arguments (as JSON) and results are capped (`max_argument_chars`, `max_result_chars`); a call
past a cap fails with an error naming the cap. Every call the host makes counts as one
sub-call of the run (`max_subcalls` bounds them; `Result.usage["mcp"]` counts them, at no tokens
and no cost) and is traced as a `tool` span (`server`, `tool`, `arguments`, `output`, `error`)
under its cell. Servers start once per run (a child RLM uses its run's), with the run's
budget, and are closed when the run ends, whatever ends it; a server that does not start is a
`McpError` naming it, before the first model call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recursa.base.types import BudgetExceeded, CallHandler, RecursaError, Usage

if TYPE_CHECKING:
    from recursa.core.budget import Ledger
    from recursa.core.dispatch import Node
    from recursa.core.tools import Tool, ToolSet
    from recursa.obs.trace import Tracer

ALLOW_ALL = "*"
PREFIX = "mcp_"
DEFAULT_START_TIMEOUT = 30.0          # seconds for a server to start and list its tools
DEFAULT_CALL_TIMEOUT = 60.0           # seconds per tool call
DEFAULT_MAX_ARGUMENT_CHARS = 100_000  # a call's arguments, as JSON
DEFAULT_MAX_RESULT_CHARS = 100_000    # a call's result, as JSON
TRACE_CHARS = 2000                    # arguments and output kept in the trace
DOC_CHARS = 2000                      # a tool's description in its docstring
CALL_KIND = "host_function"           # the worker's call for a host function

_OURS = {"command", "args", "env", "cwd", "allow", "sub_models", "timeout",
         "max_argument_chars", "max_result_chars"}
_IGNORED = {"type", "disabled"}       # other clients' keys this one understands
_PY_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
             "array": "list", "object": "dict"}


class McpError(RecursaError):
    """An MCP server could not be configured or started."""


class McpConfigError(McpError, ValueError):
    """The MCP servers' configuration is not usable (the message names the server and key)."""


class McpCallError(RecursaError):
    """A tool call refused or failed; `kind` names the Python error the REPL raises."""

    def __init__(self, message: str, kind: str = "RuntimeError"):
        super().__init__(message)
        self.kind = kind


# ==================================================================== configuration
@dataclass(frozen=True)
class ServerConfig:
    """One stdio MCP server of the config, with what recursa adds: `allow` (tool names, or
    ALLOW_ALL), `sub_models` (its tools are sub-model tools too), a timeout and caps."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    allow: tuple[str, ...] | str = ()
    sub_models: bool = False
    timeout: float = DEFAULT_CALL_TIMEOUT
    max_argument_chars: int = DEFAULT_MAX_ARGUMENT_CHARS
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS

    def allows(self, tool: str) -> bool:
        return self.allow == ALLOW_ALL or tool in self.allow

    def __repr__(self) -> str:     # the env may hold keys: never in a repr, a log or a trace
        return f"ServerConfig(name={self.name!r}, command={self.command!r}, allow={self.allow!r})"


def load_servers(spec: Any) -> list[ServerConfig]:
    """The servers of `spec`: a path to a JSON file, or its parsed form, either
    `{"mcpServers": {name: {...}}}` or `{name: {...}}`. Disabled servers are left out."""
    if isinstance(spec, str | os.PathLike):
        path = Path(spec)
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise McpConfigError(f"MCP config {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise McpConfigError(f"MCP config {path} is not JSON: {e}") from None
    if isinstance(spec, ServerConfig):
        return [spec]
    if isinstance(spec, list | tuple) and all(isinstance(s, ServerConfig) for s in spec):
        return list(spec)
    if not isinstance(spec, Mapping):
        raise McpConfigError("mcp_servers takes a path to a JSON file or a dict like "
                             '{"mcpServers": {"name": {"command": ..., "allow": [...]}}}, '
                             f"not {type(spec).__name__}")
    servers = spec.get("mcpServers", spec)
    if not isinstance(servers, Mapping):
        raise McpConfigError('"mcpServers" must be an object: {"name": {"command": ...}}')
    out = [_server(str(name), entry) for name, entry in servers.items()]
    return [s for s in out if s is not None]


def _server(name: str, entry: Any) -> ServerConfig | None:
    where = f"MCP server {name!r}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise McpConfigError(f"{where}: a name is 1-64 letters, digits, '_', '-' or '.'")
    if not isinstance(entry, Mapping):
        raise McpConfigError(f"{where}: its entry must be an object with a command")
    if entry.get("disabled"):
        return None
    if "url" in entry or entry.get("type", "stdio") != "stdio":
        raise McpConfigError(f"{where}: only stdio servers (a command) are supported")
    unknown = set(entry) - _OURS - _IGNORED
    if unknown:
        raise McpConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: "
                             f"{', '.join(sorted(_OURS))}")
    command = entry.get("command")
    if not isinstance(command, str) or not command:
        raise McpConfigError(f"{where}: \"command\" must be a non-empty string")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}: \"args\" must be a list of strings")
    env = entry.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in env.items()):
        raise McpConfigError(f"{where}: \"env\" must map names to strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise McpConfigError(f"{where}: \"cwd\" must be a string")
    allow = entry.get("allow", [])
    if allow != ALLOW_ALL and (not isinstance(allow, list)
                               or not all(isinstance(a, str) and a for a in allow)):
        raise McpConfigError(f"{where}: \"allow\" must be a list of tool names or \"*\" "
                             "(every tool the server lists)")
    numbers: dict[str, Any] = {}
    for key, kind in (("timeout", float), ("max_argument_chars", int),
                      ("max_result_chars", int)):
        if key in entry:
            v = entry[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 \
                    or (kind is int and not isinstance(v, int)):
                raise McpConfigError(f"{where}: \"{key}\" must be a positive "
                                     f"{'integer' if kind is int else 'number'}")
            numbers[key] = kind(v)
    if not isinstance(entry.get("sub_models", False), bool):
        raise McpConfigError(f"{where}: \"sub_models\" must be true or false")
    return ServerConfig(name=name, command=command, args=tuple(args), env=dict(env), cwd=cwd,
                        allow=ALLOW_ALL if allow == ALLOW_ALL else tuple(allow),
                        sub_models=bool(entry.get("sub_models", False)), **numbers)


# ==================================================================== tools
def _ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def function_name(server: str, tool: str) -> str:
    """The REPL name of `tool` of `server`: `mcp_<server>_<tool>`, reduced to an identifier."""
    return f"{PREFIX}{_ident(server)}_{_ident(tool)}"


@dataclass
class McpTool:
    """One allowed tool: where it lives and how the REPL calls it."""

    server: ServerConfig
    tool: str                       # the server's name for it
    name: str                       # the REPL's
    description: str
    input_schema: dict[str, Any]

    def spec(self) -> dict[str, Any]:
        """What the worker needs to define the function (Repl.define_functions)."""
        props = self.input_schema.get("properties") or {}
        required = set(self.input_schema.get("required") or [])
        params, odd = [], []
        for pname, prop in props.items() if isinstance(props, Mapping) else []:
            if not pname.isidentifier() or pname.startswith("_") or _is_keyword(pname):
                odd.append(pname)      # reachable through **extra only
                continue
            prop = prop if isinstance(prop, Mapping) else {}
            p: dict[str, Any] = {"name": pname, "type": prop.get("type")
                                 if isinstance(prop.get("type"), str) else None,
                                 "required": pname in required}
            default = prop.get("default")
            if not p["required"]:
                p["default"] = default if isinstance(default, str | int | float | bool) \
                    else None
            params.append(p)
        spec: dict[str, Any] = {"name": self.name, "params": params, "doc": self.doc()}
        if odd or self.input_schema.get("additionalProperties"):
            spec["extra"] = "extra" if "extra" not in props else "extra_arguments"
        return spec

    def signature(self) -> str:
        """`name(a: str, b: int = 5)`, as the system prompt shows it."""
        parts = []
        for p in sorted(self.spec()["params"], key=lambda p: not p["required"]):
            t = _PY_TYPES.get(p["type"] or "")
            s = p["name"] + (f": {t}" if t else "")
            if not p["required"]:
                s += f" = {p['default']!r}"
            parts.append(s)
        return f"{self.name}({', '.join(parts)})"

    def doc(self) -> str:
        text = self.description.strip()
        if len(text) > DOC_CHARS:
            text = text[:DOC_CHARS] + " ..."
        lines = [text or self.tool, ""]
        props = self.input_schema.get("properties") or {}
        required = set(self.input_schema.get("required") or [])
        if isinstance(props, Mapping) and props:
            lines.append("Args:")
            for pname, prop in props.items():
                prop = prop if isinstance(prop, Mapping) else {}
                what = str(prop.get("description") or prop.get("title") or "")[:300]
                t = prop.get("type", "any")
                lines.append(f"    {pname} ({t}{', required' if pname in required else ''})"
                             f"{': ' + what if what else ''}")
            lines.append("")
        lines.append(f"MCP tool {self.tool!r} of server {self.server.name!r}, called by the "
                     "host. Raises PermissionError, ValueError (a size cap), TimeoutError or "
                     "RuntimeError when the call fails.")
        return "\n".join(lines)

    def summary(self) -> str:
        first = re.split(r"(?<=[.!?])\s|\n", self.description.strip(), maxsplit=1)[0]
        return first[:160]


def _is_keyword(name: str) -> bool:
    import keyword
    return keyword.iskeyword(name)


# ==================================================================== the running servers
class McpHub:
    """The MCP servers of one run, started on entering, closed on leaving (always), and the
    calls to their allowed tools, charged to `ledger` and traced to `tracer`.

        async with McpHub(load_servers(cfg), ledger=ledger, tracer=tracer) as hub:
            payload.functions = hub.functions()   # the REPL's typed functions
            handler = hub.serve(handler, node)    # answers their calls
    """

    def __init__(self, servers: list[ServerConfig], *, ledger: Ledger, tracer: Tracer,
                 start_timeout: float = DEFAULT_START_TIMEOUT):
        self.servers = [s for s in servers if s.allow]     # nothing allowed: not started
        self.ledger = ledger
        self.tracer = tracer
        self.start_timeout = start_timeout
        self.tools: dict[str, McpTool] = {}
        self.calls = 0                      # calls made (refused ones not counted)
        self._clients: dict[str, Any] = {}
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> McpHub:
        try:
            for server in self.servers:
                await self._start(server)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._clients.clear()
        try:
            await self._stack.aclose()
        except Exception:       # a server that will not close cleanly is stopped all the same
            pass

    async def _start(self, server: ServerConfig) -> None:
        try:
            from mcp import Client
            from mcp.client.stdio import StdioServerParameters, stdio_client
        except ImportError:
            from recursa.base.extras import MissingExtra
            raise MissingExtra("mcp", "MCP servers (mcp_servers, --mcp)", module="mcp") from None
        where = f"MCP server {server.name!r} ({server.command})"
        # its stderr goes to a file of its own: shown when it fails to start, never mixed into
        # the run's terminal output
        errlog = self._stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8",
                                                                  errors="replace"))
        params = StdioServerParameters(command=server.command, args=list(server.args),
                                       env=dict(server.env) or None, cwd=server.cwd)
        try:
            async with asyncio.timeout(self.start_timeout):
                client = await self._stack.enter_async_context(
                    Client(stdio_client(params, errlog=errlog),
                           read_timeout_seconds=self.start_timeout))
                listed = await _list_tools(client)
        except TimeoutError:
            raise McpError(f"{where} did not start within {self.start_timeout:g} s"
                           f"{_tail(errlog)}") from None
        except Exception as e:
            raise McpError(f"{where} could not start: {_why(e)}{_tail(errlog)}") from None
        self._clients[server.name] = client
        names = {t.name for t in listed}
        missing = [] if server.allow == ALLOW_ALL else sorted(set(server.allow) - names)
        if missing:
            raise McpError(f"{where} has no tool named {', '.join(missing)} (its \"allow\" "
                           f"list); it has: {', '.join(sorted(names)) or 'no tools'}")
        for t in listed:
            if not server.allows(t.name):
                continue
            tool = McpTool(server=server, tool=t.name, name=function_name(server.name, t.name),
                           description=t.description or "",
                           input_schema=dict(t.input_schema or {}))
            if tool.name in self.tools:
                other = self.tools[tool.name]
                raise McpError(f"{where}: tool {t.name!r} and tool {other.tool!r} of server "
                               f"{other.server.name!r} both become {tool.name}; rename a server")
            self.tools[tool.name] = tool

    # ------------------------------------------------------------ what the run gets
    def functions(self) -> list[dict[str, Any]]:
        """The REPL's functions (ContextPayload.functions)."""
        return [t.spec() for t in self.tools.values()]

    def prompt_lines(self) -> list[str]:
        """One line per tool for the root's system prompt: signature and first sentence."""
        return [f"`{t.signature()}`" + (f": {t.summary()}" if t.summary() else "")
                for t in self.tools.values()]

    def sub_model_tools(self) -> list[Tool]:
        """The tools of servers with `"sub_models": true`, as sub-model tools
        (recursa.core.tools), calling through this hub."""
        from recursa.core.tools import Tool
        out = []
        for t in self.tools.values():
            if not t.server.sub_models:
                continue
            schema = {"type": "object", "properties": dict(t.input_schema.get("properties")
                                                          or {}),
                      "required": list(t.input_schema.get("required") or [])}
            out.append(Tool(name=t.name, description=t.description or t.tool, parameters=schema,
                            fn=self._sub_model_fn(t.name),
                            timeout=t.server.timeout + 5.0))
        return out

    def with_sub_tools(self, tools: ToolSet | None) -> ToolSet | None:
        """`tools` (the RLM's sub_tools) plus the sub-model MCP tools, as one ToolSet."""
        extra = self.sub_model_tools()
        if not extra:
            return tools
        from recursa.core.tools import ToolSet
        if tools is None:
            return ToolSet(extra)
        return ToolSet([*tools.tools, *extra], max_turns=tools.max_turns,
                       max_output_chars=tools.max_output_chars)

    def _sub_model_fn(self, name: str) -> Any:
        async def call(**arguments: Any) -> Any:
            try:
                return await self.call(name, arguments, parent=None, depth=0, trace=False)
            except McpCallError as e:
                raise RuntimeError(str(e)) from None
        call.__name__ = name
        return call

    def serve(self, handler: CallHandler, node: Node) -> CallHandler:
        """`handler`, answering the REPL's `host_function` calls (under `node`'s cell)."""
        async def handle(kind: str, args: dict[str, Any]) -> Any:
            if kind != CALL_KIND:
                return await handler(kind, args)
            name, arguments = args.get("name"), args.get("arguments")
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return {"error": "a host function call needs a name and an arguments object",
                        "type": "ValueError"}
            try:
                value = await self.call(name, arguments, parent=node.parent, depth=node.depth)
            except McpCallError as e:
                return {"error": str(e), "type": e.kind}
            return {"value": value}
        return handle

    # ------------------------------------------------------------ one call
    async def call(self, name: str, arguments: dict[str, Any], *, parent: str | None,
                   depth: int, trace: bool = True) -> Any:
        """Call the allowed tool `name` (its REPL name): its result, or McpCallError. Refused
        (not counted) when not allowed or past the argument cap; counted as a sub-call once
        it goes to the server. `trace=False`: a sub-model's call, which the tool loop traces
        (recursa.core.tools)."""
        tool = self.tools.get(name)
        if tool is None:
            raise McpCallError(f"{name!r} is not an allowed MCP tool of this run (allowed: "
                               f"{', '.join(sorted(self.tools)) or 'none'}); a server's tools "
                               "are allowed by its \"allow\" list", "PermissionError")
        cfg = tool.server
        try:
            sent = json.dumps(arguments, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise McpCallError(f"{name}: the arguments are not JSON ({e})", "ValueError") \
                from None
        if len(sent) > cfg.max_argument_chars:
            raise McpCallError(f"{name}: the arguments are {len(sent):,} characters of JSON, "
                               f"over the cap of {cfg.max_argument_chars:,} (max_argument_chars "
                               f"of server {cfg.name!r})", "ValueError")
        from recursa.core.dispatch import wall_limit
        try:
            async with wall_limit(self.ledger, f"a call to MCP tool {name}"):
                res = await self.ledger.areserve(tokens=0, cost=0.0, subcall=True)
        except BudgetExceeded as e:
            raise McpCallError(f"{name}: {e} (no more sub-calls, MCP calls included, can be "
                               "made)", "RuntimeError") from None
        t0 = time.monotonic()
        ev = self.tracer.emit("tool", phase="start", parent=parent, depth=depth, name=name,
                              server=cfg.name, tool=tool.tool,
                              arguments=_cut(sent, TRACE_CHARS)) if trace else ""
        error: McpCallError | None = None
        value: Any = None
        shown = ""
        try:
            try:
                async with wall_limit(self.ledger, f"a call to MCP tool {name}"):
                    value, shown = await self._send(tool, arguments)
            except BudgetExceeded as e:
                error = McpCallError(f"{name}: {e}", "TimeoutError")
            except McpCallError as e:
                error = e
            except asyncio.CancelledError:
                error = McpCallError(f"{name}: cancelled")
                raise
        finally:
            self.calls += 1
            self.ledger.settle(res, usage=Usage(), cost=0.0, role="mcp", model=f"mcp:{cfg.name}")
            if trace:
                self.tracer.emit("tool", id=ev, phase="end", parent=parent, depth=depth,
                                 name=name, server=cfg.name, tool=tool.tool,
                                 output=None if error else _cut(shown, TRACE_CHARS),
                                 output_chars=None if error else len(shown),
                                 error=str(error) if error else None,
                                 elapsed_s=round(time.monotonic() - t0, 4))
        if error is not None:
            raise error
        return value

    async def _send(self, tool: McpTool, arguments: dict[str, Any]) -> tuple[Any, str]:
        cfg = tool.server
        client = self._clients.get(cfg.name)
        if client is None:
            raise McpCallError(f"{tool.name}: MCP server {cfg.name!r} is closed")
        try:
            async with asyncio.timeout(cfg.timeout):
                result = await client.call_tool(tool.tool, arguments,
                                                read_timeout_seconds=cfg.timeout)
        except TimeoutError:
            raise McpCallError(f"{tool.name}: no answer from MCP server {cfg.name!r} within "
                               f"{cfg.timeout:g} s (its \"timeout\")", "TimeoutError") from None
        except Exception as e:
            raise McpCallError(f"{tool.name}: MCP server {cfg.name!r} failed: {_why(e)}") \
                from None
        value = _value(result, tool)
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                                default=str)
        if getattr(result, "is_error", False):
            raise McpCallError(f"{tool.name}: the tool failed: {_cut(shown, 2000)}")
        if len(shown) > cfg.max_result_chars:
            raise McpCallError(f"{tool.name}: the result is {len(shown):,} characters, over the "
                               f"cap of {cfg.max_result_chars:,} (max_result_chars of server "
                               f"{cfg.name!r}); ask for less", "ValueError")
        return value, shown


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(100):       # pages; a server that never ends its listing is cut off
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _value(result: Any, tool: McpTool) -> Any:
    """A call's result as Python: its structured content when it has one (unwrapped from the
    SDK's {"result": ...} when that is its whole output schema), else its text parts joined;
    other parts (images, resources) as a short note of what they were."""
    structured = getattr(result, "structured_content", None)
    if structured is not None and not getattr(result, "is_error", False):
        if isinstance(structured, dict) and set(structured) == {"result"}:
            return structured["result"]
        return structured
    parts = []
    for c in getattr(result, "content", None) or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(str(getattr(c, "text", "")))
        else:
            mime = getattr(c, "mime_type", None) or ""
            parts.append(f"[{kind} content{' ' + mime if mime else ''} not shown]")
    return "\n".join(parts)


def _why(e: BaseException) -> str:
    """The first leaf of an exception group (the SDK's task groups wrap what failed)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _tail(errlog: Any, chars: int = 1500) -> str:
    try:
        errlog.flush()
        errlog.seek(0)
        text = errlog.read().strip()
    except (OSError, ValueError):
        return ""
    return f"; its stderr ends:\n{text[-chars:]}" if text else ""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit:,} more]"
