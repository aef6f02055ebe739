"""A worker that floods the protocol: the host's resident memory and event-loop stall.

Model-written code in the real local sandbox finds the worker's private protocol descriptors
and writes frames of its own (docs/security.md, "Frames from the worker"):

  nested      one 16 MiB frame of empty objects during a cell (parses to ~25x its size)
  after-cell  40 frames of 1 MiB (empty objects) from a thread after its cell returned; the
              host stays idle 3 s, then runs the next cell
  calls       12 calls of 8 MiB each from 12 threads, the handler holding each 2 s

For each: the host's peak RSS above its level before (sampled every 5 ms from a thread), the
longest gap of a 5 ms ticker on the event loop, and how the run ended. Another sandbox runs
cells alongside the whole time; its slowest cell is printed too.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_frame_flood.py [--only nested ...]

Set RECURSA_BENCH_SRC to another checkout's src/ to measure it instead (the figures before).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("RECURSA_BENCH_SRC",
                                  str(Path(__file__).resolve().parents[1] / "src")))

from recursa.base.types import ContextPayload  # noqa: E402
from recursa.sandbox import LocalSandbox  # noqa: E402

FORGE = (
    "import gc, json, os, struct, threading, time\n"
    "ch = [o for o in gc.get_objects() if type(o).__name__ == '_Channel'][0]\n"
    "def raw(body):\n"
    "    data = struct.pack('>I', len(body)) + body\n"
    "    with ch._wlock:\n"
    "        view = memoryview(data)\n"
    "        while view:\n"
    "            view = view[os.write(ch.wfd, view):]\n"
)
NESTED = FORGE + (
    "raw(b'{\"type\": \"call\", \"id\": \"c9\", \"kind\": \"llm\", \"args\": {\"p\": ['"
    " + b'{},' * ((16 << 20) // 3 - 40) + b'{}]}}')\n"
    "time.sleep(3)\n")
AFTER_CELL = FORGE + (
    "def flood():\n"
    "    time.sleep(0.2)\n"
    "    body = b'{\"type\": \"pong\", \"pad\": [' + b'{},' * ((1 << 20) // 3 - 20) + b'{}]}'\n"
    "    for _ in range(40):\n"
    "        raw(body)\n"
    "threading.Thread(target=flood, daemon=True).start()\n")
CALLS = ("import threading\n"
         "ts = [threading.Thread(target=lambda: llm_query('p' * (8 << 20)))"
         " for _ in range(12)]\n"
         "[t.start() for t in ts]; [t.join() for t in ts]\n")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Probe:
    """Peak RSS (a sampling thread) and the longest event-loop gap (a 5 ms ticker)."""

    def __init__(self) -> None:
        self.base = rss_mb()
        self.peak = self.base
        self.gap = 0.0
        self._stop = threading.Event()

    async def __aenter__(self) -> Probe:
        threading.Thread(target=self._sample, daemon=True).start()
        self._tick = asyncio.create_task(self._ticker())
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mb())

    async def _ticker(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            self.gap = max(self.gap, now - last - 0.005)
            last = now

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        self._tick.cancel()


async def handler(kind: str, args: dict[str, Any]) -> Any:
    await asyncio.sleep(2)
    return "ok"


async def scenario(name: str, payload: ContextPayload) -> str:
    attacked, other = LocalSandbox(), LocalSandbox()
    await attacked.start(payload, handler)
    await other.start(payload, handler)
    slowest = 0.0
    stop = asyncio.Event()

    async def alongside() -> None:
        nonlocal slowest
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            cell = await other.run(f"print({i})", timeout=30, max_output_chars=1000)
            slowest = max(slowest, time.perf_counter() - t)
            assert cell.stdout == f"{i}\n", cell
            i += 1
            await asyncio.sleep(0.05)

    try:
        await attacked.run("x = 1", timeout=10, max_output_chars=1000)
        side = asyncio.create_task(alongside())
        async with Probe() as probe:
            try:
                if name == "nested":
                    cell = await attacked.run(NESTED, timeout=30, max_output_chars=1000)
                elif name == "after-cell":
                    await attacked.run(AFTER_CELL, timeout=30, max_output_chars=1000)
                    await asyncio.sleep(3)
                    cell = await attacked.run("print('next')", timeout=30,
                                              max_output_chars=1000)
                else:
                    cell = await attacked.run(CALLS, timeout=120, max_output_chars=1000)
                outcome = "accepted" + (f" ({cell.error.splitlines()[-1][:60]})"
                                        if cell.error else "")
            except Exception as exc:   # the fix: SandboxError, the run ends
                outcome = f"{type(exc).__name__}: {str(exc)[:70]}"
            await asyncio.sleep(0.3)
        stop.set()
        await side
    finally:
        await attacked.close()
        await other.close()
    return (f"{name:<11} {probe.peak - probe.base:>9.0f} {probe.gap * 1000:>10.0f} "
            f"{slowest * 1000:>12.0f}  {outcome}")


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", default=["nested", "after-cell", "calls"])
    a = ap.parse_args()
    import recursa
    print(f"recursa from {Path(recursa.__file__).parent}")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "ctx.txt")
        path.write_text("the context")
        raw = path.read_bytes()
        payload = ContextPayload(path=str(path), kind="text",
                                 sha256=hashlib.sha256(raw).hexdigest(), size_bytes=len(raw))
        print(f"{'scenario':<11} {'+RSS MB':>9} {'stall ms':>10} {'other cell ms':>12}  outcome")
        for name in a.only:
            print(await scenario(name, payload), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
