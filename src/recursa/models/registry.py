"""Model providers by spec prefix: `PREFIX:MODEL` -> a Provider that builds the client.

recursa's own providers are listed once, in providers.py. Another package adds one without
touching recursa through an entry point in the group `recursa.providers` (see recursa.base.plugins):
its name is the prefix, its object a `Provider` or just a factory

    def factory(model: str, *, name: str, **options) -> ModelClient

(`name` is the whole spec; `base_url=`, `api_key=` and `prices=` come only when given, with the
caller's client options). `register_provider` does the same for one process. A provider is
loaded on first use: naming `openai:...` never reads the other packages' metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple

from recursa.base.plugins import Registry

Factory = Callable[..., Any]      # (model, *, name, [base_url, api_key, prices], **opts) -> client


class Provider(NamedTuple):
    """One provider: how its clients are built, and what the checks before a run need to know
    about it before any client exists (recursa.core.preflight).

    `endpoint`: it takes `base_url=` (local and scripted models have none). `default_url` /
    `url_env`: where it is reached when no base_url is given; `needs_endpoint`: it has no
    default, so one of them is required. `key_env`: the variables its key may come from (empty:
    its SDK finds credentials itself); `key_at_default_url_only`: a base_url elsewhere needs no
    key (an OpenAI-compatible server of one's own). `free`: its calls cost nothing;
    `reports_cost`: the provider reports each call's cost, so a cost limit holds without a
    table price. `model_file`: the model is a file on this machine (or a registry name).
    `structured`: how its clients constrain a reply to a JSON schema. `hints`: how model names
    meant for it start, to suggest the prefix when one is missing. `needs_model`: a spec
    without a model name after the prefix is an error."""

    prefix: str
    factory: Factory
    description: str = ""
    endpoint: bool = True
    default_url: str | None = None
    url_env: str | None = None
    needs_endpoint: bool = False
    key_env: tuple[str, ...] = ()
    key_at_default_url_only: bool = False
    free: bool = False
    reports_cost: bool = False
    model_file: bool = False
    structured: Literal["json_schema", "response_format"] | None = None
    hints: tuple[str, ...] = ()
    needs_model: bool = True

    def build(self, model: str, *, name: str, base_url: str | None = None,
              api_key: str | None = None, prices: Any = None, **opts: Any) -> Any:
        """A client for `model`; only the arguments given reach the factory."""
        given = {k: v for k, v in (("base_url", base_url), ("api_key", api_key),
                                   ("prices", prices)) if v is not None}
        return self.factory(model, name=name, **given, **opts)


def _builtins() -> Iterable[tuple[str, Provider]]:
    from .providers import BUILTIN
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
