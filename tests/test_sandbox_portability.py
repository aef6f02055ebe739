"""What the wasm sandbox's host-side code does off Linux, simulated on Linux: nothing here can
run on macOS or Windows in this CI, so these check only that the Linux-only calls are skipped
(not that the sandbox works there; docs/sandbox.md says what is untested and why)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from recursa.sandbox import transport

wasm_host = pytest.importorskip("recursa.sandbox.wasm_host", reason="needs recursa[wasm]")


def _no_cdll(*a: object, **k: object) -> object:
    raise AssertionError("die_with_parent must not load libc off Linux")


def test_die_with_parent_is_skipped_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes, "CDLL", _no_cdll)
    for platform in ("win32", "darwin"):
        monkeypatch.setattr(sys, "platform", platform)
        assert wasm_host.die_with_parent(os.getpid()) is None


def test_die_with_parent_survives_a_cdll_that_takes_no_none(monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows' ctypes.CDLL(None) raises TypeError; it must not end the host process.
    def cdll(name: object, **k: object) -> object:
        raise TypeError("expected str, bytes or os.PathLike object, not NoneType")
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.setattr(sys, "platform", "linux")
    assert wasm_host.die_with_parent(os.getpid()) is None


def test_kill_tree_without_process_groups_still_ends_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.delattr(os, "killpg")        # as on Windows
        monkeypatch.delattr(transport.signal, "SIGSTOP")
        transport.kill_tree(proc.pid)
        assert proc.wait(timeout=10) != 0
    finally:
        proc.kill()
        proc.wait()
