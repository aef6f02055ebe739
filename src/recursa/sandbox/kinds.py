"""Sandbox kinds by name (`sandbox="local"`, `--sandbox docker`): the one list of recursa's
own, and the registry other packages add to through the `recursa.sandboxes` entry point group
(see recursa.base.plugins): its name is the kind, its object a `SandboxKind` or just a factory
`(**options) -> Sandbox`. `register_sandbox` does the same for one process.

Standard library only, and nothing imported until a sandbox is built or checked: front ends
list the kinds while building their parsers.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from recursa.base.plugins import Registry

if TYPE_CHECKING:
    from recursa.base.types import Sandbox

Check = Callable[[Mapping[str, Any]], "list[str] | Awaitable[list[str]]"]


class SandboxKind(NamedTuple):
    """One kind of sandbox. `factory(**options)` builds it; `check(options)` (optional, may be
    async) lists what keeps it from starting here (a missing engine, SDK or credentials), for
    the checks before a run; `launcher` ("module:Class"): a remote kind's launcher (see
    recursa.sandbox.remote); `aliases`: other names for it; `isolates`: whether it keeps
    model-written code from the user's files, network and processes (False: it runs as the
    user, with resource limits at most, so the server refuses it beyond loopback). Front ends
    list the kinds, and say which isolate, from these entries."""

    name: str
    factory: Callable[..., Sandbox]
    description: str = ""
    check: Check | None = None
    launcher: str | None = None
    aliases: tuple[str, ...] = ()
    isolates: bool = True


def _import(path: str) -> Any:
    import importlib
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


# ---------------------------------------------------------------- recursa's own kinds
def _local(**opts: Any) -> Sandbox:
    from recursa.sandbox.local import LocalSandbox
    return LocalSandbox(**opts)


def _limits(**opts: Any) -> Sandbox:
    from recursa.sandbox.local import LocalSandbox
    if opts.get("isolation", "limits") != "limits":
        raise ValueError(f"sandbox 'limits' is the local sandbox without isolation; "
                         f"isolation={opts['isolation']!r} contradicts it")
    return LocalSandbox(**{**opts, "isolation": "limits"})


def _inprocess(**opts: Any) -> Sandbox:
    from recursa.sandbox.inprocess import InProcessSandbox
    return InProcessSandbox(**opts)


def _wasm(**opts: Any) -> Sandbox:
    from recursa.sandbox.wasm import WasmSandbox
    return WasmSandbox(**opts)


def _remote(kind: str) -> Callable[..., Sandbox]:
    def make(**opts: Any) -> Sandbox:
        from recursa.sandbox.remote import make_remote_sandbox
        return make_remote_sandbox(kind, **opts)
    return make


def _check_local(options: Mapping[str, Any]) -> list[str]:
    if options.get("isolation", "auto") == "limits":
        return []
    from recursa.sandbox.isolation import unavailable_reason
    why = unavailable_reason(options.get("bwrap"))
    return [f"sandbox='local': {why}"] if why else []


def _check_wasm(options: Mapping[str, Any]) -> list[str]:
    from recursa.sandbox.wasm_runtime import unavailable_reason
    cache = options.get("cache_dir")
    why = unavailable_reason(Path(cache).expanduser() if cache else None)
    return [why] if why else []


async def _check_docker(options: Mapping[str, Any]) -> list[str]:
    from recursa.base.types import SandboxError
    from recursa.sandbox.remote.docker import DockerLauncher
    opts = {k: v for k, v in options.items() if k in ("docker", "check_timeout")}
    try:
        await DockerLauncher(**opts).check_engine()
    except SandboxError as e:
        return [str(e)]
    return []


def _sdk_check(kind: str, module: str, extra: str,
               credentials: Callable[[Mapping[str, Any]], str | None]) -> Check:
    """The SDK is installed and credentials are found (`credentials` says what is missing)."""
    def check(options: Mapping[str, Any]) -> list[str]:
        import importlib.util
        if importlib.util.find_spec(module) is None:
            from recursa.base.extras import MissingExtra
            return [str(MissingExtra(extra, f"sandbox={kind!r}", module=module))]
        missing = credentials(options)
        return [f"sandbox={kind!r}: no credentials ({missing})"] if missing else []
    return check


def _e2b_credentials(options: Mapping[str, Any]) -> str | None:
    return None if options.get("api_key") or os.environ.get("E2B_API_KEY") \
        else "set E2B_API_KEY"


def _daytona_credentials(options: Mapping[str, Any]) -> str | None:
    return None if (options.get("api_key") or os.environ.get("DAYTONA_API_KEY")
                    or os.environ.get("DAYTONA_JWT_TOKEN")) else "set DAYTONA_API_KEY"


def _modal_credentials(options: Mapping[str, Any]) -> str | None:
    if os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"):
        return None
    if Path(os.environ.get("MODAL_CONFIG_PATH", "~/.modal.toml")).expanduser().is_file():
        return None
    return "run `modal token new`, or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"


_REMOTE = "recursa.sandbox.remote"
BUILTIN: tuple[SandboxKind, ...] = (
    SandboxKind("local", _local, "a worker process isolated by bubblewrap; refuses to start "
                "where that cannot work", _check_local),
    SandboxKind("limits", _limits, "a worker process with resource limits only, NOT isolated "
                "from your files and network", isolates=False),
    SandboxKind("inprocess", _inprocess, "this process, not isolated",
                aliases=("in-process", "in_process"), isolates=False),
    SandboxKind("wasm", _wasm, "CPython compiled to WebAssembly, run by wasmtime: no network, "
                "no files but its own", _check_wasm),
    SandboxKind("docker", _remote("docker"), "a Docker container", _check_docker,
                launcher=f"{_REMOTE}.docker:DockerLauncher"),
    SandboxKind("modal", _remote("modal"), "a Modal sandbox",
                _sdk_check("modal", "modal", "modal", _modal_credentials),
                launcher=f"{_REMOTE}.modal:ModalLauncher"),
    SandboxKind("e2b", _remote("e2b"), "an E2B sandbox",
                _sdk_check("e2b", "e2b", "e2b", _e2b_credentials),
                launcher=f"{_REMOTE}.e2b:E2BLauncher"),
    SandboxKind("daytona", _remote("daytona"), "a Daytona sandbox",
                _sdk_check("daytona", "daytona", "daytona", _daytona_credentials),
                launcher=f"{_REMOTE}.daytona:DaytonaLauncher"),
)
BUILTIN_NAMES = tuple(k.name for k in BUILTIN)
REMOTE_KINDS = tuple(k.name for k in BUILTIN if k.launcher)


# ---------------------------------------------------------------- the registry
def _builtins() -> Iterable[tuple[str, SandboxKind]]:
    for k in BUILTIN:
        yield k.name, k
        for alias in k.aliases:
            yield alias, k


KINDS: Registry[SandboxKind] = Registry("recursa.sandboxes", "sandbox kind", _builtins,
                                        SandboxKind)


def register_sandbox(kind: SandboxKind, *, replace: bool = False) -> None:
    """Make `sandbox=kind.name` build `kind` in this process."""
    KINDS.register(kind.name, kind, replace=replace)


def sandbox_kind(name: str) -> SandboxKind | None:
    """The kind called `name` (or an alias of it), or None."""
    return KINDS.get(name)


_ALIASES = frozenset(a for k in BUILTIN for a in k.aliases)


def kind_names(*, isolates: bool | None = None) -> list[str]:
    """Every kind's name (aliases left out): recursa's own, then other packages'; with
    `isolates`, only the kinds that isolate model-written code (True) or do not (False)."""
    names = [n for n in KINDS.names() if n not in _ALIASES]
    if isolates is None:
        return names
    return [n for n in names if (k := KINDS.get(n)) is not None and k.isolates is isolates]


def kind_isolates(name: str) -> bool | None:
    """Whether the kind called `name` (or an alias of it, any case) isolates model-written
    code; None for an unknown name."""
    k = sandbox_kind(name) or sandbox_kind(name.lower())
    return None if k is None else k.isolates


def launcher_for(kind: str, options: dict[str, Any]) -> Any:
    """The launcher of a remote kind, built with `options`."""
    k = sandbox_kind(kind)
    if k is None or k.launcher is None:
        raise ValueError(f"unknown remote sandbox kind {kind!r}; expected one of "
                         f"{', '.join(REMOTE_KINDS)}")
    return _import(k.launcher)(**options)
