"""Checks made before a run's first model call, so a run that cannot work fails at once, in
plain words, having spent nothing: the sandbox engine and its credentials, local model files,
API keys, that every endpoint answers a connection, and that a cost cap can be kept (every model
has a price: built in, registered, given by the user, reported by the provider, or free).

`check(...)` takes model specs (what a front end has before it builds anything) or built
clients (what RLM has); it raises PreflightError listing every problem found.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from recursa.base.types import ModelClient, RecursaError

CONNECT_TIMEOUT = 5.0
_REACHED_TTL = 60.0                      # a server makes one RLM per request: check once a minute
_reached: dict[tuple[str, int], float] = {}


class PreflightError(RecursaError, ValueError):
    """A run that cannot work as configured; nothing was spent. `problems` lists each reason."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(problems) == 1:
            super().__init__(problems[0])
        else:
            super().__init__("the run cannot start:\n" + "\n".join(f"- {p}" for p in problems))


@dataclass
class Target:
    """One model as the checks see it."""

    name: str                      # the spec, e.g. openai:gpt-5-mini
    provider: str                  # the spec's prefix (openai, anthropic, local, ...) or 'other'
    model: str
    endpoint: str | None = None    # URL to reach (None: nothing to reach)
    price: str | None = None       # 'free', 'known', 'reported', 'declared' or None (unknown)
    missing_key: str | None = None  # the variable that should hold a key that is not set
    local_path: Path | None = None
    endpoint_env: str | None = None  # the provider has no default endpoint: the variable for one


# ---------------------------------------------------------------- targets
# What each provider needs (key variables, default endpoints, ...) is its registry entry's
# (recursa.models.registry.Provider); what a built client can do, its declaration.
def target_of_spec(spec: str, *, base_url: str | None = None, api_key: bool = False,
                   prices: Mapping[str, Any] | None = None) -> Target:
    """What a spec string will need, before any client exists (`api_key`: one was given)."""
    from recursa.models.pricing import price_for
    from recursa.models.registry import provider
    prefix, _, model = spec.partition(":")
    prefix = prefix.strip().lower()
    t = Target(name=spec, provider=prefix, model=model.strip())
    p = provider(prefix)
    if p is not None and p.free:
        t.price = "free"
        if p.model_file and not _registry_name(t.model):
            t.local_path = Path(t.model).expanduser()
        if not p.endpoint:
            return t
    if p is not None:
        t.endpoint = p.endpoint_url(base_url)
        if p.needs_endpoint:
            t.endpoint_env = p.url_env
        if p.wants_key(base_url) and not api_key and \
                not any(os.environ.get(n) for n in p.key_env) and not _stored(p.prefix):
            t.missing_key = " or ".join(p.key_env)
    else:
        t.endpoint = base_url
    if t.price is not None:
        return t
    if price_for(spec, prices) is not None:
        t.price = "known"
    elif p is not None and p.reports_cost:
        t.price = "reported"
    elif p is not None and p.prefix not in _own_prefixes():
        # another package's provider: its clients declare their prices, which RLM checks
        # (target_of_client) once they are built, still before any model call
        t.price = "declared"
    return t


def target_of_client(client: ModelClient) -> Target:
    """What a built ModelClient will need, from its name and what it declares."""
    from recursa.models.pricing import status
    from recursa.models.registry import provider_of
    caps = client.capabilities
    name = client.name
    prefix = name.partition(":")[0].lower() if ":" in name else "other"
    model = str(caps.identity.get("model") or name)
    t = Target(name=name, provider=prefix, model=model)
    p = provider_of(name)
    if p is not None and p.model_file:
        if not _registry_name(model):
            t.local_path = Path(model).expanduser()
    url = caps.identity.get("base_url")
    t.endpoint = str(url) if url else None
    t.price = status(caps.pricing)
    return t


def _stored(prefix: str) -> bool:
    """A key for `prefix` is in the user's settings file (which must then be private)."""
    from recursa.models.userconfig import stored_key
    return stored_key(prefix) is not None


def _own_prefixes() -> frozenset[str]:
    from recursa.models.providers import BUILTIN
    return frozenset(p.prefix for p in BUILTIN)


def _registry_name(model: str) -> bool:
    from recursa.models.fetch import REGISTRY
    return model in REGISTRY


# ---------------------------------------------------------------- the checks
def _model_problems(targets: list[Target], *, max_cost_usd: float | None,
                    cli: bool) -> list[str]:
    problems = []
    for t in targets:
        if t.missing_key:
            how = (f"set {t.missing_key}, or name the variable holding it with --api-key-env NAME"
                   if cli else f"set {t.missing_key} or pass api_key=")
            problems.append(f"{t.name}: no API key ({how})")
        if t.local_path is not None and not t.local_path.is_file():
            problems.append(f"{t.name}: no such model file {str(t.local_path)!r}")
        if t.endpoint_env and not t.endpoint:
            flag = "--base-url URL" if cli else "base_url="
            problems.append(f"{t.name}: no endpoint (give {flag} or set {t.endpoint_env})")
    if max_cost_usd is not None:
        for t in targets:
            if t.price is None:
                how = (f"--price {t.name}=IN/OUT (USD per 1M input/output tokens)" if cli
                       else f"RLM(prices={{{t.name!r}: (IN, OUT)}}) (USD per 1M input/output "
                            "tokens) or recursa.models.register_price")
                problems.append(f"a cost limit of ${max_cost_usd:g} cannot be kept: recursa "
                                f"knows no price for {t.name} and its provider reports none. "
                                f"Give one with {how}, or drop the cost limit")
    return problems


async def _sandbox_problems(kind: Any, options: Mapping[str, Any]) -> list[str]:
    """What keeps a sandbox of `kind` from starting here, by its own check
    (recursa.sandbox.kinds); a sandbox object or factory is the caller's to check."""
    if not isinstance(kind, str):
        return []
    from recursa.sandbox.kinds import kind_names, sandbox_kind
    k = sandbox_kind(kind)
    if k is None:
        return [f"sandbox={kind!r}: unknown sandbox kind (one of {', '.join(kind_names())})"]
    if k.check is None:
        return []
    found = k.check(options)
    return list(await found if inspect.isawaitable(found) else found)


def _address(url: str) -> tuple[str, int] | None:
    """The host and port a connection to `url` goes to first (its proxy's, when one is set)."""
    import urllib.request
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    if not urllib.request.proxy_bypass(parts.hostname):
        proxy = urllib.request.getproxies().get(parts.scheme)
        if proxy:
            p = urlsplit(proxy if "//" in proxy else "//" + proxy)
            if p.hostname:
                return p.hostname, p.port or (443 if p.scheme == "https" else 80)
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


async def _reach(name: str, url: str, timeout: float) -> str | None:
    where = _address(url)
    if where is None:
        return f"{name}: {url!r} is not a URL (expected e.g. http://127.0.0.1:8000/v1)"
    now = time.monotonic()
    if now - _reached.get(where, -_REACHED_TTL) < _REACHED_TTL:
        return None
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*where), timeout)
    except OSError as e:          # TimeoutError is one too
        why = (f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else
               "connection refused" if isinstance(e, ConnectionRefusedError) else
               e.strerror or str(e))
        return f"{name}: cannot reach {url} ({why})"
    writer.close()
    _reached[where] = now
    return None


async def acheck(targets: Iterable[Target], *, max_cost_usd: float | None = None,
                 sandbox: Any = "local", sandbox_options: Mapping[str, Any] | None = None,
                 reach: bool = True, cli: bool = False,
                 timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise PreflightError naming every problem; `cli` words the fixes as flags."""
    ts = list({t.name + "|" + str(t.endpoint): t for t in targets}.values())
    problems = _model_problems(ts, max_cost_usd=max_cost_usd, cli=cli)
    problems += await _sandbox_problems(sandbox, sandbox_options or {})
    if reach and not problems:     # no use knocking on doors when the keys are missing
        urls = {t.endpoint: t.name for t in ts if t.endpoint}
        found = await asyncio.gather(*(_reach(n, u, timeout) for u, n in urls.items()))
        problems += [p for p in found if p]
    if problems:
        raise PreflightError(problems)


def check(targets: Iterable[Target], **kw: Any) -> None:
    """Blocking twin of `acheck`."""
    asyncio.run(acheck(list(targets), **kw))


def check_options(opts: Any, *, sandbox_options: dict[str, Any] | None = None,
                  say: Any = None) -> None:
    """A front end's checks of `recursa.frontend.options.RLMOptions` before anything is spent, worded
    as flags (raises PreflightError, or OptionError for a key variable that is not set); then
    local runtime and models made ready (built / fetched once, saying so through `say`)."""
    key, sub_key = opts.api_keys()
    prices = opts.price_table()
    targets = []
    if opts.model:
        targets.append(target_of_spec(opts.model, base_url=opts.base_url, api_key=bool(key),
                                      prices=prices))
    if opts.sub_model:
        same = opts.sub_model.partition(":")[0] == (opts.model or "").partition(":")[0]
        url = opts.sub_base_url or (opts.base_url if same else None)
        targets.append(target_of_spec(opts.sub_model, base_url=url,
                                      api_key=bool(sub_key or (key if same else None)),
                                      prices=prices))
    check(targets, max_cost_usd=opts.max_cost_usd, sandbox=opts.sandbox,
          sandbox_options=sandbox_options, cli=True)
    for spec in opts.model_specs():
        if spec.startswith("local:"):
            from recursa.models.runtime_cli import prepare_local
            prepare_local(spec, **({"say": say} if say else {}))
