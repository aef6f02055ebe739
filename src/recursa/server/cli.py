"""`recursa serve` (OpenAI-compatible HTTP API) and `recursa mcp` (MCP over stdio).

Registered by `recursa.cli` automatically; the heavy imports (starlette, uvicorn, mcp) happen only
when a command runs, so `recursa run` works without the `serve` extra.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from typing import Any

DEFAULT_MAX_SECONDS = 900.0   # a server should not let one request run forever


def _missing_extra(e: ImportError) -> int:
    from recursa.cli import err
    # the backslash keeps rich from reading [serve] as markup
    err.print(f"[red]error:[/] {e.name or e} is not installed: pip install 'recursa\\[serve]'")
    return 2


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def cmd_serve(a: argparse.Namespace) -> int:
    from recursa.cli import _limits, err, resolve_model
    try:
        from recursa.server.openai_app import ServerConfig, create_app, serve
    except ImportError as e:
        return _missing_extra(e)
    key = a.api_key or os.environ.get("RECURSA_SERVER_API_KEY") or None
    if not _is_loopback(a.host) and not key and not a.allow_no_auth:
        err.print(f"[red]error:[/] refusing to listen on {a.host} without --api-key: anyone "
                  "who can reach it could spend your model budget and run code in its "
                  "sandbox (pass --allow-no-auth to do it anyway)")
        return 2
    limits = _limits(a)
    limits.setdefault("max_seconds", DEFAULT_MAX_SECONDS)
    upstream = os.environ.get(a.api_key_env) if a.api_key_env else None
    if a.api_key_env and not upstream:
        err.print(f"[red]error:[/] --api-key-env {a.api_key_env}: that variable is not set")
        return 2
    try:
        cfg = ServerConfig(model=resolve_model(a), sub_model=a.sub_model, base_url=a.base_url,
                           sub_base_url=a.sub_base_url, sandbox=a.sandbox, limits=limits,
                           concurrency=a.concurrency, max_output_chars=a.max_output_chars,
                           trace_dir=a.trace_dir, api_key=key, upstream_api_key=upstream,
                           max_runs=a.max_runs,
                           max_request_bytes=int(a.max_request_mb * 1024 * 1024),
                           served_model=a.served_model_name,
                           allowed_sub_models=list(a.allow_sub_model or []),
                           progress=a.progress)
        app = create_app(cfg)
    except (ValueError, TypeError, OSError) as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    caps = ", ".join(f"{k}={v}" for k, v in sorted(limits.items()))
    err.print(f"recursa serve: model {_name(cfg.model)}, sub-model {_name(cfg.sub_model)}, "
              f"sandbox {a.sandbox}; caps {caps}; {a.max_runs} concurrent runs; "
              f"auth {'on' if key else 'OFF'}")
    err.print(f"OpenAI base URL: http://{a.host}:{a.port}/v1  (model name '{a.served_model_name}')")
    serve(app, host=a.host, port=a.port, log_level=a.log_level)
    return 0


def _name(spec: Any) -> str:
    return spec if isinstance(spec, str) or spec is None else getattr(spec, "name", "?")


def cmd_mcp(a: argparse.Namespace) -> int:
    try:
        from recursa.server.mcp_server import cmd_mcp as run_mcp
    except ImportError as e:
        return _missing_extra(e)
    return run_mcp(a)


def add_mcp_options(p: argparse.ArgumentParser) -> None:
    from recursa.cli import add_model_options
    add_model_options(p)
    p.add_argument("--root", help="only allow `path` arguments inside this directory")
    p.add_argument("--trace-dir", help="write one trace file per tool call into this directory")


def register(sub: Any) -> None:
    from recursa.cli import add_model_options
    s = sub.add_parser("serve", help="serve an RLM behind an OpenAI-compatible API",
                       description="Serve /v1/models and /v1/chat/completions. The upstream "
                       "provider's key comes from the usual environment variables; --api-key is "
                       "the key clients must present to *this* server.")
    add_model_options(s)
    s.add_argument("--host", default="127.0.0.1", help="interface (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="bearer token clients must send (or RECURSA_SERVER_API_KEY)")
    s.add_argument("--allow-no-auth", action="store_true",
                   help="allow a non-loopback --host without --api-key")
    s.add_argument("--max-runs", type=int, default=4,
                   help="concurrent runs; more requests get 429 (default 4)")
    s.add_argument("--max-request-mb", type=float, default=16.0,
                   help="largest request body, in MiB (default 16)")
    s.add_argument("--served-model-name", default="recursa",
                   help="the model id /v1/models lists (default 'recursa')")
    s.add_argument("--allow-sub-model", action="append", metavar="SPEC",
                   help="a sub-model requests may choose (repeatable; the configured one is "
                   "always allowed)")
    s.add_argument("--progress", choices=["reasoning", "field", "none"], default="reasoning",
                   help="how streaming shows progress (default: reasoning_content deltas)")
    s.add_argument("--trace-dir", help="write one trace file per request into this directory")
    s.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    s.set_defaults(fn=cmd_serve)

    m = sub.add_parser("mcp", help="run an MCP server (stdio) with an rlm_answer tool",
                       description="An MCP server over stdio exposing rlm_answer(question, "
                       "path=None, text=None, ...).")
    add_mcp_options(m)
    m.set_defaults(fn=cmd_mcp)
