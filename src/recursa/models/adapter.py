"""The seam between a provider's wire and recursa's one hosted-client control flow.

A hosted model client is a `HostedClient` (hosted.py) driving an `Adapter`. The client owns
what is the same for every provider: the options a call takes, attempts and retries (backoff
with jitter, `Retry-After`), the time bound of each attempt, streaming and its cut-off,
the empty-reply rule, usage, cost and the `Completion`. The adapter owns what is the
provider's own: how a request is written (messages, images, options), how it is sent or
streamed, how a reply is read and how a failure is named. It never retries, sleeps, prices
or counts.

An adapter is a plain class with the members below (nothing to inherit); `describe` writes
the usual `where`; `status_error`, `sdk_error`, `timed_out` and `connection_error` map the usual failures the usual way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, NamedTuple, Protocol

from recursa.base.types import Message, ModelError

from .retry import RETRYABLE_STATUSES, parse_retry_after


class UsageFields(NamedTuple):
    """Where a provider's usage object keeps recursa's token counts: each count is the sum of
    the fields named (`a.b` reaches into a nested object or mapping; a missing field is 0).
    `input` is the whole prompt, cached and cache-written tokens included; `cached` the cache
    reads among them; `cache_write` the cache writes among them (billed at that price)."""

    input: tuple[str, ...]
    output: tuple[str, ...]
    cached: tuple[str, ...] = ()
    cache_write: tuple[str, ...] = ()


class Reply(NamedTuple):
    """One reply as an adapter reads it; the client checks it and makes the Completion.

    `text`: the reply's text (None in the Reply that ends a stream: the streamed pieces are
    the text). `finish`: why the reply ended, in the provider's words (`stop`, `length`,
    `end_turn`...); None at the end of a stream means the stream was cut. `model`: the model
    that answered, as the provider names it. `usage`: the provider's usage object, read
    through `Adapter.usage_fields`; None when the reply has none (the call is then not
    priced). `cost_usd`: what the provider says the call cost (OpenRouter), which wins over
    the price table. `price`: the provider's own price of this reply, asked only when the
    table has none (LiteLLM's map). `tool_calls`: the reply calls tools (it may then have no
    text). `first_logprobs`: token -> log-probability of the first reply token's alternatives.
    `raw`: the response, kept as `Completion.raw`."""

    text: str | None = None
    finish: str | None = None
    model: str | None = None
    usage: Any = None
    cost_usd: Any = None
    price: Callable[[], float | None] | None = None
    tool_calls: bool = False
    first_logprobs: dict[str, float] | None = None
    raw: Any = None


class Adapter(Protocol):
    """One provider's wire, as `HostedClient` drives it. This docstring is the contract.

    `where`: names the model and its endpoint ("model 'gpt-4o' at https://..."); every error
    message starts with it. It never holds a key, and neither does anything the adapter
    shows (its repr, its errors).

    `usage_fields`: which fields of `Reply.usage` make recursa's token counts.

    `request(messages, options, timeout)`: one call's request, built from OpenAI-style
    messages (images are `image_url` parts with data URLs: translate them here) and the call's
    options, the client's defaults merged in. Pop each option the request takes; the client
    logs what is left once as ignored. `timeout` is the seconds one attempt may take (the
    client bounds each attempt by it too). No I/O. Every attempt reuses the request: do not
    change it while sending.

    `send(request)`: one attempt; returns the provider's response for `read`. Raise what the
    transport or SDK raises, or a ModelError. Never retry or sleep. It may be cancelled at any
    `await` (a call's time limit, a run that stops).

    `stream(request)`: one streamed attempt, an async generator: each piece of the reply's text
    as a `str` as it arrives, then one `Reply` once the provider says the reply is complete.
    Ending without that Reply, or with a `finish` of None, is a cut stream. The client closes
    the generator when it stops reading: hold connections in `async with` / `finally`.

    `read(response)`: the Reply of a response `send` returned. No I/O.

    `error(exc)`: the ModelError for an exception `send`, `stream` or `read` raised (never a
    ModelError or a cancellation): `retryable` for 408/409/425/429, every 5xx, timeouts,
    dropped connections and bodies that do not parse; `retry_after` from the response's
    headers; the HTTP `status`; a message that starts with `where`.

    `aclose()`: release what the adapter holds (a pool, an SDK client).
    """

    where: str
    usage_fields: UsageFields

    def request(self, messages: list[Message], options: dict[str, Any],
                timeout: float) -> Any: ...

    async def send(self, request: Any) -> Any: ...

    def stream(self, request: Any) -> AsyncGenerator[str | Reply, None]: ...

    def read(self, response: Any) -> Reply: ...

    def error(self, exc: Exception) -> ModelError: ...

    async def aclose(self) -> None: ...


# ------------------------------------------------------------------ naming failures
def describe(model: str, base_url: str | None) -> str:
    """The usual `Adapter.where`."""
    return f"model {model!r}" + (f" at {base_url}" if base_url else "")


def timed_out(where: str) -> ModelError:
    return ModelError(f"{where}: request timed out", retryable=True)


def connection_error(where: str, exc: BaseException) -> ModelError:
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ModelError(f"{where}: connection error ({why})", retryable=True)


def status_error(where: str, status: int | None, message: str,
                 headers: Mapping[str, str] | None = None) -> ModelError:
    """An HTTP error status: retryable for 408/409/425/429 and every 5xx (Anthropic's 529
    "overloaded" too), with the wait its `Retry-After` / `retry-after-ms` header asks for."""
    retryable = status is not None and (status in RETRYABLE_STATUSES or status >= 500)
    return ModelError(f"{where}: HTTP {status}: {message[:500]}", retryable=retryable,
                      status=status or None,
                      retry_after=parse_retry_after(headers) if retryable else None)


def sdk_error(exc: BaseException, sdk: Any, where: str) -> ModelError:
    """An `openai` / `anthropic` SDK exception (the same class names in both; LiteLLM raises
    the openai ones for every provider) as a ModelError."""
    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, sdk.APITimeoutError):
        return timed_out(where)
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return ModelError(f"{where}: connection error{detail}", retryable=True)
    if isinstance(exc, sdk.APIStatusError):
        return status_error(where, int(exc.status_code), _sdk_message(exc),
                            getattr(exc.response, "headers", None))
    if isinstance(exc, sdk.APIResponseValidationError | json.JSONDecodeError):
        # a body that does not parse is usually a proxy or server glitch: worth another try
        return ModelError(f"{where}: malformed response ({type(exc).__name__}: {exc})",
                          retryable=True)
    return ModelError(f"{where}: {type(exc).__name__}: {exc}", retryable=False)


def _sdk_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))
