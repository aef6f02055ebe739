"""Routing: whether a run needs the REPL at all.

Recursion pays for inputs a model cannot read at once; for a two-line question it only adds
turns (and a reproduction of the RLM paper found it hurts simple tasks). With `route="auto"` a
top-level run whose input fits goes to the root model directly, as one plain chat call with the
context in the prompt; a larger one runs the RLM loop. The rule:

    estimated tokens of the direct prompt (context + query) + the reply reserve <= threshold

* estimated tokens: `recursa.core.compaction.msg_tokens` of the messages the direct call would
  send (about 4 characters a token, digits one each), so the estimate is of what is sent;
* the reply reserve: the root's `max_tokens` option, else the client's declared output cap,
  else REPLY_RESERVE (1,024);
* the threshold: `route_threshold` tokens when given (never more than the window), else
  ROUTE_SHARE (half) of the root client's declared `context_window` (local models, `--n-ctx`),
  else DEFAULT_THRESHOLD (8,192) tokens: hosted clients declare no window, and every current
  hosted model reads that much comfortably.

A context that cannot be one text prompt goes to the RLM (images; a file or directory too
large to be worth reading to measure it), and so does a run that asked for `sources` (only the
REPL's answers carry them). `route="direct"` always calls the model directly (a context that
cannot be a prompt is then an error); `route="rlm"` (the default) always runs the loop.

A direct run goes through the same Ledger, Dispatcher and tracer as the loop (`PlainRun`), so
limits, cost, the trace and the Result work as for any run; `Result.route` and the run's start
event (`route`: path, reason, tokens, threshold) say which path ran and why.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from recursa.base import images
from recursa.base.types import (
    BudgetExceeded,
    ContextError,
    Message,
    ModelClient,
    ModelError,
    Result,
    context_window,
)
from recursa.core.compaction import msg_tokens

if TYPE_CHECKING:
    from recursa.core.budget import Budget, Ledger
    from recursa.core.output import OutputSpec
    from recursa.obs.trace import Tracer

ROUTES = ("rlm", "direct", "auto")
ROUTE_SHARE = 0.5            # of the root's window, when it declares one
DEFAULT_THRESHOLD = 8192     # tokens, when it does not
REPLY_RESERVE = 1024         # tokens kept for the reply when nothing sets its cap
# a file or directory is read to measure it only when its bytes are at most this many times
# the threshold in tokens: 4 characters a token, and a document's file (PDF, DOCX) is often
# several times its text
LOAD_FACTOR = 16
MAX_FILES = 200              # nor a directory of more files than this

DIRECT_PROMPT = "{context}\n\n---\n\nAnswer the question about the text above.\n{query}"

RoutePath = Literal["direct", "rlm"]


@dataclass(frozen=True)
class Route:
    """Which path a run takes and why; `messages`: the direct call's request."""

    path: RoutePath
    reason: str
    tokens: int | None = None        # estimated tokens of the direct prompt + the reply reserve
    threshold: int | None = None
    messages: list[Message] = field(default_factory=list, repr=False)

    def note(self) -> dict[str, Any]:
        """What the run's start event says of it."""
        return {"path": self.path, "reason": self.reason, "tokens": self.tokens,
                "threshold": self.threshold}


def check_route(route: Any) -> str:
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, not {route!r}")
    return str(route)


def check_threshold(threshold: Any) -> int | None:
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"route_threshold must be a whole number of tokens of at least 1, "
                         f"not {threshold!r}")
    return threshold


def threshold_for(client: ModelClient | None, given: int | None = None) -> int:
    """The most tokens (prompt + reply reserve) a direct call may take for `client`."""
    window = context_window(client) if client is not None else None
    if given is not None:
        return min(given, window) if window else given
    return int(window * ROUTE_SHARE) if window else DEFAULT_THRESHOLD


def reply_reserve(client: ModelClient | None, options: dict[str, Any]) -> int:
    cap = options.get("max_tokens") or (client.capabilities.max_output_tokens
                                        if client is not None else None)
    return int(cap or REPLY_RESERVE)


def direct_messages(query: str, text: str, output: OutputSpec | None = None) -> list[Message]:
    """The direct call's request: the context, then the question (and the answer's schema)."""
    prompt = DIRECT_PROMPT.format(context=text, query=query)
    if output is not None:
        prompt += "\n\n" + output.prompt() + "\nReply with the JSON value only."
    return [{"role": "user", "content": prompt}]


def decide(route: str, query: str, context: Any, *, client: ModelClient | None,
           options: dict[str, Any] | None = None, threshold: int | None = None,
           output: OutputSpec | None = None, sources: bool = False) -> Route:
    """The path a top-level run takes (see the module docstring). May read a context path to
    measure it (a confined parse for a document): call it off the event loop for one."""
    check_route(route)
    if route == "rlm":
        return Route("rlm", "route=rlm")
    limit = threshold_for(client, threshold)
    if route == "auto" and sources:
        return Route("rlm", "sources were asked for: only the REPL's answers carry them",
                     threshold=limit)
    try:
        text = context_text(context, max_bytes=None if route == "direct" else
                            limit * LOAD_FACTOR)
    except _NotText as e:
        if route == "direct":
            raise ContextError(f"route='direct' needs a context that can be one text prompt: "
                               f"{e}") from None
        return Route("rlm", str(e), threshold=limit)
    messages = direct_messages(query, text, output)
    need = msg_tokens(messages) + reply_reserve(client, options or {})
    if route == "direct":
        return Route("direct", "route=direct", need, limit, messages)
    if need <= limit:
        return Route("direct", f"~{need:,} tokens fit the threshold of {limit:,}", need, limit,
                     messages)
    return Route("rlm", f"~{need:,} tokens exceed the threshold of {limit:,}", need, limit)


class _NotText(Exception):
    """The context cannot be (or is not worth reading to be) one text prompt; says why."""


def context_text(context: Any, *, max_bytes: int | None = None) -> str:
    """The context as one prompt text: a string as it is, the documents of a list or dict under a
    header each, other values as JSON. A path or bytes is read as the RLM would read it, unless
    it is over `max_bytes`. _NotText for images, or an input too large to read."""
    if context is None:
        raise ContextError("no context given: pass context=<str | list | dict | Path>")
    if isinstance(context, os.PathLike | bytes):
        _check_size(context, max_bytes)
        from recursa.core.context import load_inner_paths
        if isinstance(context, bytes):
            from recursa.documents import confine
            context = confine.load_bytes(context, "context bytes")[0]
        else:
            context = load_inner_paths(context)
    elif isinstance(context, list | tuple | dict):
        for p in _paths(context):
            _check_size(p, max_bytes)
        from recursa.core.context import load_inner_paths
        context = load_inner_paths(context)
    context, found = images.normalize(context)
    if found or isinstance(context, images.Image):
        raise _NotText("the context holds images")
    if isinstance(context, str):
        return str(context)
    if isinstance(context, tuple):
        context = list(context)
    if isinstance(context, dict):
        return "\n\n".join(f"### {k}\n{_text(v)}" for k, v in context.items())
    if isinstance(context, list):
        return "\n\n".join(f"### Document {i}\n{_text(v)}" for i, v in enumerate(context))
    raise ContextError(f"context must be str, list, dict, an image or a Path, not "
                       f"{type(context).__name__}")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return str(value)
    from recursa.documents.model import to_wire
    return json.dumps(to_wire(value), ensure_ascii=False, default=str)


def _paths(value: Any) -> list[Any]:
    if isinstance(value, os.PathLike | bytes):
        return [value]
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths(v)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in _paths(v)]
    return []


def _check_size(value: os.PathLike[str] | bytes, max_bytes: int | None) -> None:
    """_NotText when `value` is over `max_bytes` (a directory: over MAX_FILES files too)."""
    if max_bytes is None:
        return
    if isinstance(value, bytes):
        if len(value) > max_bytes:
            raise _NotText(f"the input is {len(value):,} bytes, over {max_bytes:,}")
        return
    path = Path(value)
    if not path.exists():
        raise ContextError(f"context path does not exist: {path}")
    if path.is_file():
        size = path.stat().st_size
        if size > max_bytes:
            raise _NotText(f"{path.name} is {size:,} bytes, over {max_bytes:,}")
        return
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            files += 1
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
            if total > max_bytes or files > MAX_FILES:
                raise _NotText(f"directory {path.name} is over {max_bytes:,} bytes or "
                               f"{MAX_FILES} files")


async def run_direct(route: Route, query: str, *, client: ModelClient,
                     sub_client: ModelClient, budget: Budget, ledger: Ledger, tracer: Tracer,
                     options: dict[str, Any], trace_path: str | None,
                     output: OutputSpec | None = None) -> Result:
    """One plain chat call as a traced run through `ledger` and `tracer` (the run's own):
    its Result, with `route="direct"`. A typed answer that does not validate gets one
    structuring sub-call, as the loop gives a prose answer."""
    from recursa.core.output import OutputInvalid
    from recursa.core.plainrun import PlainRun
    run = PlainRun(client, query, budget=budget, ledger=ledger, tracer=tracer,
                   trace_path=trace_path, options=options, route=route.note())
    try:
        answer = await run.ask(route.messages, step="direct")
    except BudgetExceeded as e:
        return run.finish("", "limit", limit=e.limit, route="direct")
    except ModelError as e:
        return run.finish("", "error", error=f"ModelError: {e}", route="direct")
    parsed, output_error = None, None
    if output is not None:
        try:
            parsed = output.parse(answer)
        except OutputInvalid as e:
            output_error = f"the answer does not match the output schema: {e}"
            messages, opts = output.structuring_request(answer, sub_client.name)
            try:
                comp = await run.dispatcher.call_model(sub_client, messages, role="sub",
                                                       subcall=True, options=opts)
                parsed, output_error = output.parse(comp.text), None
                answer = comp.text.strip()
            except (ModelError, BudgetExceeded, OutputInvalid):
                pass
    return run.finish(answer, "final", source="final", route="direct", parsed=parsed,
                      output_error=output_error)
