"""`recursa models list | fetch | default`, `recursa aliases` and `recursa keys`: what models
there are (local GGUF files, each provider and the models a reachable local server serves), and
the user's settings file (recursa.models.userconfig): the default model, aliases, stored keys.

Keys are never taken from the command line (where `ps` and the shell's history show them) and
never printed: `keys set` reads one from stdin or a hidden prompt, `keys list` names providers.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from recursa.frontend.console import escape, stderr_console


def _error(message: str) -> int:
    stderr_console().print(f"[red]error:[/] {escape(message)}")
    return 2


def _note(message: str) -> None:
    stderr_console().print(f"[dim]{escape(message)}[/]")


# ------------------------------------------------------------------ models
def cmd_models_list(a: argparse.Namespace) -> int:
    import asyncio

    from recursa.models import fetch as fetch_mod
    from recursa.models import resolve_model
    from recursa.models.registry import prefixes, provider
    from recursa.models.userconfig import ConfigError, UserConfig, load
    try:
        cfg = load()
        default, why = resolve_model(None)
    except (ConfigError, ValueError) as e:
        _note(str(e))
        cfg, default, why = UserConfig(), None, ""
    stored = cfg.key_names

    def marks(spec: str) -> str:
        """As `llm models` marks them: the default model, and the aliases naming a model."""
        said = ["default"] if spec == default else []
        names = sorted(n for n, s in cfg.aliases.items() if s == spec)
        if names:
            said.append("aliases: " + ", ".join(names))
        return f"  ({'; '.join(said)})" if said else ""

    for name, entry in fetch_mod.REGISTRY.items():
        state = "fetched" if fetch_mod.model_path(name).exists() else "not fetched"
        print(f"{name:24s} {state:12s} {getattr(entry, 'description', '')}"
              f"{marks('local:' + name)}")
    rows = [(prefix, p) for prefix in prefixes() if (p := provider(prefix)) is not None]
    listed = asyncio.run(_listings([p for _, p in rows if p.models_api], a.timeout))
    print("\nproviders (--model PREFIX:MODEL):")
    for prefix, p in rows:
        print(f"  {prefix + ':':13s} {p.description}{_key_state(p, stored)}")
        found = listed.get(p.prefix)
        if isinstance(found, str):
            print(f"  {'':13s} ({found})")
        elif found is not None:
            where = p.endpoint_url()
            if not found:
                print(f"  {'':13s} (no models at {where})")
            for model in found:
                print(f"  {'':15s}{prefix}:{model}{marks(f'{prefix}:{model}')}")
    if default:
        print(f"\ndefault model: {default}  ({why})")
    if cfg.aliases:
        print("aliases (--model NAME):")
        for name, spec in sorted(cfg.aliases.items()):
            print(f"  {name} = {spec}")
    return 0


async def _listings(providers: list[Any], timeout: float) -> dict[str, list[str] | str]:
    """prefix -> the models its server lists, or a one-line note of why there are none."""
    import asyncio

    from recursa.models.listing import ListError, served_models

    async def one(p: Any) -> list[str] | str:
        try:
            return await served_models(p, timeout=timeout)
        except ListError as e:
            return str(e)
    found = await asyncio.gather(*(one(p) for p in providers))
    return {p.prefix: f for p, f in zip(providers, found, strict=True)}


def _key_state(p: Any, stored: tuple[str, ...]) -> str:
    if not p.key_env:
        return ""
    env = next((n for n in p.key_env if os.environ.get(n)), None)
    if env:
        return f"  [key: {env}]"
    return "  [key: stored]" if p.prefix in stored else f"  [no key: {' or '.join(p.key_env)}]"


def cmd_models_fetch(a: argparse.Namespace) -> int:
    from recursa.models import fetch as fetch_mod
    if not a.name:
        return _error("name the model to fetch: " + ", ".join(fetch_mod.REGISTRY))
    try:
        path = fetch_mod.fetch_model(a.name, progress=_note)
    except Exception as e:
        stderr_console().print(f"[red]error:[/] {escape(str(e))}")
        return 1
    print(path)
    return 0


def cmd_models_default(a: argparse.Namespace) -> int:
    from recursa.models import resolve_model
    from recursa.models.userconfig import ConfigError, load_for_update, save
    try:
        if a.model is None and not a.unset:
            spec, why = resolve_model(None)
            print(spec)
            _note(f"({why})")
            return 0
        cfg, _ = load_for_update()
        if a.unset:
            cfg.default_model = None
        else:
            cfg.default_model = _valid_model(a.model)
        path = save(cfg)
    except (ConfigError, ValueError) as e:
        return _error(str(e))
    _note(f"default model {'unset' if a.unset else a.model} ({path})")
    if os.environ.get("RECURSA_MODEL"):
        _note(f"RECURSA_MODEL is set ({os.environ['RECURSA_MODEL']}) and wins over it")
    return 0


def _valid_model(name: str) -> str:
    """`name` as given, once it names a model: a spec of a known provider, or an alias."""
    from recursa.models import provider_for_spec, resolve_model
    provider_for_spec(resolve_model(name)[0])
    return name.strip()


# ------------------------------------------------------------------ aliases
def cmd_aliases(a: argparse.Namespace) -> int:
    from recursa.models import provider_for_spec
    from recursa.models.userconfig import ALIAS_NAME, ConfigError, load, load_for_update, save
    try:
        if a.action == "list":
            aliases = load().aliases
            if not aliases:
                _note("no aliases (recursa aliases set NAME MODEL)")
            for name, spec in sorted(aliases.items()):
                print(f"{name} = {spec}")
            return 0
        cfg, _ = load_for_update()
        if a.action == "set":
            if not ALIAS_NAME.fullmatch(a.name):
                return _error(f"alias {a.name!r}: use letters, digits, '.', '_' and '-' (no "
                              "':', which starts a model spec), at most 64 characters")
            if ":" not in a.model:
                return _error(f"{a.model!r} is not a model spec (PREFIX:MODEL): an alias names "
                              "a spec, not another alias")
            provider_for_spec(a.model)
            cfg.aliases[a.name] = a.model.strip()
        elif cfg.aliases.pop(a.name, None) is None:
            return _error(f"no alias {a.name!r} (recursa aliases list)")
        path = save(cfg)
    except (ConfigError, ValueError) as e:
        return _error(str(e))
    _note(f"alias {a.name} {'= ' + a.model if a.action == 'set' else 'removed'} ({path})")
    return 0


# ------------------------------------------------------------------ keys
def cmd_keys(a: argparse.Namespace) -> int:
    from recursa.models.userconfig import ConfigError, load, load_for_update, save
    try:
        if a.action == "list":
            cfg = load()
            if not cfg.key_names:
                _note("no stored keys (recursa keys set PROVIDER)")
            for name in cfg.key_names:
                print(name + _env_note(name))
            return 0
        p = _key_provider(a.provider)
        cfg, loose = load_for_update()
        if a.action == "set":
            key = _read_key(p.prefix)
            cfg.keys[p.prefix] = key
        elif cfg.keys.pop(p.prefix, None) is None:
            return _error(f"no key stored for {p.prefix} (recursa keys list)")
        path = save(cfg)
    except (ConfigError, ValueError) as e:
        return _error(str(e))
    except (EOFError, KeyboardInterrupt):
        return _error("no key given")
    done = "stored" if a.action == "set" else "removed"
    _note(f"key for {p.prefix} {done} in {path} (readable by you only)")
    if loose:
        _note(f"the file was readable by others before (mode {loose:04o}): replace the keys "
              "it held if others may have read them")
    if a.action == "set" and _env_note(p.prefix):
        _note(_env_note(p.prefix).strip())
    return 0


def _key_provider(prefix: str) -> Any:
    from recursa.models.registry import provider
    p = provider(prefix.rstrip(":"))
    if p is None:
        raise ValueError(f"unknown provider {prefix!r} (recursa models list names them)")
    if not p.key_env:
        raise ValueError(f"{p.prefix}: recursa reads no key for it (its SDK finds its own "
                         "credentials, or it needs none)")
    return p


def _read_key(prefix: str) -> str:
    """The key from stdin when it is not a terminal (`... | recursa keys set openai`), else
    from a prompt that does not echo: never from argv."""
    if sys.stdin is not None and not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        import getpass
        text = getpass.getpass(f"API key for {prefix}: ")
    key = text.strip()
    if not key:
        raise ValueError("no key given (an empty line)")
    if any(c.isspace() for c in key):
        raise ValueError("the key has spaces or line breaks in it: give it alone, on one line")
    return key


def _env_note(prefix: str) -> str:
    from recursa.models.registry import provider
    p = provider(prefix)
    env = next((n for n in (p.key_env if p else ()) if os.environ.get(n)), None)
    return f"  ({env} is set, and is used instead)" if env else ""


# ------------------------------------------------------------------ the commands
def _keyed_providers() -> str:
    """PROVIDER's help: recursa's own providers that take a key (from recursa.models.providers;
    other packages' are not read while building a parser)."""
    from recursa.models.providers import BUILTIN
    return f"{', '.join(p.prefix for p in BUILTIN if p.key_env)}, or an installed package's"


def register(sub: Any) -> None:
    m = sub.add_parser("models", help="list models and providers, fetch a local model, or set "
                       "the default model")
    ms = m.add_subparsers(dest="action", required=True)
    ls = ms.add_parser("list", help="local models, every provider, and the models a "
                       "reachable local server (Ollama, LM Studio, vLLM) serves")
    ls.add_argument("--timeout", type=float, default=1.0, metavar="S",
                    help="seconds to wait for each server (default 1)")
    ls.set_defaults(fn=cmd_models_list)
    f = ms.add_parser("fetch", help="fetch a local model (SHA-256 checked, resumable)")
    f.add_argument("name", nargs="?")
    f.set_defaults(fn=cmd_models_fetch, uses_http=False)
    d = ms.add_parser("default", help="show the model used when none is named, or set it")
    d.add_argument("model", nargs="?", metavar="MODEL", help="a PREFIX:MODEL spec or an alias")
    d.add_argument("--unset", action="store_true", help="forget the default set before")
    d.set_defaults(fn=cmd_models_default, uses_http=False)

    al = sub.add_parser("aliases", help="short names for model specs (recursa aliases set fast "
                        "openai:gpt-5-mini)")
    als = al.add_subparsers(dest="action", required=True)
    als.add_parser("list", help="the aliases, NAME = MODEL").set_defaults(fn=cmd_aliases,
                                                                          uses_http=False)
    st = als.add_parser("set", help="make NAME stand for MODEL wherever a model is named")
    st.add_argument("name", metavar="NAME")
    st.add_argument("model", metavar="MODEL", help="a PREFIX:MODEL spec")
    st.set_defaults(fn=cmd_aliases, uses_http=False)
    rm = als.add_parser("remove", help="forget an alias")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(fn=cmd_aliases, uses_http=False)

    k = sub.add_parser("keys", help="store API keys in your settings file (never shown)")
    ks = k.add_subparsers(dest="action", required=True)
    ks.add_parser("list", help="the providers with a stored key (never the keys)"
                  ).set_defaults(fn=cmd_keys, uses_http=False)
    ky = ks.add_parser("set", help="store PROVIDER's key, read from stdin or a hidden prompt "
                       "(never from the command line)")
    ky.add_argument("provider", metavar="PROVIDER", help=_keyed_providers())
    ky.set_defaults(fn=cmd_keys, uses_http=False)
    kr = ks.add_parser("remove", help="forget PROVIDER's stored key")
    kr.add_argument("provider", metavar="PROVIDER")
    kr.set_defaults(fn=cmd_keys, uses_http=False)
