"""The command-line options of `recursa serve` and `recursa mcp` beyond the shared ones
(recursa.frontend.options). Standard library only: `recursa.server.cli` and `recursa.server.mcp_server`
both import it, and neither imports the other's module at import time."""

from __future__ import annotations

import argparse

from recursa.frontend.options import RLMOptions


def add_mcp_options(p: argparse.ArgumentParser) -> None:
    RLMOptions.add_to(p)
    p.add_argument("--root", help="only allow `path` arguments inside this directory")
    p.add_argument("--trace-dir", help="write one trace file per tool call into this directory")


def add_serve_options(p: argparse.ArgumentParser) -> None:
    RLMOptions.add_to(p)
    p.add_argument("--host", default="127.0.0.1", help="interface (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="bearer token clients must send (or "
                   "RECURSA_SERVER_API_KEY); without it a loopback server makes a random one "
                   "and prints it")
    p.add_argument("--no-token", "--allow-no-auth", dest="no_token", action="store_true",
                   help="no client key at all: anyone who can reach the address may use the "
                   "server (needed for a non-loopback --host without --api-key)")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="a Host name clients may use besides the bound address, e.g. the name "
                   "a reverse proxy forwards (repeatable; '*': any)")
    p.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                   help="a web origin whose pages may call the server, e.g. "
                   "http://localhost:3000 for a browser chat UI (repeatable; '*': any page)")
    p.add_argument("--max-runs", type=int, default=4,
                   help="concurrent runs; more requests get 429 (default 4)")
    p.add_argument("--max-request-mb", type=float, default=16.0,
                   help="largest request body, in MiB (default 16)")
    p.add_argument("--served-model-name", default="recursa",
                   help="the model id /v1/models lists (default 'recursa')")
    p.add_argument("--allow-sub-model", action="append", metavar="SPEC",
                   help="a sub-model requests may choose (repeatable; the configured one is "
                   "always allowed)")
    p.add_argument("--progress", choices=["reasoning", "field", "none"], default="reasoning",
                   help="how streaming shows progress (default: reasoning_content deltas)")
    p.add_argument("--trace-dir", help="write one trace file per request (per session: one "
                   "run per request) into this directory")
    p.add_argument("--sessions", type=int, default=16, metavar="N",
                   help="idle conversations kept with their sandbox, so a follow-up question "
                   "continues in it (least recently used closed first; 0: off; default 16)")
    p.add_argument("--session-ttl", type=float, default=600.0, metavar="S",
                   help="close a conversation's sandbox after S seconds unused (default 600)")
    p.add_argument("--header-timeout", type=float, default=15.0, metavar="S",
                   help="drop a client whose request headers take over S seconds to arrive "
                   "(slowloris; default 15)")
    p.add_argument("--body-timeout", type=float, default=60.0, metavar="S",
                   help="drop a client whose request body takes over S seconds to arrive "
                   "after its headers (default 60)")
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto",
                   help="event loop (default auto: uvloop when installed, as uvicorn picks)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
