"""The one control flow of every hosted model client: `HostedClient` drives an `Adapter`
(adapter.py, the contract) through attempts, retries, streaming, usage, cost and errors.

    client = HostedClient(MyAdapter(...), name="theirs:big", model="big", base_url=url)
    comp = await client.complete(messages, max_tokens=512)

One call: the options (the client's defaults under the call's; `timeout` bounds each attempt),
the adapter's request, then attempts under `with_retries` (retry.py: 408/409/425/429, 5xx,
timeouts and dropped connections with backoff and full jitter, `Retry-After` honoured; a reply
without text retried once). A streamed attempt hands each piece to `on_delta(piece, offset)`;
a stream that ends before the provider said the reply is complete, or fails after some text
came, is a retryable `StreamCut`, and the retry starts again at offset 0. Usage is read
through the adapter's `usage_fields` (a field that is not a token count fails the call: a
ModelError naming it, not retried), and priced by pricing.py unless the provider reported
the cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelError,
    Pricing,
    Usage,
    model_identity,
)

from .adapter import Adapter, Reply, UsageFields, timed_out
from .declared import Declares
from .pricing import charge, estimate
from .retry import EmptyResponseError, RetryPolicy, RetryStats, with_retries
from .streaming import OnDelta, Pieces, StreamCut

log = logging.getLogger("recursa.models")

DEFAULT_TIMEOUT = 600.0
# finish reasons that mean the reply hit its token cap (OpenAI, Anthropic, Gemini)
_CAPPED = frozenset({"length", "max_tokens"})


class ClientOptions(TypedDict, total=False):
    """What every hosted client takes besides its provider's own settings."""

    max_retries: int             # retries after the first attempt (4)
    retry_base_delay: float      # seconds; retry k waits uniform(0, base * 2**k) (0.5)
    retry_max_delay: float       # cap of one backoff sleep (30)
    timeout: float               # seconds one attempt may take; a call's `timeout=` wins (600)
    prices: Mapping[str, Any] | None       # {model: Price | dict | tuple}, over the table
    default_options: dict[str, Any] | None  # options every call gets unless it sets them
    stream: bool                 # False: astream never streams (a proxy that buffers SSE)


class HostedClient(Declares):
    """A `ModelClient` (and a streaming one) over one provider's adapter.

    `stats` counts calls, attempts, retries and failures; `cache_write_tokens` totals the
    prompt-cache writes replies reported. `tools`, `structured`, `reports_cost` and
    `cache_writes` are what the client declares (`capabilities`); `price_model` is the name
    the price table knows the model by (default: `model`); `free`: every call costs 0.0 (a
    server on one's own machine, as `local:` models are). The repr and every error name the
    model and its endpoint, never a key."""

    _counters = frozenset({"cache_write_tokens"})

    def __init__(self, adapter: Adapter, *, name: str, model: str, base_url: str | None,
                 max_retries: int = 4, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 30.0, timeout: float = DEFAULT_TIMEOUT,
                 prices: Mapping[str, Any] | None = None,
                 default_options: dict[str, Any] | None = None, stream: bool = True,
                 price_model: str | None = None, tools: bool = False,
                 structured: Literal["json_schema", "response_format"] | None = None,
                 reports_cost: bool = False, cache_writes: bool = False,
                 free: bool = False) -> None:
        self.adapter = adapter
        self.name = name
        self.model = model
        self.base_url = base_url
        self.stream = stream
        self.timeout = timeout
        self.prices = prices
        self.price_model = price_model or model
        self.default_options = dict(default_options or {})
        self.policy = RetryPolicy(max_retries=max_retries, base_delay=retry_base_delay,
                                  max_delay=retry_max_delay)
        self.stats = RetryStats()
        self.cache_write_tokens = 0
        self._declared = (tools, structured, reports_cost, cache_writes)
        self.free = free
        self._warned: set[str] = set()

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.name!r}, base_url={self.base_url!r})"

    def _declare(self) -> Capabilities:
        tools, structured, reports_cost, cache_writes = self._declared
        pricing = Pricing(per_call=0.0) if self.free else \
            Pricing(model=self.price_model, overrides=self.prices, reported=reports_cost,
                    cache_writes=cache_writes)
        return Capabilities(
            max_output_tokens=self.default_options.get("max_tokens"), streaming=self.stream,
            tools=tools, images=True, structured=structured, pricing=pricing,
            identity=model_identity(self.name, self.model, self.base_url, self.default_options))

    def estimate_cost(self, input_tokens: int, output_tokens: int) -> float | None:
        """Worst-case USD of a call (pricing.estimate of what this client declares); None
        when the model has no known price."""
        return estimate(self.capabilities.pricing, input_tokens, output_tokens)

    # ------------------------------------------------------------ the calls
    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        """The reply to `messages`. Options every client takes: max_tokens, temperature,
        stop, timeout; the adapter takes its provider's own; others are logged and ignored."""
        return await self._call(messages, options, None)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """`complete`, streamed: the text goes to `on_delta(piece, offset)` as it arrives;
        the Completion (usage, cost) is the one `complete` would return. A call with `tools=`
        does not stream, nor any call of a client built with `stream=False`."""
        if not self.stream or options.get("tools"):
            return await self._call(messages, options, None)
        return await self._call(messages, options, on_delta)

    async def aclose(self) -> None:
        await self.adapter.aclose()

    async def _call(self, messages: list[Message], options: dict[str, Any],
                    on_delta: OnDelta | None) -> Completion:
        opts = {**self.default_options, **options}
        timeout = float(opts.pop("timeout", None) or self.timeout)
        tools, logprobs = bool(opts.get("tools")), bool(opts.get("logprobs"))
        request = self.adapter.request(messages, opts, timeout)
        self._warn_unknown(opts)
        t0 = time.perf_counter()

        async def attempt() -> Completion:
            if on_delta is None:
                reply = await self._send(request, timeout)
                text = reply.text or ""
            else:
                reply, text = await self._stream(request, timeout, on_delta)
            if not text.strip() and not (tools and reply.tool_calls):
                raise EmptyResponseError(f"{self.adapter.where} returned no text "
                                         f"({_finish_note(reply.finish)})")
            usage, writes = _usage(reply.usage, self.adapter.usage_fields, self.adapter.where)
            comp = Completion(text=text, usage=usage, cost_usd=self._cost(reply, usage, writes),
                              model=reply.model or self.model,
                              latency_s=time.perf_counter() - t0, raw=reply.raw,
                              first_logprobs=reply.first_logprobs if logprobs else None)
            if writes:
                self.cache_write_tokens += writes
            return comp

        return await with_retries(attempt, self.policy, self.stats, what=self.name)

    async def _send(self, request: Any, timeout: float) -> Reply:
        adapter = self.adapter
        try:
            async with asyncio.timeout(timeout):
                return adapter.read(await adapter.send(request))
        except ModelError:
            raise
        except TimeoutError as e:
            raise timed_out(adapter.where) from e
        except Exception as e:
            raise adapter.error(e) from e

    async def _stream(self, request: Any, timeout: float,
                      on_delta: OnDelta) -> tuple[Reply, str]:
        """One streamed attempt: (its closing Reply, the reply's text)."""
        adapter = self.adapter
        pieces = Pieces(on_delta)
        reply: Reply | None = None
        try:
            async with asyncio.timeout(timeout), \
                    contextlib.aclosing(adapter.stream(request)) as events:
                async for event in events:
                    if isinstance(event, str):
                        pieces.add(event)
                    else:
                        reply = event
        except Exception as e:
            err = e if isinstance(e, ModelError) else \
                timed_out(adapter.where) if isinstance(e, TimeoutError) else adapter.error(e)
            if pieces.chars and err.retryable and not isinstance(err, StreamCut):
                raise StreamCut(adapter.where, pieces.chars, str(err)) from e
            if err is e:
                raise
            raise err from e
        if reply is None or reply.finish is None:
            raise StreamCut(adapter.where, pieces.chars, "it ended with no finish reason")
        if reply.usage is None and "no-stream-usage" not in self._warned:
            self._warned.add("no-stream-usage")
            log.warning("%s: the stream carried no usage (an OpenAI-compatible server that "
                        "ignores stream_options.include_usage?), so streamed calls count no "
                        "tokens; pass stream=False to this client", self.name)
        return reply, pieces.text if reply.text is None else reply.text

    def _cost(self, reply: Reply, usage: Usage, writes: int) -> float | None:
        """What the provider reported, else the table's price, else the provider's own (a
        model served on one's own machine is free, counted or not)."""
        if self.free:
            return 0.0
        if reply.usage is None:      # we cannot price what we cannot count
            return None
        reported = reply.cost_usd
        if isinstance(reported, int | float) and not isinstance(reported, bool):
            return float(reported)
        cost = charge(self.capabilities.pricing, usage, cache_write_tokens=writes,
                      model=reply.model or None)
        if cost is None and reply.price is not None:
            try:
                cost = reply.price()
            except Exception:        # a provider's own price map failing must not fail the call
                cost = None
        return cost

    def _warn_unknown(self, options: Mapping[str, Any]) -> None:
        """Log each option this client does not send, once per client (sandboxed code may
        pass options meant for another client)."""
        for key in options:
            if key not in self._warned:
                self._warned.add(key)
                log.warning("%s: ignoring unknown option %r", self.name, key)


# ------------------------------------------------------------------ usage
def _usage(raw: Any, fields: UsageFields, where: str) -> tuple[Usage, int]:
    """(Usage, cache-write tokens) of a reply's usage object; a field that is not a token
    count is a ModelError naming it (not retryable: the same server answers the same way)."""
    if raw is None:
        return Usage(), 0
    counts = [0, 0, 0, 0]
    for i, names in enumerate(fields):
        for name in names:
            counts[i] += _count(raw, name, where)
    return Usage(input_tokens=counts[0], output_tokens=counts[1],
                 cached_tokens=counts[2]), counts[3]


def _count(raw: Any, name: str, where: str) -> int:
    if type(raw) is dict and "." not in name:     # the usual case, on every call
        value = raw.get(name)
    else:
        value = raw
        for part in name.split("."):
            if value is None:
                break
            value = value.get(part) if isinstance(value, Mapping) else \
                getattr(value, part, None)
    if value is None:
        return 0
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ModelError(f"{where}: the reply's usage is malformed: {name} is {shown}, not a "
                     "token count", retryable=False)


def _finish_note(finish: str | None) -> str:
    if not finish:
        return "no finish reason"
    note = f"finish reason: {finish}"
    return note + ": max_tokens too small?" if finish.lower() in _CAPPED else note
