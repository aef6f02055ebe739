"""No process-wide surprises: importing recursa changes nothing in the process, and what recursa
keeps running (spare workers, zygotes, watch and sweep threads) belongs to `recursa.base.background`,
whose `shutdown()` stops it all and after which runs start it again."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from recursa.sandbox.isolation import bwrap_works, find_bwrap

HAVE_BWRAP = bool(find_bwrap()) and bwrap_works(find_bwrap() or "")

# Records every exit handler and fork hook registered, and every thread started, while `IMPORTS`
# import; prints what recursa registered and the process state before and after.
_PROBE = textwrap.dedent("""
    import atexit, gc, json, os, signal, sys, threading, logging
    registered = []
    real_atexit, real_fork = atexit.register, os.register_at_fork
    def on_exit(fn, *a, **kw):
        registered.append(("atexit", getattr(fn, "__module__", None) or repr(fn)))
        return real_atexit(fn, *a, **kw)
    def on_fork(**kw):
        for fn in kw.values():
            registered.append(("fork", getattr(fn, "__module__", None) or repr(fn)))
        return real_fork(**kw)
    atexit.register, os.register_at_fork = on_exit, on_fork
    started = []
    real_start = threading.Thread.start
    def start(self):
        started.append(self.name)
        return real_start(self)
    threading.Thread.start = start
    def state():
        return {"gc": gc.isenabled(), "meta_path": [repr(f) for f in sys.meta_path],
                "threads": sorted(t.name for t in threading.enumerate()),
                "signals": [repr(signal.getsignal(s)) for s in
                            (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)],
                "root_handlers": len(logging.getLogger().handlers),
                "gc_threshold": list(gc.get_threshold())}
    before = state()
    import importlib, pkgutil
    names = IMPORTS
    if names == "ALL":     # every module of the package (the worker scripts run in a sandbox)
        import recursa
        names = [m.name for m in pkgutil.walk_packages(recursa.__path__, "recursa.")
                 if m.name not in ("recursa.sandbox.worker", "recursa.sandbox.zygote")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:    # an optional extra not installed here
            pass
    import recursa
    recursa.RLM, recursa.Result          # the lazily loaded names load
    after = state()
    print(json.dumps({"before": before, "after": after, "started": started,
                      "recursa_hooks": [r for r in registered
                                        if str(r[1]).startswith("recursa")]}))
""")

def _probe(imports: list[str] | str) -> dict:
    code = _PROBE.replace("IMPORTS", repr(imports))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("imports", [["recursa"], "ALL"], ids=["package", "every-module"])
def test_importing_recursa_changes_nothing_process_wide(imports: list[str] | str) -> None:
    r = _probe(imports)
    assert r["recursa_hooks"] == []                  # no exit handler, no fork hook
    assert r["started"] == []                        # no thread started
    assert r["after"] == r["before"]                 # gc on, same finders, threads, signals


def test_import_recursa_loads_only_the_package() -> None:
    code = ("import sys; import recursa; "
            "print(sorted(m for m in sys.modules if m.startswith(('recursa.', 'pydantic', "
            "'httpx'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_the_lazy_names_are_the_modules_own() -> None:
    import recursa
    from recursa import _EXPORTS
    from recursa.base.types import Result
    from recursa.core.rlm import RLM
    assert sorted(recursa.__all__) == sorted(_EXPORTS)
    assert recursa.RLM is RLM and recursa.Result is Result
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        recursa.nope  # noqa: B018


# A host that runs local sandboxes (zygote-forked and from the spare pool), shuts the background
# down, checks nothing of recursa's is left running, then runs again.
_HOST = textwrap.dedent("""
    import asyncio, hashlib, json, os, sys, threading
    from recursa.base import background
    from recursa.sandbox import LocalSandbox
    from recursa.sandbox.transport import descendants
    from recursa.base.types import ContextPayload

    def payload(tmp):
        path = os.path.join(tmp, "context.txt")
        with open(path, "w") as f:
            f.write("hello")
        raw = open(path, "rb").read()
        return ContextPayload(path=path, kind="text", sha256=hashlib.sha256(raw).hexdigest(),
                              size_bytes=len(raw))

    def ours():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("recursa-"))

    async def one_cell(tmp, **opts):
        sb = LocalSandbox(**opts)
        async def answer(kind, args):
            return None
        await sb.start(payload(tmp), answer)
        try:
            cell = await sb.run("len(context)", timeout=20, max_output_chars=1000)
            return cell.value
        finally:
            await sb.close()

    async def main(tmp):
        values = [await one_cell(tmp), await one_cell(tmp, zygote=False, prewarm=1)]
        return values

    tmp = sys.argv[1]
    values = asyncio.run(main(tmp))
    running = {"threads": ours(), "children": len(descendants(os.getpid()))}
    background.shutdown()
    stopped = {"threads": ours(), "children": len(descendants(os.getpid()))}
    again = asyncio.run(main(tmp))
    background.shutdown()
    print(json.dumps({"values": values, "again": again, "running": running,
                      "stopped": stopped, "end": {"threads": ours(),
                      "children": len(descendants(os.getpid()))}}))
""")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap not usable here")
def test_shutdown_stops_every_background_process_and_thread_and_runs_start_again(tmp_path):
    p = subprocess.run([sys.executable, "-c", _HOST, str(tmp_path)], capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["values"] == r["again"] == ["5", "5"]
    assert r["running"]["threads"] and r["running"]["children"] > 0   # zygote, spare, threads
    assert r["stopped"] == {"threads": [], "children": 0}
    assert r["end"] == {"threads": [], "children": 0}


def test_a_forked_child_drops_the_parents_parts_and_does_not_stop_them() -> None:
    code = textwrap.dedent("""
        import os, json
        from recursa.base.background import BACKGROUND
        stopped, forgotten = [], []
        class Part:
            def shutdown(self): stopped.append(os.getpid())
            def after_fork_in_child(self): forgotten.append(os.getpid())
        BACKGROUND.attach(Part(), 0)
        pid = os.fork()
        if pid == 0:
            BACKGROUND.shutdown()     # the child's own shutdown: the part was reset, not stopped
            os.write(1, (json.dumps({"child_forgot": forgotten == [os.getpid()],
                                     "child_stopped": stopped}) + "\\n").encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print(json.dumps({"parent_stopped_before_exit": stopped}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.split("\n") if x.strip()]
    assert lines[0]["child_forgot"] is True
    assert lines[1] == {"parent_stopped_before_exit": []}
