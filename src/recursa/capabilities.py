"""What a model client declares it can do (`recursa.types.ModelClient.capabilities`).

Also importable from recursa.types; kept in a module of its own so `import recursa` does not
build these dataclasses until a client is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Capabilities", "Pricing"]


@dataclass(frozen=True)
class Pricing:
    """How a client's calls are priced: declared by the client, priced by one owner
    (`recursa.models.pricing`: `estimate` before a call, `charge` after it, `status` for
    preflight). Nothing declared means "no known price": a cost limit then refuses to start.

    `model`: the name the price table knows the model by (with `overrides`, the prices given to
    this client, winning); `per_call`: a flat USD per call whatever its size (0.0: free);
    `estimate`: the client's own worst case `(input_tokens, output_tokens) -> USD | None`;
    `reported`: the provider reports what each call cost (`Completion.cost_usd`), so a run can
    keep a cost limit without a table price; `cache_writes`: prompt caching may bill input at
    the cache-write rate, which a worst case must assume."""

    model: str | None = None
    overrides: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    per_call: float | None = None
    estimate: Callable[[int, int], float | None] | None = field(default=None, compare=False)
    reported: bool = False
    cache_writes: bool = False


@dataclass(frozen=True)
class Capabilities:
    """What a model client can do, declared by the client (`ModelClient.capabilities`), so
    recursa reads a declaration instead of probing the client for methods and attributes.

    `context_window`: tokens it reads at once (None: unknown; recursa assumes a large window).
    `max_output_tokens`: its reply cap when a call sets none. `streaming`: it has
    `astream(messages, on_delta, **options)` (see recursa.models.streaming). `tools`: it takes
    OpenAI-style `tools=[...]` and returns the calls in `Completion.raw` (else tools go by the
    text protocol of recursa.tools). `images`: it takes image parts in messages. `structured`:
    how a reply is constrained to a JSON schema ("json_schema": llama.cpp's option;
    "response_format": OpenAI's), None: not at all. `pricing`: see Pricing. `identity`: what
    names the model behind the client for the response cache (never a key); empty: its name."""

    context_window: int | None = None
    max_output_tokens: int | None = None
    streaming: bool = False
    tools: bool = False
    images: bool = False
    structured: Literal["json_schema", "response_format"] | None = None
    pricing: Pricing = Pricing()
    identity: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
