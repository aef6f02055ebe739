"""`make demo` on a slowed machine: one core, a busy loop beside it.

The demo is bounded by sub-calls and tokens, never by wall time, so it must answer right however
slow the machine is (a 170 s limit tuned on a fast machine once cut the map halfway on one half
as fast, and the demo answered "none"). Here the demo runs as a user runs it, in a process
pinned to CPU 0 (so recursa and llama-server see one core and size their threads for it), with
a busy loop pinned to the same core, on `make demo`'s own held-out seed, and its answer must be
right under the strict judge, as it is on an idle machine. It prints the wall time, which the README quotes beside the idle figure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.busy_core,
              pytest.mark.usefixtures("qwen")]
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is missing")
def test_the_demo_is_right_on_one_busy_core(tmp_path: Path):
    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        t0 = time.monotonic()
        p = subprocess.run(["taskset", "-c", "0", sys.executable, "examples/demo.py"],
                           cwd=REPO, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - t0
    finally:
        busy.kill()
        busy.wait()
    out = p.stdout
    print(out[-3000:])
    print(f"the demo on one busy core: {wall:.0f} s")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "plan label_count: at most" in p.stderr + out
    right = [ln for ln in out.splitlines() if ln.startswith("right:")]
    assert right and right[0].startswith("right:     yes"), out[-2000:]
    assert "status:    final" in out          # no limit cut it
