"""The one host-side dispatcher every model call of a run goes through, children included.

It owns the concurrency limit, budget reservations, per-call tracing, and turning the REPL's
`call` requests (llm / llm_batch / rlm / rlm_batch) into model calls or child RLM runs. A failed
sub-call becomes an error string in its slot; it never fails a batch or the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from recursa.base import images as img
from recursa.base.types import (
    BudgetExceeded,
    Completion,
    Message,
    ModelClient,
    ModelError,
    RecursaError,
    StreamingModelClient,
)
from recursa.core.budget import Cut, Ledger
from recursa.core.context import estimate_tokens
from recursa.core.pace import Pace
from recursa.obs.trace import Tracer
from recursa.sandbox.budgets import child_slot

if TYPE_CHECKING:
    from recursa.core.tools import ToolSet
    from recursa.models.streaming import OnDelta

DEFAULT_OUTPUT_RESERVE = 2048   # tokens reserved for a call that sets no max_tokens
MIN_CUT_OUTPUT = 256            # a call cut to its run's room keeps at least this many tokens
TRACE_PROMPT_CHARS = 20_000     # a sub-call prompt is traced up to this size (+ its size and hash)

ChildRunner = Callable[["Node", str, Any], Awaitable[str]]


@dataclass(frozen=True)
class Partial:
    """A map a limit cut short: `done` of its `total` items answered before `limit`."""

    op: str
    done: int
    total: int
    limit: str

    def describe(self, noun: str = "items answered") -> str:
        return f"{self.done} of {self.total} {noun} before {self.limit}"


@dataclass
class Node:
    """Where in the recursion tree a call comes from."""

    depth: int
    parent: str            # event id of the cell (or turn) that made the call
    role: str = "sub"      # role charged for calls made from this node


def wall_limit(ledger: Ledger, what: str, *, final: bool = False
               ) -> contextlib.AbstractAsyncContextManager[None]:
    """Cut whatever runs inside at the run's deadline (recursa.core.deadline owns `max_seconds`):
    the call, the cell, the wait for a slot; `final`: at the very end (the last-answer turn)."""
    return ledger.deadline.cut(what, final=final)


def estimate_cost(client: ModelClient, input_tokens: int, output_tokens: int) -> float | None:
    """Worst-case USD of a call, for the reservation; None when the model has no known price.
    (recursa.models.pricing prices what the client declares.)"""
    from recursa.models.pricing import estimate
    return estimate(client.capabilities.pricing, input_tokens, output_tokens)


def output_cap(client: ModelClient, options: dict[str, Any], input_tokens: int) -> int:
    """The most output tokens this call can produce, for its worst case: its own max_tokens,
    else the client's declared cap when a call sets none, else DEFAULT_OUTPUT_RESERVE; never
    more than the model's window leaves after the input."""
    caps = client.capabilities
    cap = int(options.get("max_tokens") or caps.max_output_tokens or DEFAULT_OUTPUT_RESERVE)
    if caps.context_window:
        cap = min(cap, max(1, caps.context_window - input_tokens))
    return max(1, cap)


def output_cut(client: ModelClient, input_tokens: int, output_tokens: int) -> Cut:
    """The `cut` of a call's reservation (recursa.core.budget.Ledger.areserve): the most
    output tokens under `output_tokens` that the tokens and cost left pay for beside its input,
    as (worst-case tokens, worst-case cost); None under MIN_CUT_OUTPUT tokens (a reply too
    short to be of use) or when the price does not fall with the output."""
    def cut(tokens_left: int | None, cost_left: float | None) -> tuple[int, float | None] | None:
        hi = output_tokens - 1
        if tokens_left is not None:
            hi = min(hi, tokens_left - input_tokens)
        floor = MIN_CUT_OUTPUT
        if hi < floor:
            return None

        def fits(out: int) -> bool:
            c = estimate_cost(client, input_tokens, out)
            return cost_left is None or (c is not None and c <= cost_left)
        if not fits(floor):
            return None
        lo = floor                      # the largest output known to fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return input_tokens + lo, estimate_cost(client, input_tokens, lo)
    return cut


def text_tokens(text: str) -> int:
    """A conservative token estimate for reservations: ~4 ASCII characters a token, but about one
    token per character for other scripts (CJK, Cyrillic, ...), which chars/4 would undercount
    four-fold and so let parallel calls overshoot a limit."""
    extra = len(text.encode("utf-8", errors="surrogatepass")) - len(text)   # non-ASCII bytes
    return estimate_tokens(len(text) + 2 * extra)


def _messages(prompt: Any) -> list[Message]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt):
        return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt]
    return [{"role": "user", "content": str(prompt)}]


def cache_mark(comp: Completion) -> dict[str, Any]:
    """`cached: true` for a trace event of a call the response cache answered; else nothing."""
    return {"cached": True} if comp.cached else {}


class Dispatcher:
    def __init__(self, *, ledger: Ledger, tracer: Tracer, sub_client: ModelClient,
                 clients: dict[str, ModelClient], concurrency: int = 32,
                 max_depth: int = 1, sub_options: dict[str, Any] | None = None,
                 trace_prompt_chars: int | None = TRACE_PROMPT_CHARS,
                 tools: ToolSet | None = None, child_runner: ChildRunner | None = None):
        """`child_runner(node, prompt, context) -> answer` runs a child RLM for `rlm_query`;
        None: every `rlm_query` is a plain sub-call."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        from recursa.models.declared import declared
        self.ledger = ledger
        self.tracer = tracer
        self.sub_client = declared(sub_client)
        # the models sandboxed code may name, by spec
        self.clients = {k: declared(c) for k, c in clients.items()}
        self.concurrency = concurrency
        self.sem = asyncio.Semaphore(concurrency)
        self.max_depth = max_depth
        self.sub_options = sub_options or {}
        self.trace_prompt_chars = trace_prompt_chars   # None: trace prompts in full
        self.child_runner = child_runner
        self.tools = tools              # sub-model-only tools: sub-calls run the tool loop
        self.inflight = 0
        self.peak_inflight = 0
        self._cost_seen: dict[str, float] = {}   # dearest call so far, per model without a price
        self.pace = Pace()              # this machine's measured speed, per model
        # maps a limit cut short: what their answers rest on (recursa.core.combinators)
        self.partial: list[Partial] = []

    # ------------------------------------------------------------ model calls
    async def call_model(self, client: ModelClient, messages: list[Message], *, role: str,
                         subcall: bool, options: dict[str, Any] | None = None,
                         force: bool = False, on_delta: OnDelta | None = None) -> Completion:
        """Reserve, call under the concurrency limit, settle. Raises ModelError/BudgetExceeded.
        With `on_delta`, a client that can stream sends the reply's text there as it comes."""
        options = dict(options or {})
        est_in = sum(img.content_tokens(m.get("content", ""), text_tokens) for m in messages) \
            + 4 * len(messages)
        est_out = output_cap(client, options, est_in)
        cost = estimate_cost(client, est_in, est_out)
        if cost is None:   # no price known: the dearest call seen so far is the best guess
            cost = self._cost_seen.get(client.name)
        # patient: a worst case that does not fit beside the calls in flight waits for them to
        # settle (recursa.core.budget), within the run's time
        async with wall_limit(self.ledger, f"a call to {client.name}", final=force):
            # a worst case past the room left, with nothing in flight, is cut to fit: the call
            # goes out with max_tokens lowered to what the room pays for (down to a floor)
            res = await self.ledger.areserve(tokens=est_in + est_out, cost=cost,
                                             subcall=subcall, force=force,
                                             cut=output_cut(client, est_in, est_out))
        if res.tokens < est_in + est_out:
            options["max_tokens"] = res.tokens - est_in
        # a forced call (the root's last-answer turn) runs in the time reserved for it
        remaining = self.ledger.deadline.left(final=force)
        if remaining is not None:
            options["timeout"] = max(1.0, min(remaining, options.get("timeout") or remaining))
        limit = wall_limit(self.ledger, f"a call to {client.name}", final=force)
        comp: Completion | None = None
        try:
            async with limit, self.sem:
                self.inflight += 1
                self.peak_inflight = max(self.peak_inflight, self.inflight)
                try:
                    # streams when asked and the client declares it can (models/streaming.py)
                    if on_delta is not None and client.capabilities.streaming:
                        comp = await cast(StreamingModelClient, client).astream(
                            messages, on_delta, **options)
                    else:
                        comp = await client.complete(messages, **options)
                except ModelError as e:
                    # the client's timeout fired at the run's wall-time limit: a limit, not a
                    # model failure
                    if remaining is not None and self.ledger.deadline.reached(final=force):
                        raise BudgetExceeded("max_seconds", f"max_seconds reached during a "
                                             f"call to {client.name} ({e})") from e
                    raise
                finally:
                    self.inflight -= 1
            self.ledger.cache_hits += comp.cached
            self.pace.record(client.name, comp)
            if comp.cost_usd:
                prev = self._cost_seen.get(client.name, 0.0)
                self._cost_seen[client.name] = max(prev, comp.cost_usd)
            return comp
        finally:
            self.ledger.settle(res, usage=comp.usage if comp else None,
                               cost=comp.cost_usd if comp else None, role=role,
                               model=comp.model or client.name if comp else client.name)

    async def llm(self, prompt: Any, model: str | None, opts: dict[str, Any], node: Node,
                  images: Any = None, host_options: dict[str, Any] | None = None) -> str:
        """One sub-call from sandboxed code: a string answer or an 'Error: ...' string.
        `host_options` are built by the host (a combinator's reply cap and constraint) and
        pass unfiltered; `opts` come from sandboxed code and are filtered."""
        return (await self.sub_call(prompt, model, opts, node, images, host_options))[0]

    async def sub_call(self, prompt: Any, model: str | None, opts: dict[str, Any], node: Node,
                       images: Any = None, host_options: dict[str, Any] | None = None
                       ) -> tuple[str, Completion | None]:
        """`llm`, with the Completion beside its text (None when the call failed): for a
        combinator that reads more than the text (`llm_rank`: the first token's logprobs)."""
        t0 = time.time()
        messages = _messages(prompt)
        try:   # images come as JSON forms from the sandbox; the trace keeps hash and size only
            imgs, bad = img.images_from_call(images), None
        except img.ImageError as e:
            imgs, bad = [], f"Error: {e}"
        text_in = "\n".join(m["content"] for m in messages)
        # Code often sends whole chunks of the context to sub-calls: cap what the trace keeps,
        # so a trace does not grow with the context, and keep a hash to tell prompts apart.
        limit = self.trace_prompt_chars
        shown = text_in if limit is None or len(text_in) <= limit else (
            text_in[:limit] + f"\n... [{len(text_in) - limit:,} more characters not traced]")
        traced: dict[str, Any] = {"images": [i.trace_info() for i in imgs]} if imgs else {}
        ev = self.tracer.emit("subcall", phase="start", parent=node.parent, depth=node.depth,
                              model=model or self.sub_client.name, prompt=shown,
                              prompt_chars=len(text_in),
                              prompt_sha256=hashlib.sha256(text_in.encode()).hexdigest()[:16],
                              **traced)
        if bad:
            return self._failed(ev, node, bad, t0)
        messages = img.attach(messages, imgs)
        try:
            client = self._client(model)
            options = {**self.sub_options, **_safe_opts(opts), **(host_options or {})}
            extra: dict[str, Any] = {}
            if self.tools is not None and self.tools.tools:
                from recursa.core.tools import run_tool_loop
                # tool output stays inside the loop: the REPL gets only the final answer
                loop = await run_tool_loop(self, client, messages, self.tools, node=node,
                                           parent=ev, role=node.role, options=options)
                comp = loop.completion
                extra = dict(model_turns=loop.turns, tool_calls=loop.tool_calls,
                             tool_errors=loop.tool_errors, tool_s=round(loop.tool_s, 4),
                             forced=loop.forced)
            else:
                comp = await self.call_model(client, messages, role=node.role, subcall=True,
                                             options=options)
        except asyncio.CancelledError:   # its cell was cut (the time limit): end the span
            why = " (max_seconds reached)" if \
                self.ledger.limit_reached(subcalls=False) == "max_seconds" else ""
            self._fail(ev, node, f"Error: cancelled{why}", t0)
            raise
        except BudgetExceeded as e:
            return self._failed(ev, node, f"Error: {e} (no more sub-calls can be made)", t0)
        except RecursaError as e:
            return self._failed(ev, node, f"Error: {e}", t0)
        except Exception as e:  # a client bug must not kill the run
            return self._failed(ev, node, f"Error: {type(e).__name__}: {e}", t0)
        self.tracer.emit("subcall", id=ev, phase="end", parent=node.parent, depth=node.depth,
                         model=comp.model or client.name, response=comp.text,
                         usage=comp.usage.model_dump(), cost_usd=comp.cost_usd,
                         latency_s=round(comp.latency_s, 4), elapsed_s=round(time.time() - t0, 4),
                         **extra, **cache_mark(comp))
        return comp.text, comp

    def _failed(self, ev: str, node: Node, msg: str, t0: float) -> tuple[str, None]:
        return self._fail(ev, node, msg, t0), None

    def _fail(self, ev: str, node: Node, msg: str, t0: float) -> str:
        self.tracer.emit("subcall", id=ev, phase="end", parent=node.parent, depth=node.depth,
                         error=msg, elapsed_s=round(time.time() - t0, 4))
        return msg

    def _client(self, model: str | None) -> ModelClient:
        if model is None or model == self.sub_client.name:
            return self.sub_client
        if model in self.clients:
            return self.clients[model]
        names = ", ".join(sorted({self.sub_client.name, *self.clients}))
        raise RecursaError(f"model {model!r} is not available to this run; available: {names}")

    # ------------------------------------------------------------ the REPL's calls
    def handler(self, node: Node) -> Callable[[str, dict[str, Any]], Awaitable[Any]]:
        async def handle(kind: str, args: dict[str, Any]) -> Any:
            opts = args.get("opts") or {}
            if kind == "llm":
                return await self.llm(args.get("prompt", ""), args.get("model"), opts, node,
                                      images=args.get("images"))
            if kind == "llm_batch":
                prompts = args.get("prompts") or []
                if not isinstance(prompts, list):
                    return "Error: llm_batch takes a list of prompts"
                per = args.get("images")
                per = per if isinstance(per, list) and len(per) == len(prompts) \
                    else [None] * len(prompts)
                return list(await asyncio.gather(
                    *(self.llm(p, args.get("model"), opts, node, images=i)
                      for p, i in zip(prompts, per, strict=True))))
            if kind == "rlm":
                return await self.rlm(args.get("prompt", ""), args.get("context"), opts, node)
            if kind == "rlm_batch":
                prompts = args.get("prompts") or []
                contexts = args.get("contexts")
                if not isinstance(prompts, list):
                    return "Error: rlm_batch takes a list of prompts"
                if contexts is not None and (not isinstance(contexts, list)
                                             or len(contexts) != len(prompts)):
                    return [f"Error: rlm_batch got {len(prompts)} prompts but contexts is not "
                            f"a list of the same length"] * len(prompts)
                ctxs = contexts or [None] * len(prompts)
                return list(await asyncio.gather(
                    *(self.rlm(p, c, opts, node) for p, c in zip(prompts, ctxs, strict=True))))
            # the combinators (and core.tools, above) load with the first call that uses them:
            # most runs call neither (~3 ms of a run's start-up)
            from recursa.core import combinators
            if kind in combinators.KINDS:
                return await combinators.handle(self, kind, args, node)
            return f"Error: unknown call {kind!r}"
        return handle

    async def rlm(self, prompt: Any, context: Any, opts: dict[str, Any], node: Node) -> str:
        """A child RLM one level down; at max_depth, a plain model call instead."""
        if node.depth + 1 > self.max_depth or self.child_runner is None:
            try:   # images in the context go as images, not as base64 text in the prompt
                context, found = img.normalize(context)
            except img.ImageError as e:
                return f"Error: {e}"
            text = prompt if context is None else f"{prompt}\n\n{context}"
            return await self.llm(text, opts.pop("model", None), opts, node,
                                  images=[i for _, i in found] or None)
        try:
            # a child shares its run's memory and processes (recursa.sandbox.budgets): it
            # starts when the run has room for it, within the run's time
            async with contextlib.AsyncExitStack() as held:
                async with wall_limit(self.ledger, "a wait for room for a child run"):
                    await held.enter_async_context(child_slot())
                return await self.child_runner(node, str(prompt), context)
        except RecursaError as e:
            return f"Error: child RLM failed: {e}"
        except Exception as e:
            return f"Error: child RLM failed: {type(e).__name__}: {e}"


_ALLOWED_OPTS = {"max_tokens", "temperature", "top_p", "stop", "seed"}


def _safe_opts(opts: dict[str, Any]) -> dict[str, Any]:
    """Only sampling options pass from sandboxed code: never base URLs, keys or timeouts."""
    return {k: v for k, v in opts.items() if k in _ALLOWED_OPTS}
