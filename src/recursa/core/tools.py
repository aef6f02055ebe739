"""Tools that only sub-models may call, and the tool-calling loop that runs them on the host.

    def search(query: str, k: int = 5) -> str:
        '''Search the corpus.

        Args:
            query: words to look for.
            k: how many hits to return.
        '''
    rlm = RLM(model=..., sub_tools=[search, open_page])

A sub-call made while the run has tools runs `run_tool_loop`: the sub-model may call tools for
up to `max_turns` turns, then it is asked once more, without tools, for its answer. The REPL
(and so the root model) gets only that final answer; tool output stays inside the loop and the
trace (`tool` events under the sub-call).

Two wire formats. A client that declares `capabilities.tools` gets OpenAI-style `tools=` and is
expected to return tool calls in `Completion.raw` (choices[0].message.tool_calls). Every other
client — the local 0.5B model, replay scripts — uses a text protocol: the model replies with
<tool_call>{"name": ..., "arguments": ...}</tool_call> (a ```tool fenced block is accepted too).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from recursa.base.types import Completion, Message, ModelClient, Usage

if TYPE_CHECKING:
    from recursa.obs.trace import Tracer

DEFAULT_TIMEOUT = 30.0        # seconds per tool call
DEFAULT_MAX_TURNS = 6         # model turns that may call tools, per sub-call
DEFAULT_OUTPUT_CHARS = 6000   # a tool result is cut to this before the sub-model sees it
TRACE_OUTPUT_CHARS = 2000     # and to this in the trace

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               list: "array", tuple: "array", dict: "object"}


# ==================================================================== schemas
def _json_type(annotation: Any) -> dict[str, Any]:
    """JSON-schema fragment for a Python annotation (the common cases; anything else is free)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    if origin in (list, tuple, set, Sequence, Iterable):
        item = _json_type(args[0]) if args else {}
        return {"type": "array", **({"items": item} if item else {})}
    if origin is dict:
        return {"type": "object"}
    t = _JSON_TYPES.get(annotation)
    return {"type": t} if t else {}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {param: description}) from a Google-style (Args:) or Sphinx (:param x:) docstring."""
    doc = inspect.cleandoc(doc or "")
    params: dict[str, str] = {}
    for pm in re.finditer(r":param\s+(?:\w+\s+)?(\w+):\s*(.+)", doc):
        params[pm.group(1)] = pm.group(2).strip()
    lines = doc.splitlines()
    summary_lines: list[str] = []
    section = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        if re.match(r"^(Args|Arguments|Parameters|Params)\s*:\s*$", stripped):
            section, current = "args", None
            continue
        if re.match(r"^(Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$", stripped):
            section, current = "other", None
            continue
        if section == "args":
            m = re.match(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m and line.startswith((" ", "\t")) and len(line) - len(line.lstrip()) <= 8:
                current = m.group(1)
                params[current] = m.group(2).strip()
            elif current and stripped:
                params[current] = (params[current] + " " + stripped).strip()
        elif section is None and not stripped.startswith(":"):
            summary_lines.append(stripped)
    summary = " ".join(s for s in summary_lines if s).strip()
    return summary, params


@dataclass
class Tool:
    """A plain Python function (sync or async) the sub-models may call."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout: float = DEFAULT_TIMEOUT

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def schema(self) -> dict[str, Any]:
        """OpenAI chat-completions `tools=` entry."""
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}


def make_tool(fn: Callable[..., Any] | Tool, *, name: str | None = None,
              description: str | None = None, timeout: float | None = None) -> Tool:
    """Turn a function into a Tool: parameters from its signature, text from its docstring."""
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise TypeError(f"a tool must be a function, got {type(fn).__name__}")
    summary, docs = _parse_docstring(fn.__doc__ or "")
    try:
        hints = typing.get_type_hints(fn)
    except Exception:   # unresolvable forward refs: fall back to raw annotations
        hints = {}
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        prop = _json_type(hints.get(p.name, p.annotation))
        if p.name in docs:
            prop["description"] = docs[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        elif p.default is None or isinstance(p.default, str | int | float | bool):
            prop["default"] = p.default
        props[p.name] = prop
    tool_name = name or getattr(fn, "__name__", "tool")
    if not isinstance(tool_name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", tool_name):
        raise ValueError(f"tool name {tool_name!r} must be a Python identifier (max 64 chars)")
    return Tool(name=tool_name, description=description or summary or tool_name,
                parameters={"type": "object", "properties": props, "required": required},
                fn=fn, timeout=timeout or DEFAULT_TIMEOUT)


@dataclass
class ToolSet:
    """The tools of a run and the settings of their loop."""

    tools: list[Tool]
    max_turns: int = DEFAULT_MAX_TURNS
    max_output_chars: int = DEFAULT_OUTPUT_CHARS
    # counters over the whole run (every sub-call); read by runners and reports
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    by_tool: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate tool name(s): {', '.join(sorted(dup))}")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")

    @classmethod
    def of(cls, tools: ToolSet | Iterable[Callable[..., Any] | Tool], *,
           timeout: float | None = None, max_turns: int = DEFAULT_MAX_TURNS) -> ToolSet:
        if isinstance(tools, ToolSet):
            return tools
        return cls([make_tool(t, timeout=timeout) for t in tools], max_turns=max_turns)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def get(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    def protocol_prompt(self) -> str:
        """How a client without native tool calls is told to call tools. The <tools> /
        <tool_call> tags are the Hermes-style convention many open models (Qwen among them)
        were trained on, so small local models follow it far more often than a new format."""
        schemas = "\n".join(json.dumps(t.schema(), ensure_ascii=False) for t in self.tools)
        return ("# Tools\n\nYou can call functions to help answer the user. Their signatures "
                f"are inside <tools></tools>:\n<tools>\n{schemas}\n</tools>\n\nTo call a "
                "function, reply with only a JSON object with its name and arguments inside "
                "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": \"FUNCTION_NAME\", "
                "\"arguments\": {\"ARG\": \"VALUE\"}}\n</tool_call>\nThe result comes in "
                "the next message. Call functions as often as you need; when you know the answer, "
                "reply with the answer in plain text and no <tool_call>.")


# ==================================================================== parsing calls
@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""
    error: str | None = None     # set when the call could not be parsed


_FENCED = re.compile(r"```(?:tool|tool_call|json)?\s*\n(.*?)```", re.S)
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_text_calls(text: str, known: Iterable[str]) -> list[ToolCall]:
    """Tool calls written in the text protocol. A block that names an unknown tool or is not
    valid JSON becomes a ToolCall with `error`, so the model is told what went wrong."""
    known = set(known)
    out: list[ToolCall] = []
    candidates = [m.group(1) for m in _TAGGED.finditer(text)] + \
                 [m.group(1) for m in _FENCED.finditer(text)]
    for raw in candidates:
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            if '"name"' in raw:
                out.append(ToolCall(name="?", arguments={}, error=f"invalid JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict) or "name" not in obj:
            continue
        name = str(obj.get("name"))
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):   # some models double-encode the arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = {}
        if not isinstance(args, dict):
            args = {}
        err = None if name in known else f"unknown tool {name!r}; tools: {', '.join(sorted(known))}"
        out.append(ToolCall(name=name, arguments=args, error=err))
    return out


def native_calls(comp: Completion) -> list[ToolCall]:
    """Tool calls from an OpenAI-shaped raw response (object or dict)."""
    raw = comp.raw
    if raw is None:
        return []
    choices = raw.get("choices") if isinstance(raw, dict) else getattr(raw, "choices", None)
    if not choices:
        return []
    msg = choices[0].get("message") if isinstance(choices[0], dict) else \
        getattr(choices[0], "message", None)
    calls = (msg.get("tool_calls") if isinstance(msg, dict) else getattr(msg, "tool_calls", None)) \
        or []
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else getattr(c, "function", None)
        name = fn.get("name") if isinstance(fn, dict) else getattr(fn, "name", "")
        args_s = fn.get("arguments") if isinstance(fn, dict) else getattr(fn, "arguments", "{}")
        cid = c.get("id") if isinstance(c, dict) else getattr(c, "id", "")
        try:
            args = json.loads(args_s or "{}") if isinstance(args_s, str) else dict(args_s or {})
            out.append(ToolCall(name=str(name), arguments=args, id=str(cid or "")))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            out.append(ToolCall(name=str(name), arguments={}, id=str(cid or ""),
                                error=f"invalid JSON arguments ({e})"))
    return out


# ==================================================================== running tools
async def call_tool(tool: Tool, arguments: dict[str, Any]) -> str:
    """Run one tool under its timeout; an exception or a timeout becomes an 'Error: ...' string.

    A sync tool runs in a worker thread so it cannot block the event loop; a hung sync tool's
    thread cannot be killed, but the loop stops waiting for it after the timeout."""
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as e:
        return f"Error: bad arguments for {tool.name}: {e}"
    try:
        if tool.is_async:
            value = await asyncio.wait_for(tool.fn(**arguments), tool.timeout)
        else:
            value = await asyncio.wait_for(asyncio.to_thread(tool.fn, **arguments), tool.timeout)
    except TimeoutError:
        return f"Error: tool {tool.name} timed out after {tool.timeout:g}s"
    except Exception as e:
        return f"Error: tool {tool.name} raised {type(e).__name__}: {e}"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit:,} more characters cut]"


class ModelCaller(Protocol):
    """What the tool loop needs of the run (a `recursa.core.dispatch.Dispatcher` is one): model
    calls under the run's budget and concurrency, and its tracer. Typed here, not imported, so
    that dispatch imports tools and never the other way round."""

    tracer: Tracer

    async def call_model(self, client: ModelClient, messages: list[Message], *, role: str,
                         subcall: bool, options: dict[str, Any] | None = None,
                         force: bool = False) -> Completion: ...


class Where(Protocol):
    """Where in the recursion tree the calls come from (a `recursa.core.dispatch.Node` is one)."""

    depth: int


@dataclass
class LoopResult:
    completion: Completion          # the final answer, with usage summed over every turn
    turns: int = 0                  # model calls made
    tool_calls: int = 0
    tool_errors: int = 0
    tool_s: float = 0.0
    forced: bool = False            # the turn budget ran out and the answer was forced


FORCE_ANSWER = ("You have used all your tool calls. Answer now, in plain text, from what you "
                "have found; do not call any tool.")


async def run_tool_loop(dispatcher: ModelCaller, client: ModelClient, messages: list[Message],
                        toolset: ToolSet, *, node: Where, parent: str, role: str = "sub",
                        options: dict[str, Any] | None = None,
                        first_is_subcall: bool = True) -> LoopResult:
    """A sub-call with tools: model turn, tool calls, results back, ... then the final answer.

    Every model call goes through `dispatcher.call_model` (budget, concurrency, usage), tool
    calls are traced as `tool` spans under `parent` (the sub-call's event), and only the final
    text is returned. Raises what call_model raises (ModelError / BudgetExceeded)."""
    options = dict(options or {})
    native = client.capabilities.tools
    convo = [dict(m) for m in messages]
    if not native:   # the text protocol lives in a system message the REPL never sees
        proto = toolset.protocol_prompt()
        if convo and convo[0].get("role") == "system":
            convo[0]["content"] = f"{convo[0]['content']}\n\n{proto}"
        else:
            convo.insert(0, {"role": "system", "content": proto})
    usage, model = Usage(), ""
    cost: float | None = 0.0        # None once any turn's cost is unknown
    out = LoopResult(completion=Completion(text=""))

    async def model_turn(msgs: list[Message], with_tools: bool) -> Completion:
        nonlocal usage, cost, model
        opts = dict(options)
        if native and with_tools:
            opts["tools"] = toolset.schemas()
        comp = await dispatcher.call_model(client, msgs, role=role,
                                           subcall=first_is_subcall and out.turns == 0,
                                           options=opts)
        out.turns += 1
        usage = usage + comp.usage
        cost = None if cost is None or comp.cost_usd is None else cost + comp.cost_usd
        model = comp.model or client.name
        return comp

    for _ in range(toolset.max_turns):
        comp = await model_turn(convo, True)
        calls = native_calls(comp) if native else parse_text_calls(comp.text, toolset.names)
        if not calls:
            out.completion = comp.model_copy(update={"usage": usage, "cost_usd": cost,
                                                     "model": model})
            return out
        if native:
            convo.append({"role": "assistant", "content": comp.text or "",
                          "tool_calls": [{"id": c.id, "type": "function",
                                          "function": {"name": c.name,
                                                       "arguments": json.dumps(c.arguments)}}
                                         for c in calls]})
        else:
            convo.append({"role": "assistant", "content": comp.text})
        results = await asyncio.gather(*(_run_call(dispatcher, toolset, c, node, parent)
                                         for c in calls))
        out.tool_calls += len(calls)
        out.tool_errors += sum(r.startswith("Error:") for r, _ in results)
        out.tool_s += sum(s for _, s in results)
        for c, (text, _) in zip(calls, results, strict=True):
            shown = _cap(text, toolset.max_output_chars)
            if native:
                convo.append({"role": "tool", "tool_call_id": c.id, "content": shown})
            else:
                convo.append({"role": "user", "content": f"Result of {c.name}:\n{shown}"})
    # Turn budget spent: one more call, without tools, for the answer.
    out.forced = True
    comp = await model_turn([*convo, {"role": "user", "content": FORCE_ANSWER}], False)
    out.completion = comp.model_copy(update={"usage": usage, "cost_usd": cost, "model": model})
    return out


async def _run_call(dispatcher: ModelCaller, toolset: ToolSet, call: ToolCall, node: Where,
                    parent: str) -> tuple[str, float]:
    t0 = time.monotonic()
    ev = dispatcher.tracer.emit("tool", phase="start", parent=parent, depth=node.depth,
                                name=call.name, arguments=call.arguments)
    tool = toolset.get(call.name)
    if call.error or tool is None:
        text = f"Error: {call.error or f'unknown tool {call.name!r}'}"
    else:
        try:
            text = await call_tool(tool, call.arguments)
        except asyncio.CancelledError:      # the sub-call was cut: end the span
            dispatcher.tracer.emit("tool", id=ev, phase="end", parent=parent, depth=node.depth,
                                   name=call.name, error="Error: cancelled",
                                   elapsed_s=round(time.monotonic() - t0, 4))
            raise
    elapsed = time.monotonic() - t0
    failed = text.startswith("Error:")
    toolset.calls += 1
    toolset.errors += failed
    toolset.seconds += elapsed
    toolset.by_tool[call.name] = toolset.by_tool.get(call.name, 0) + 1
    dispatcher.tracer.emit("tool", id=ev, phase="end", parent=parent, depth=node.depth,
                           name=call.name, output=_cap(text, TRACE_OUTPUT_CHARS),
                           output_chars=len(text), error=text if failed else None,
                           elapsed_s=round(elapsed, 4))
    return text, elapsed
