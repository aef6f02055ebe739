"""Faster imports for the `recursa` command's own process (cli.main): the garbage collector
paused while modules load, and httpx without the optional packages it would load eagerly but
the command never uses.

Only the command does this, in a process it owns: `import recursa` in a program changes
nothing process-wide (no import hook, the collector untouched, httpx as httpx has it).

Importing makes only objects that live as long as the process (modules, classes, functions), so
a garbage collection meanwhile finds nothing to free; pausing it makes the imports ~10 % faster.
A collector the program turned off stays off.

`httpx/__init__` imports its own command line (`click`, `pygments`, `rich.progress`, ~50 ms
here) whenever click is installed, and it is in most venvs (uvicorn, flask, black...); httpcore
imports `trio` when it is installed (for trio's locks: ~70 ms; selenium brings it) and `h2`
(HTTP/2 still works: httpcore imports its HTTP/2 code again when a connection needs it). The
command hides all three while httpx imports: `httpx.main` becomes httpx's "install httpx[cli]"
stub and httpcore cannot run under trio in that process, neither of which the command uses.
Measured in benchmarks/bench_startup.py.

Hiding is a finder at the front of sys.meta_path that answers "no such module" to the importing
thread only, for the duration of the import: other threads import these modules as usual, and
so does this one afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

COMMAND_UNUSED = ("click", "trio", "h2")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection inside the block (for imports); restored as it was after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def command_imports(*, http: bool = True, modules: Iterable[str] = ()) -> None:
    """What a command imports up front, with the collector paused: httpx without
    `COMMAND_UNUSED` (if the command speaks HTTP), then `modules`."""
    import importlib
    with gc_paused():
        if http:
            import_httpx(COMMAND_UNUSED)
        for m in modules:
            importlib.import_module(m)


def import_httpx(unused: Iterable[str] = COMMAND_UNUSED) -> None:
    """Import httpx and httpcore with the `unused` top-level packages hidden from them (a no-op
    once either is imported: then it is too late, and nothing is hidden). For the command's own
    process only."""
    if "httpx" in sys.modules or "httpcore" in sys.modules:
        return
    hider = _Hider({m for m in unused if m not in sys.modules})
    sys.meta_path.insert(0, hider)
    try:
        with gc_paused():
            import httpcore  # noqa: F401
            import httpx  # noqa: F401
    finally:
        sys.meta_path.remove(hider)


class _Hider:
    """A meta path finder: `names` (and their submodules) do not exist for one thread."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.thread = threading.get_ident()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.names and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"No module named {fullname!r} (not used by recursa)",
                                      name=fullname)
        return None
