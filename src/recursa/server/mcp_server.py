"""An MCP server (stdio) with one tool, `rlm_answer`: a question over a file, a directory or text,
answered by an RLM, with the spend.

    recursa mcp --model openai:gpt-5 --sub-model openai:gpt-5-mini --max-cost 0.5
    python -m recursa.server.mcp_server --model ...        # the same

An MCP client (an IDE, an agent) starts this command and talks JSON-RPC over its stdin/stdout;
the SDK diverts stray stdout to stderr while serving, so nothing a run prints corrupts the wire.

`path` arguments must lie inside the server's root: `--root DIR`, else the directory the
command was started in (a client could otherwise have any file the user can read, credentials
included, sent to a model); `--root /` allows every path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from recursa.base.types import Event, ModelClient, RecursaError, Source
from recursa.core.budget import Budget
from recursa.core.rlm import RLM
from recursa.frontend.options import RLMOptions
from recursa.server.args import add_mcp_options
from recursa.server.common import Progress, RequestError, clamp_limits, load_model, spend

INSTRUCTIONS = (
    "rlm_answer answers a question over inputs far larger than a context window (a big file, a "
    "whole directory, or long text) with a Recursive Language Model: a model that explores the "
    "input with code and sub-model calls. Give exactly one of `path` or `text`. It can take a "
    "while and spends model tokens; the result says how many and what they cost.")


class RlmAnswer(BaseModel):
    """What the tool returns (also as MCP structured content)."""

    answer: str
    status: str              # final | extracted | limit | error
    ready: bool
    cost_usd: float | None   # None when a model's price is unknown
    input_tokens: int
    output_tokens: int
    total_tokens: int
    turns: int
    subcalls: int
    elapsed_s: float
    limit: str | None = None
    error: str | None = None
    # the passages the answer rests on, each checked against the input (recursa.core.sources)
    sources: list[Source] = Field(default_factory=list)
    sources_verified: bool | None = None


@dataclass
class McpConfig:
    """The shared options (model, endpoints, sandbox...) and the server's own. The options'
    limits are caps a tool call may lower, never raise."""

    options: RLMOptions = field(default_factory=RLMOptions)
    trace_dir: str | None = None
    # `path` must lie inside this directory; None: the directory the server started in
    # (`--root /` serves every readable file, an explicit choice)
    root: str | None = None
    rlm_factory: Callable[[McpConfig, Callable[[Event], Any]], RLM] | None = None
    model: str | ModelClient | None = None       # set by build_server (a replay-file: spec
    sub_model: str | ModelClient | None = None   # becomes its scripted client)


def default_rlm_factory(config: McpConfig, on_event: Callable[[Event], Any]) -> RLM:
    return RLM(config=config.options.config().replace(model=config.model,
                                                      sub_model=config.sub_model),
               trace_dir=config.trace_dir, on_event=on_event)


def _resolve_path(path: str, root: str) -> Path:
    """`path` (relative: to `root`) with symlinks resolved; refused outside `root`."""
    base = Path(root).expanduser().resolve()
    p = Path(path).expanduser()
    p = (base / p).resolve() if not p.is_absolute() else p.resolve()
    if p != base and base not in p.parents:
        raise RequestError(f"path {path!r} is outside this server's root {str(base)!r} "
                           f"(start the server with --root DIR to serve another directory)")
    if not p.exists():
        raise RequestError(f"path {str(p)!r} does not exist")
    return p


def build_server(config: McpConfig) -> MCPServer:
    config.model = load_model(config.model or config.options.model)
    config.sub_model = load_model(config.sub_model or config.options.sub_model)
    caps = Budget(**config.options.limits())
    # fixed at start: a later chdir of the process must not move what the server exposes
    root = str(Path(config.root or os.getcwd()).expanduser().resolve())
    server = MCPServer("recursa", instructions=INSTRUCTIONS)

    @server.tool()
    async def rlm_answer(question: str, path: str | None = None, text: str | None = None,
                         max_cost_usd: float | None = None, max_seconds: float | None = None,
                         max_iterations: int | None = None, sources: bool = False,
                         ctx: Context | None = None) -> RlmAnswer:
        """Answer `question` over a file or directory (`path`) or over `text`, with a Recursive
        Language Model. Returns the answer, how the run ended (`status`), tokens and cost.
        Optional limits can only lower the server's own caps. `sources=true` asks for the
        passages the answer rests on, each checked against the input."""
        if not question or not question.strip():
            raise ToolError("question is empty")
        if (path is None) == (text is None):
            raise ToolError("give exactly one of `path` (a file or directory) or `text`")
        try:
            context: Any = _resolve_path(path, root) if path is not None else text
            limits, _ = clamp_limits(caps, {"max_cost_usd": max_cost_usd,
                                            "max_seconds": max_seconds,
                                            "max_iterations": max_iterations})
        except RequestError as e:
            raise ToolError(str(e)) from e

        # Progress: events become MCP progress notifications (when the client asked for them).
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        progress = Progress()

        async def forward() -> None:
            n = 0
            while (ev := await queue.get()) is not None:
                item = progress.feed(ev)
                if item is not None and ctx is not None:
                    n += 1
                    with contextlib.suppress(Exception):   # progress is best effort
                        await ctx.report_progress(n, None, item["line"].strip())

        pump = asyncio.create_task(forward())
        rlm = (config.rlm_factory or default_rlm_factory)(
            config, lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev))
        if sources:
            rlm.sources = True
        try:
            res = await rlm.acompletion(question, context, **limits)
        except RecursaError as e:
            raise ToolError(str(e)) from e
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pump, 5)
        s = spend(res)
        return RlmAnswer(answer=res.answer, status=res.status, ready=res.ready,
                         cost_usd=res.cost_usd, input_tokens=s["input_tokens"],
                         output_tokens=s["output_tokens"], total_tokens=s["total_tokens"],
                         turns=res.turns, subcalls=res.subcalls, elapsed_s=res.elapsed_s,
                         limit=res.limit, error=res.error, sources=res.sources,
                         sources_verified=res.sources_verified)

    return server


def config_from_args(a: argparse.Namespace) -> McpConfig:
    opts = RLMOptions.from_args(a).with_default_model(say=_say)
    return McpConfig(options=opts, trace_dir=a.trace_dir, root=a.root)


def _say(message: str) -> None:
    print(message, file=sys.stderr)     # stdout is the MCP wire


def cmd_mcp(a: argparse.Namespace) -> int:
    from recursa.core.preflight import check_options
    from recursa.frontend.options import plain_error as plain
    try:
        config = config_from_args(a)
        check_options(config.options, say=_say)
        server = build_server(config)
    except (RecursaError, ValueError, TypeError, OSError) as e:
        print(f"error: {plain(e)}", file=sys.stderr)
        return 2
    server.run("stdio")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recursa.server.mcp_server",
                                description="recursa MCP server (stdio)")
    add_mcp_options(p)
    return cmd_mcp(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
