"""The door every client object given to recursa passes: inside, a client declares what it
can do (`ModelClient.capabilities`) and nothing asks it with `getattr`.

A client written before capabilities were declared (a `name`, `complete` and `aclose`, with
optional `context_window` / `n_ctx`, `astream`, `supports_tools`, `supports_images`,
`estimate_cost`, `prices`, `cache_identity()`, `default_options`, `model`, `base_url`) still
works: `declared` wraps it in `UndeclaredClient`, which reads those attributes here, in this
one place, and declares what they said. Declaring `capabilities` is the supported way.
"""

from __future__ import annotations

import warnings
from typing import Any

from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelClient,
    Pricing,
    model_identity,
)

_warned: set[type] = set()


class Declares:
    """For a client class: `capabilities` built by its `_declare()` once, and again only after
    one of its public attributes is set (e.g. `client.stream = False`), so a call reads it for
    the price of an attribute: the dispatcher asks for every call. Mutating an attribute in
    place (a dict's item) is not seen: assign a new value."""

    _caps: Capabilities | None = None
    _counters: frozenset[str] = frozenset()     # public attributes a call updates

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if not name.startswith("_") and name not in self._counters and self._caps is not None:
            object.__setattr__(self, "_caps", None)

    @property
    def capabilities(self) -> Capabilities:
        caps = self._caps
        if caps is None:
            caps = self._declare()
            object.__setattr__(self, "_caps", caps)
        return caps

    def _declare(self) -> Capabilities:
        raise NotImplementedError


def declared(client: Any) -> ModelClient:
    """`client` itself when it declares its capabilities, else an UndeclaredClient over it.
    Not a client at all (no `name` or `complete`): TypeError naming what is missing."""
    if isinstance(client, ModelClient):
        return client
    missing = [a for a in ("name", "complete", "aclose") if not hasattr(client, a)]
    if missing:
        raise TypeError(f"{type(client).__name__} is not a model client: it has no "
                        f"{', '.join(missing)} (see recursa.base.types.ModelClient)")
    if type(client) not in _warned:
        _warned.add(type(client))
        warnings.warn(f"{type(client).__name__} declares no `capabilities` "
                      "(recursa.base.types.Capabilities); recursa reads its old attributes for now",
                      DeprecationWarning, stacklevel=3)
    return UndeclaredClient(client)


class UndeclaredClient:
    """A client without `capabilities`, declaring what its old attributes say. Every other
    attribute is the inner client's."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name: str = inner.name

    def __getattr__(self, attr: str) -> Any:      # only called for what is not set above
        if attr == "inner":                       # not set yet (copy, unpickling)
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def __repr__(self) -> str:
        return f"UndeclaredClient({self.inner!r})"

    @property
    def capabilities(self) -> Capabilities:
        c = self.inner
        window = getattr(c, "context_window", None) or getattr(c, "n_ctx", None)
        defaults = dict(getattr(c, "default_options", None) or {})
        own = getattr(c, "cache_identity", None)
        identity = dict(own()) if callable(own) else model_identity(
            c.name, str(getattr(c, "model", "") or ""), getattr(c, "base_url", None), defaults)
        est = getattr(c, "estimate_cost", None)
        prices = getattr(c, "prices", None)
        model = str(getattr(c, "model", "") or c.name)
        if callable(est):
            pricing = Pricing(estimate=est)
        elif hasattr(c, "prices"):       # priced by the table, as recursa's clients were
            pricing = Pricing(model=model, overrides=prices)
        else:                             # it prices its own calls (Completion.cost_usd)
            pricing = Pricing(model=model, reported=True)
        return Capabilities(
            context_window=int(window) if window else None,
            max_output_tokens=defaults.get("max_tokens"),
            streaming=callable(getattr(c, "astream", None)),
            tools=bool(getattr(c, "supports_tools", False)),
            images=bool(getattr(c, "supports_images", True)),
            pricing=pricing, identity=identity)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        result: Completion = await self.inner.complete(messages, **options)
        return result

    async def astream(self, messages: list[Message], on_delta: Any,
                      **options: Any) -> Completion:
        result: Completion = await self.inner.astream(messages, on_delta, **options)
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()
