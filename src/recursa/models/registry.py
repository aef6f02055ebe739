"""Model providers by spec prefix: `PREFIX:MODEL` -> a Provider that builds the client.

recursa's own providers are listed once, in providers.py (with `Provider`, what one is).
Another package adds one without touching recursa through an entry point in the group
`recursa.providers` (see recursa.base.plugins): its name is the prefix, its object a
`Provider` or just a factory

    def factory(model: str, *, name: str, **options) -> ModelClient

(`name` is the whole spec; `base_url=`, `api_key=` and `prices=` come only when given, with the
caller's client options). `register_provider` does the same for one process. A provider is
loaded on first use: naming `openai:...` never reads the other packages' metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from recursa.base.plugins import Registry

from .providers import BUILTIN, Factory, Provider

__all__ = ["PROVIDERS", "Factory", "Provider", "is_prefix", "prefixes", "provider",
           "provider_of", "register_provider", "structured_output"]


def _builtins() -> Iterable[tuple[str, Provider]]:
    return ((p.prefix, p) for p in BUILTIN)


PROVIDERS: Registry[Provider] = Registry("recursa.providers", "model provider", _builtins,
                                         Provider)


def register_provider(provider: Provider, *, replace: bool = False) -> None:
    """Make `provider.prefix:` specs build clients with `provider` in this process."""
    PROVIDERS.register(provider.prefix.strip().lower(), provider, replace=replace)


def provider(prefix: str) -> Provider | None:
    """The provider of a spec prefix (case-insensitive), or None."""
    return PROVIDERS.get(prefix.strip().lower())


def prefixes() -> list[str]:
    """Every prefix: recursa's own, then those of installed packages and registered ones."""
    return PROVIDERS.names()


def is_prefix(prefix: str) -> bool:
    """Whether `prefix` names a provider already known to this process (built in, registered
    or loaded), without reading other packages' metadata: what price lookups ask per call."""
    return PROVIDERS.known(prefix)


def structured_output(client: Any) -> Literal["json_schema", "response_format"] | None:
    """How a reply of `client` (a ModelClient, or a spec name) is constrained to a JSON schema:
    what the client declares, else what its provider's clients do (a scripted stand-in named
    `local:...` is constrained as a local model would be)."""
    if not isinstance(client, str):
        declared: Literal["json_schema", "response_format"] | None = \
            client.capabilities.structured
        if declared is not None:
            return declared
        client = client.name
    p = provider_of(client)
    return p.structured if p is not None else None


def provider_of(name: str) -> Provider | None:
    """The provider a client's spec name (`prefix:model`) is from, if that prefix is known."""
    prefix, sep, _ = name.partition(":")
    return provider(prefix) if sep and is_prefix(prefix.strip().lower()) else None
