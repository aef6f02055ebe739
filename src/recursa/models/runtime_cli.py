"""`recursa runtime build | check | info`: the local llama.cpp runtime."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def _say(msg: str) -> None:
    err.print(f"[dim]{escape(msg)}[/]")


def prepare_local(spec: str, say=_say) -> None:
    """Before a run with a `local:` model: build the runtime and fetch the model now, saying so
    (the first time takes minutes), and fail early on a model file that is not there."""
    from . import runtime
    from .fetch import REGISTRY, fetch_model
    name = spec.partition(":")[2].strip()
    if name not in REGISTRY and not Path(name).expanduser().is_file():
        raise FileNotFoundError(f"{spec}: no such model file (known local models: "
                                f"{', '.join(REGISTRY)})")
    runtime.find_server(progress=say)     # builds once, saying so; at once when built
    if name in REGISTRY:
        fetch_model(name, progress=say)   # returns at once when fetched and verified


def check(model: str, n_tokens: int = 2) -> dict[str, Any]:
    """Start the server on `model` and generate `n_tokens`: the run-time proof that this
    machine executes the build. Returns timings; raises ModelError with the reason."""
    from .local import LocalClient

    async def go() -> dict[str, Any]:
        c = LocalClient(model, progress=_say, n_ctx=2048, slots=1)
        srv = await c.load()
        comp = await c.complete([{"role": "user", "content": "Say hi."}],
                                max_tokens=n_tokens, temperature=0.0)
        await c.aclose()
        t = (comp.raw or {}).get("timings") or {}
        return {"binary": srv.config.binary, "model": srv.config.model,
                "server_start_s": round(srv.started_s, 2), "text": comp.text,
                "prompt_tokens_per_s": t.get("prompt_per_second"),
                "generation_tokens_per_s": t.get("predicted_per_second")}
    return asyncio.run(go())


def cmd_runtime(a: argparse.Namespace) -> int:
    import os

    from . import runtime
    if a.source:      # for this command and the server `check` starts
        os.environ[runtime.ENV_KIND] = "source"
    try:
        if a.action == "info":
            print(json.dumps({"kind": runtime.runtime_kind(a.profile),
                              "binary": str(runtime.binary_path(a.profile)),
                              "built": runtime.is_built(a.profile),
                              "default_profile": runtime.default_profile(),
                              "build": runtime.build_info(a.profile)}, indent=1))
            return 0
        if a.action == "build":
            kind = "source" if a.sdist else runtime.runtime_kind(a.profile)
            path = runtime.prepare(a.profile, kind=kind, force=a.force, sdist=a.sdist,
                                   wheel=a.wheel, progress=_say)
            info = runtime.build_info(a.profile, kind) or {}
            _say(f"runtime: {kind} ({info.get('source', '?')}, CPU profile "
                 f"{info.get('profile', '?')})")
            print(path)
            return 0
        print(json.dumps(check(a.model, a.tokens), indent=1))
        return 0
    except Exception as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 1


def register(sub: Any) -> None:
    p = sub.add_parser("runtime", help="fetch or build, then check, the local llama.cpp runtime")
    p.add_argument("action", choices=["build", "check", "info"])
    p.add_argument("--profile", help="CPU profile: x86-64-v3 (default where AVX2 is there), "
                   "x86-64-v2, generic")
    p.add_argument("--source", action="store_true",
                   help="build llama.cpp from source (minutes) even where the prebuilt server "
                   "runs (Linux x86-64 with AVX2); the same as RECURSA_RUNTIME=source")
    p.add_argument("--force", action="store_true", help="fetch or build again even if there")
    p.add_argument("--sdist", help="build from this copy of the pinned llama-cpp-python sdist "
                   "(checked against its SHA-256) instead of downloading it; implies --source")
    p.add_argument("--wheel", help="unpack this copy of the pinned xllamacpp wheel (checked "
                   "against its SHA-256) instead of downloading it")
    p.add_argument("--model", default="smollm2-135m",
                   help="model for `check` (registry name or .gguf path)")
    p.add_argument("--tokens", type=int, default=2, help="tokens `check` generates")
    p.set_defaults(fn=cmd_runtime)

