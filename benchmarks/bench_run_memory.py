"""One memory cap per run (issue 35, item 3): the memory a run's ten children hold at once.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_run_memory.py [--children 10] [--mb 200]
        [--sandbox local|wasm]

A scripted root starts `--children` child runs in one `rlm_batch`; each child holds `--mb` MB
for 2 s and answers "ok". The run's `memory_mb` is `--cap` (512). Prints the peak of the
memory the kernel charged to the process's sandbox groups (sampled every 20 ms; with cgroups
only), the peak RSS summed over the sandbox processes (shared pages count once per process),
the wall time and the answer. Run it with another checkout first on PYTHONPATH to compare;
RECURSA_CGROUPS=0 shows the host watch instead of the kernel; `--sandbox wasm` (no cgroups:
the host watch of each wasm host process) counts the host processes' own memory too.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import threading
import time

from _common import TreeMemory


class GroupPeak:
    """Peak of the memory charged to the groups right under this process's cgroup parent."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        pattern = f"/sys/fs/cgroup/**/recursa-{os.getpid()}-*/*/memory.usage_in_bytes"
        while not self._stop.is_set():
            total = 0
            for f in glob.glob(pattern, recursive=True):
                try:
                    with open(f) as fh:
                        total += int(fh.read())
                except (OSError, ValueError):
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._t.join(5)
        return round(self.peak / 2**20, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=10)
    ap.add_argument("--mb", type=int, default=200, help="memory each child holds")
    ap.add_argument("--cap", type=int, default=512, help="the run's memory_mb")
    ap.add_argument("--sandbox", choices=["local", "wasm"], default="local")
    a = ap.parse_args()
    from recursa import RLM
    from recursa.models.replay import ReplayClient

    root = (f"r = rlm_batch([f'child {{i}}' for i in range({a.children})])\n"
            "FINAL(' | '.join(r))")
    child = (f"import time\nb = bytearray({a.mb} << 20)\nfor i in range(0, len(b), 4096):\n"
             "    b[i] = 1\ntime.sleep(2)\nFINAL('ok')")

    def respond(messages):
        if "persistent Python REPL" not in messages[0]["content"]:
            return "leaf"
        code = child if "child " in messages[1]["content"] else root
        return f"```repl\n{code}\n```"

    groups = GroupPeak()
    rss = TreeMemory(os.getpid(), interval=0.02).start()
    t0 = time.monotonic()
    res = RLM(model=ReplayClient(respond), sandbox=a.sandbox, max_depth=1, cell_timeout=120,
              sandbox_options={"memory_mb": a.cap}).completion("q", context="ctx")
    wall = time.monotonic() - t0
    rss.stop()
    rep = rss.report()
    ok = res.answer.split(" | ").count("ok")
    print(json.dumps({"sandbox": a.sandbox, "cap_mb": a.cap, "children": a.children, "child_mb": a.mb,
                      "peak_charged_mb": groups.stop(),
                      "peak_sandbox_rss_mb": round(rep["peak_tree_rss_mb"]
                                                   - rep["peak_host_rss_mb"], 1),
                      "wall_s": round(wall, 1), "status": res.status,
                      "children_ok": ok}))


if __name__ == "__main__":
    main()
