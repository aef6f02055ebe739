"""`llama-server`'s command line over the prebuilt xllamacpp library: the server process itself.

Run as a script, never imported by the host: `python -I prebuilt_server.py XLLAMACPP_DIR
[llama-server options]` (the launcher `prebuilt.py` writes does this). It reads the options
recursa passes to `llama-server` (and a few more a user may add with `LocalClient(server_args=)`),
sets the same fields of llama.cpp's `common_params` through xllamacpp, and runs llama.cpp's own
HTTP server (`xllamacpp.Server`) in this process until SIGTERM or SIGINT; it dies with the host
through the parent-death signal its launcher set, which exec keeps. An option it does not know
is an error naming it, not silently dropped. It imports nothing of recursa, so it starts in the
time Python and the library take to load.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

PROG = "llama-server (prebuilt xllamacpp)"


def _str(v: str) -> str:
    return v


def _hosts(v: str) -> list[str]:
    return [v]


_OPTIONS: list[tuple[tuple[str, ...], str, Callable[[str], Any]]] = [
    (("-m", "--model"), "model.path", _str),
    (("--host",), "hostnames", _hosts),        # a path ending in .sock: a Unix socket
    (("--port",), "port", int),
    (("-np", "--parallel"), "n_parallel", int),
    (("--kv-unified-per-slot",), "kv_unified_per_slot", int),
    (("-c", "--ctx-size"), "n_ctx", int),
    (("-t", "--threads"), "cpuparams.n_threads", int),
    (("-tb", "--threads-batch"), "cpuparams_batch.n_threads", int),
    (("-cram", "--cache-ram"), "cache_ram_mib", int),
    (("-b", "--batch-size"), "n_batch", int),
    (("-ub", "--ubatch-size"), "n_ubatch", int),
    (("-n", "--predict", "--n-predict"), "n_predict", int),
    (("-mm", "--mmproj"), "mmproj.path", _str),
    (("--chat-template",), "chat_template", _str),
]
# option -> (the field of common_params it sets, the converter of its value)
VALUED = {name: (field, conv) for names, field, conv in _OPTIONS for name in names}

FLAGS: dict[str, tuple[str, bool]] = {
    "--kv-unified": ("kv_unified", True), "-kvu": ("kv_unified", True),
    "--no-webui": ("ui", False),
    "--jinja": ("use_jinja", True), "--no-jinja": ("use_jinja", False),
    "--no-warmup": ("warmup", False),
    "--no-mmproj": ("no_mmproj", True),
}


class UsageError(ValueError):
    pass


def parse(argv: list[str]) -> list[tuple[str, Any]]:
    """The (field, value) settings `argv` asks for, in order; UsageError names an option this
    server does not support or a value that is not valid."""
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in FLAGS and not eq:
            out.append(FLAGS[name])
        elif name in VALUED:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise UsageError(f"{name} needs a value")
            field, conv = VALUED[name]
            try:
                out.append((field, conv(value)))
            except ValueError:
                raise UsageError(f"{name} {value!r}: not a valid value") from None
        else:
            raise UsageError(
                f"unsupported option {arg!r}: this prebuilt llama-server takes "
                f"{', '.join(sorted({*VALUED, *FLAGS}))}; use the source build for others "
                "(RECURSA_RUNTIME=source recursa runtime build)")
        i += 1
    return out


def _set(params: Any, field: str, value: Any) -> None:
    *path, last = field.split(".")
    obj = params
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)      # xllamacpp's nested structs are views of common_params


def configure(params: Any, settings: list[tuple[str, Any]], api_key: str | None) -> None:
    for field, value in settings:
        _set(params, field, value)
    if api_key:
        params.api_keys = [api_key]
    # what llama-server's main does: --kv-unified-per-slot without -c sizes the shared pool
    if params.kv_unified_per_slot > 0 and params.n_ctx == 0:
        params.n_ctx = params.n_parallel * params.kv_unified_per_slot


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(f"usage: {PROG}: prebuilt_server.py XLLAMACPP_DIR [options]", file=sys.stderr)
        return 2
    lib, opts = args[0], args[1:]
    try:
        settings = [] if opts[:1] == ["--version"] else parse(opts)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, lib)
    import xllamacpp

    if opts[:1] == ["--version"]:
        print(f"xllamacpp {xllamacpp.__version__} {xllamacpp.BUILD_INFO}")
        return 0
    params = xllamacpp.CommonParams()
    configure(params, settings, os.environ.get("LLAMA_API_KEY"))

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = xllamacpp.Server(params)   # loads the model, listens, serves in its threads
    except RuntimeError as e:               # llama.cpp logged why just before
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    stop.wait()
    del server                               # llama.cpp's own shutdown: stop, join, free
    return 0


if __name__ == "__main__":
    sys.exit(main())
