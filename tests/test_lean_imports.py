"""recursa.frontend.lean_imports: in the `recursa` command's own process, httpx imported without the
packages the command never uses, hidden from the importing thread only, and the garbage
collector paused and restored around imports; the library itself leaves httpx as it is."""

from __future__ import annotations

import gc
import importlib.util
import json
import subprocess
import sys
import threading

import pytest

from recursa.frontend.lean_imports import _Hider, gc_paused


def _fresh(code: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(not _installed("click"), reason="click is not installed here")
def test_the_library_leaves_httpx_as_httpx_has_it() -> None:
    r = _fresh(
        "import sys, json\n"
        "finders = list(sys.meta_path)\n"
        "import recursa.models.openai_client\n"
        "import httpx, httpcore._synchronization as sync\n"
        "print(json.dumps({'finders_kept': sys.meta_path == finders,"
        " 'httpx_cli': 'httpx._main' in sys.modules, 'trio': sync.trio is not None}))")
    # httpx's own command and httpcore's trio support are there when installed
    assert r == {"finders_kept": True, "httpx_cli": True, "trio": _installed("trio")}


@pytest.mark.skipif(not (_installed("trio") and _installed("h2")), reason="trio/h2 not installed")
def test_the_command_hides_trio_and_h2_too_and_http2_still_works() -> None:
    r = _fresh(
        "import sys, json\n"
        "from recursa.frontend.lean_imports import COMMAND_UNUSED, import_httpx\n"
        "import_httpx(COMMAND_UNUSED)\n"
        "hidden = sorted(m for m in ('trio', 'h2', 'click') if m in sys.modules)\n"
        "import httpx, trio, h2\n"
        "from httpcore._async.http2 import AsyncHTTP2Connection\n"
        "httpx.AsyncClient(http2=True)\n"
        "print(json.dumps({'loaded_during': hidden, 'later': [trio.__name__, h2.__name__]}))")
    assert r == {"loaded_during": [], "later": ["trio", "h2"]}


def test_a_hidden_module_is_missing_for_the_hiding_thread_only() -> None:
    name = "json.tool"      # stdlib, so present everywhere; not imported by the test run
    sys.modules.pop(name, None)
    hider = _Hider({"json"})
    seen: dict[str, object] = {}

    def other() -> None:
        mod = importlib.import_module(name)
        seen["other"] = mod.__name__

    sys.meta_path.insert(0, hider)
    try:
        with pytest.raises(ModuleNotFoundError, match="json.tool"):
            importlib.import_module(name)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    finally:
        sys.meta_path.remove(hider)
    assert seen == {"other": "json.tool"}
    assert importlib.import_module(name).__name__ == "json.tool"


def test_gc_paused_restores_the_collector_as_it_was() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()   # a collector the program turned off stays off
    finally:
        gc.enable()
