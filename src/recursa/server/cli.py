"""`recursa serve` (OpenAI-compatible HTTP API) and `recursa mcp` (MCP over stdio).

Registered by `recursa.cli` automatically; the heavy imports (starlette, uvicorn, mcp) happen only
when a command runs, so `recursa run` works without the `serve` extra.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
from typing import Any

from recursa.server.args import add_mcp_options, add_serve_options

DEFAULT_MAX_SECONDS = 900.0   # a server should not let one request run forever


def _missing_extra(e: ImportError, command: str) -> int:
    from recursa.frontend.console import escape, stderr_console
    err = stderr_console()
    from recursa.base.extras import MissingExtra
    msg = str(e) if isinstance(e, MissingExtra) else str(
        MissingExtra("serve", f"recursa {command}", module=e.name or None))
    err.print(f"[red]error:[/] {escape(msg)}")
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
    from recursa.frontend.console import stderr_console
    err = stderr_console()
    from recursa.base.types import RecursaError
    from recursa.core.preflight import check_options
    from recursa.frontend.options import RLMOptions
    from recursa.frontend.options import plain_error as plain
    try:
        from recursa.server.openai_app import ServerConfig, create_app, serve
    except ImportError as e:
        return _missing_extra(e, "serve")
    from recursa.server.common import unconfined_on_network
    key = a.api_key or os.environ.get("RECURSA_SERVER_API_KEY") or None
    loopback = _is_loopback(a.host)
    if not loopback and not key and not a.no_token:
        err.print(f"[red]error:[/] refusing to listen on {a.host} without --api-key: anyone "
                  "who can reach it could spend your model budget and run code in its "
                  "sandbox (pass --no-token to do it anyway)")
        return 2
    refused = unconfined_on_network(a.sandbox, a.host, loopback)
    if refused:
        err.print(f"[red]error:[/] {refused}")
        return 2
    # Like Jupyter: a loopback server still gets a key, since every local user (and any
    # program) can reach loopback. It is printed below; --api-key fixes one, --no-token drops it.
    generated = None if key or a.no_token else secrets.token_urlsafe(24)
    key = key or generated
    try:
        opts = RLMOptions.from_args(a).with_default_model(
            say=lambda m: err.print(f"[yellow]{m}[/]"))
        check_options(opts, say=lambda m: err.print(f"[dim]{m}[/]"))
        # every run's configuration: the shared options (keys read once, from the variables
        # named), a time cap unless one was given, and this command's trace directory
        rlm_config = opts.config()
        if rlm_config.budget.max_seconds is None:
            rlm_config = rlm_config.replace(max_seconds=DEFAULT_MAX_SECONDS)
        if a.trace_dir:
            rlm_config = rlm_config.replace(trace_dir=a.trace_dir)
        from recursa.models import resolve_model  # aliases name their specs
        allowed = [resolve_model(s)[0] for s in a.allow_sub_model or []]
        for spec in allowed:         # a sub-model a request may pick must pass the checks too
            check_options(RLMOptions(**{**opts.to_dict(), "model": spec, "sub_model": None,
                                            "prices": opts.prices}))
        cfg = ServerConfig(rlm=rlm_config, api_key=key, max_runs=a.max_runs,
                           max_request_bytes=int(a.max_request_mb * 1024 * 1024),
                           served_model=a.served_model_name, allowed_sub_models=allowed,
                           progress=a.progress, sessions=a.sessions, session_ttl_s=a.session_ttl,
                           host=a.host, allow_hosts=list(a.allow_host or []),
                           allow_origins=list(a.allow_origin or []))
        app = create_app(cfg)
    except (RecursaError, ValueError, TypeError, OSError) as e:
        err.print(f"[red]error:[/] {plain(e)}")
        return 2
    caps = ", ".join(f"{k}={v}" for k, v in
                     sorted(cfg.rlm.budget.model_dump(exclude_unset=True).items()))
    models = cfg.rlm.models
    err.print(f"recursa serve: model {_name(models.model)}, sub-model {_name(models.sub_model)}, "
              f"sandbox {opts.sandbox}; route {opts.route}; caps {caps}; {a.max_runs} concurrent runs; "
              f"auth {'on' if key else 'OFF'}")
    err.print(f"OpenAI base URL: http://{a.host}:{a.port}/v1  (model name '{a.served_model_name}')")
    if generated:
        err.print(f"API key (clients send it as the OpenAI API key): {generated}")
        err.print("[dim]  (a new one each start: pass --api-key or RECURSA_SERVER_API_KEY to "
                  "keep one, --no-token for none)[/]")
    serve(app, host=a.host, port=a.port, log_level=a.log_level, loop=a.loop,
          header_timeout=a.header_timeout, body_timeout=a.body_timeout)
    return 0


def _name(spec: Any) -> str | None:
    return spec if isinstance(spec, str) or spec is None else getattr(spec, "name", "?")


def cmd_mcp(a: argparse.Namespace) -> int:
    try:
        from recursa.server.mcp_server import cmd_mcp as run_mcp
    except ImportError as e:
        return _missing_extra(e, "mcp")
    return run_mcp(a)


def register(sub: Any) -> None:
    s = sub.add_parser("serve", help="serve an RLM behind an OpenAI-compatible API",
                       description="Serve /v1/models and /v1/chat/completions. The upstream "
                       "provider's key comes from the usual environment variables (or "
                       "--api-key-env); --api-key is the key clients must present to *this* "
                       "server.")
    add_serve_options(s)
    s.set_defaults(fn=cmd_serve)

    m = sub.add_parser("mcp", help="run an MCP server (stdio) with an rlm_answer tool",
                       description="An MCP server over stdio exposing rlm_answer(question, "
                       "path=None, text=None, ...).")
    add_mcp_options(m)
    m.set_defaults(fn=cmd_mcp)
