"""Runs the WebAssembly Python of the `wasm` sandbox under wasmtime: one worker incarnation.

A standalone program (``python -I wasm_host.py ...``) that imports nothing but wasmtime, so it
starts fast and never loads recursa. Its stdin/stdout are handed to the guest as the guest's
own stdin/stdout: the worker protocol passes straight through. What the guest can reach is
what WASI gives it and nothing more: the directories named with --dir (read-only unless
marked rw), the environment named with --env, no sockets (WASI preview 1 has none to open),
no processes, no signals; linear memory capped at --memory-mb (a failed grow is a
MemoryError inside the guest).

The module is compiled once per wasmtime version and kept beside the .wasm (`.cwasm`): a
compile takes ~15 s of CPU, loading the compiled file a few milliseconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from importlib.metadata import version

import wasmtime


def compiled(engine: wasmtime.Engine, wasm: str) -> wasmtime.Module:
    cwasm = f"{wasm}.wasmtime-{version('wasmtime')}.cwasm"
    if os.path.isfile(cwasm):
        try:
            return wasmtime.Module.deserialize_file(engine, cwasm)
        except wasmtime.WasmtimeError:
            pass   # made by another build of the same version: compile again
    module = wasmtime.Module.from_file(engine, wasm)
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(wasm), suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(module.serialize())
        os.replace(tmp, cwasm)   # atomic: a concurrent start reads the old or the whole new one
    except OSError as e:   # a read-only cache: every start compiles (slow, but it works)
        print(f"note: could not keep the compiled module ({e})", file=sys.stderr)
    return module


def die_with_parent(parent: int) -> None:
    """If recursa's process dies (even by SIGKILL) while the guest computes, nobody would read
    this process's output or stop it: the kernel kills it instead. Linux only (prctl); elsewhere
    this does nothing and the guest ends at its next read of the closed stdin."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):   # TypeError: CDLL(None) on Windows
        return
    if os.getppid() != parent:   # it died before the prctl
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="wasm_host.py")
    ap.add_argument("--wasm", required=True)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--memory-mb", type=int, default=None)
    ap.add_argument("--dir", action="append", default=[], metavar="HOST:GUEST[:rw]")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--parent", type=int, default=None, help="die with this process")
    ap.add_argument("args", nargs="*", help="the guest's argv after its program name")
    a = ap.parse_args(argv)
    if a.parent is not None:
        die_with_parent(a.parent)
    engine = wasmtime.Engine()
    module = compiled(engine, a.wasm)
    if a.compile_only:
        return 0
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["python", *a.args]
    wasi.env = [tuple(e.split("=", 1)) for e in a.env]
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    for spec in a.dir:
        rw = spec.endswith(":rw")
        host, _, guest = spec.removesuffix(":rw").rpartition(":")
        wasi.preopen_dir(host, guest, fs_mutable=rw)
    store = wasmtime.Store(engine)
    if a.memory_mb:
        store.set_limits(memory_size=a.memory_mb << 20)
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    instance = linker.instantiate(store, module)
    start = instance.exports(store)["_start"]
    assert isinstance(start, wasmtime.Func)
    try:
        start(store)
    except wasmtime.ExitTrap as e:
        return e.code
    except wasmtime.Trap as e:   # stack exhausted, out of bounds, unreachable: the guest died
        print(f"the WebAssembly Python trapped: {str(e).splitlines()[0]}", file=sys.stderr)
        return 70
    return 0


if __name__ == "__main__":
    sys.exit(main())
