"""Checks made before a run's first model call, so a run that cannot work fails at once, in
plain words, having spent nothing: the sandbox engine and its credentials, local model files,
API keys, that every endpoint answers a connection, and that a cost cap can be kept (every model
has a price: built in, registered, given by the user, reported by the provider, or free).

`check(...)` takes model specs (what a front end has before it builds anything) or built
clients (what RLM has); it raises PreflightError listing every problem found.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from recursa.types import RecursaError

CONNECT_TIMEOUT = 5.0
_REACHED_TTL = 60.0                      # a server makes one RLM per request: check once a minute
_reached: dict[tuple[str, int], float] = {}

# the variables a provider's key may come from (bedrock and litellm: their SDKs' own chains)
_KEY_ENV = {"openai": ("OPENAI_API_KEY",), "anthropic": ("ANTHROPIC_API_KEY",),
            "openrouter": ("OPENROUTER_API_KEY",), "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
            "azure": ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN")}
_DEFAULT_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com",
                "openrouter": "https://openrouter.ai/api/v1",
                "gemini": "https://generativelanguage.googleapis.com"}
_REMOTE = {"modal": ("modal", "modal"), "e2b": ("e2b", "e2b"), "daytona": ("daytona", "daytona")}


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
    provider: str                  # openai, anthropic, openrouter, vllm, local, replay, other
    model: str
    endpoint: str | None = None    # URL to reach (None: nothing to reach)
    price: str | None = None       # 'free', 'known', 'reported' or None (unknown)
    missing_key: str | None = None  # the variable that should hold a key that is not set
    local_path: Path | None = None


# ---------------------------------------------------------------- targets
def target_of_spec(spec: str, *, base_url: str | None = None, api_key: bool = False,
                   prices: Mapping[str, Any] | None = None) -> Target:
    """What a spec string will need, before any client exists (`api_key`: one was given)."""
    from recursa.models.pricing import price_for
    prefix, _, model = spec.partition(":")
    prefix = prefix.strip().lower()
    t = Target(name=spec, provider=prefix, model=model.strip())
    if prefix in ("replay", "replay-file"):
        t.price = "free"
        return t
    if prefix == "local":
        t.price = "free"
        if not _registry_name(t.model):
            t.local_path = Path(t.model).expanduser()
        return t
    t.endpoint = base_url or _DEFAULT_URL.get(prefix) or os.environ.get(
        {"vllm": "VLLM_BASE_URL", "azure": "AZURE_OPENAI_ENDPOINT"}.get(prefix, ""), None)
    hosted = prefix in _KEY_ENV and (base_url is None or prefix != "openai"
                                     or "api.openai.com" in base_url)
    names = _KEY_ENV.get(prefix, ())
    if hosted and not api_key and not any(os.environ.get(n) for n in names):
        t.missing_key = " or ".join(names)
    if price_for(spec, prices) is not None:
        t.price = "known"
    elif prefix == "openrouter":
        t.price = "reported"
    return t


def target_of_client(client: Any) -> Target:
    """What a built ModelClient will need (any object with a `name`)."""
    name = str(getattr(client, "name", "") or "")
    prefix = name.partition(":")[0].lower() if ":" in name else "other"
    model = str(getattr(client, "model", "") or name)
    t = Target(name=name, provider=getattr(client, "provider", None) or prefix, model=model)
    if prefix == "local":
        t.price = "free"
        path = getattr(client, "path", None)
        t.local_path = Path(path) if path is not None else None
        return t
    url = getattr(client, "base_url", None)
    t.endpoint = str(url) if url else None
    t.price = _client_price(client)
    if t.price is None and t.provider == "openrouter":
        t.price = "reported"      # OpenRouter returns what it charged in usage.cost
    return t


def _client_price(client: Any) -> str | None:
    """'known', 'reported' or None. recursa's hosted clients carry `prices` and know their
    price or not; a client of another kind prices its own calls (its Completion's cost_usd),
    and the ledger stops the run at the first call it leaves unpriced."""
    if str(getattr(client, "name", "")).startswith("replay"):
        return None if getattr(client, "cost_usd", 0.0) is None else "known"
    est = getattr(client, "estimate_cost", None)
    if est is not None:
        try:
            if est(1, 1) is not None:
                return "known"
        except Exception:
            pass
    if not hasattr(client, "prices"):
        return "reported"
    from recursa.models.pricing import price_for
    model = str(getattr(client, "model", "") or getattr(client, "name", ""))
    return "known" if price_for(model, client.prices) is not None else None


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
        if t.provider in ("vllm", "azure") and not t.endpoint:
            flag = "--base-url URL" if cli else "base_url="
            var = "VLLM_BASE_URL" if t.provider == "vllm" else "AZURE_OPENAI_ENDPOINT"
            problems.append(f"{t.name}: no endpoint (give {flag} or set {var})")
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


def _sandbox_problems(kind: Any, options: Mapping[str, Any]) -> list[str]:
    if kind == "local" and options.get("isolation", "auto") != "limits":
        from recursa.sandbox.isolation import unavailable_reason
        why = unavailable_reason(options.get("bwrap"))
        return [f"sandbox='local': {why}"] if why else []
    if not isinstance(kind, str) or kind in ("local", "limits", "inprocess", "in-process",
                                             "in_process"):
        return []
    if kind in _REMOTE:
        module, extra = _REMOTE[kind]
        if importlib.util.find_spec(module) is None:
            from recursa.extras import MissingExtra
            return [str(MissingExtra(extra, f"sandbox={kind!r}", module=module))]
        if kind == "e2b" and not (options.get("api_key") or os.environ.get("E2B_API_KEY")):
            return ["sandbox='e2b': no credentials (set E2B_API_KEY)"]
        if kind == "daytona" and not (options.get("api_key") or os.environ.get("DAYTONA_API_KEY")
                                      or os.environ.get("DAYTONA_JWT_TOKEN")):
            return ["sandbox='daytona': no credentials (set DAYTONA_API_KEY)"]
        if kind == "modal" and not (
                (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"))
                or Path(os.environ.get("MODAL_CONFIG_PATH", "~/.modal.toml")).expanduser()
                .is_file()):
            return ["sandbox='modal': no credentials (run `modal token new`, or set "
                    "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET)"]
    return []


async def _docker_problems(options: Mapping[str, Any]) -> list[str]:
    from recursa.sandbox.remote.docker import DockerLauncher
    from recursa.types import SandboxError
    opts = {k: v for k, v in options.items() if k in ("docker", "check_timeout")}
    try:
        await DockerLauncher(**opts).check_engine()
    except SandboxError as e:
        return [str(e)]
    return []


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
    problems += _sandbox_problems(sandbox, sandbox_options or {})
    if sandbox == "docker":
        problems += await _docker_problems(sandbox_options or {})
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
    """A front end's checks of `recursa.options.RLMOptions` before anything is spent, worded
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
