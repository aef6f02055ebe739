"""Benchmark: the wasm sandbox beside `local`, in one run, sides interleaved.

    .venv/bin/python benchmarks/bench_wasm.py                 # 15 starts, 200 cells per side
    .venv/bin/python benchmarks/bench_wasm.py --starts 5 --cells 50 --sides wasm,local,limits

Per side (make_sandbox(kind) as shipped), each figure a median:
  start      start() to a worker ready with a 100 KB context loaded, then close() (not counted)
  empty cell run("pass"): the round trip of one cell through the protocol
  sub-call   a cell making one llm_query, answered at once by the host: the bridge's cost
  compute    a cell summing range(10**6) in Python: the interpreter's own speed
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from recursa.base.types import ContextPayload
from recursa.sandbox import make_sandbox

CELLS = {"empty cell": "pass", "sub-call": "x = llm_query('hi')",
         "compute": "s = sum(range(10 ** 6))"}


async def handler(kind: str, args: dict[str, Any]) -> Any:
    return ["ok"] * len(args.get("prompts", [])) if kind == "llm_batch" else "ok"


async def one_side(kind: str, payload: ContextPayload, cells: int) -> dict[str, float]:
    t0 = time.perf_counter()
    sb = make_sandbox(kind)
    await sb.start(payload, handler)
    out = {"start": time.perf_counter() - t0}
    try:
        for name, code in CELLS.items():
            times = []
            for _ in range(cells if name != "compute" else max(3, cells // 20)):
                t = time.perf_counter()
                cell = await sb.run(code, timeout=60, max_output_chars=1000)
                times.append(time.perf_counter() - t)
                if cell.error:
                    raise RuntimeError(f"{kind}: {cell.error}")
            out[name] = statistics.median(times)
    finally:
        await sb.close()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sides", default="wasm,local")
    ap.add_argument("--starts", type=int, default=15)
    ap.add_argument("--cells", type=int, default=200)
    a = ap.parse_args()
    sides = a.sides.split(",")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("lorem ipsum " * 8500)
    payload = ContextPayload(path=f.name, kind="text", sha256="", size_bytes=os.path.getsize(f.name))
    try:
        for kind in sides:   # warm-up: compiled module in the page cache, zygote started
            await one_side(kind, payload, 3)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
        for i in range(a.starts):
            for kind in sides:
                runs[kind].append(await one_side(kind, payload, a.cells if i == 0 else 3))
    finally:
        os.unlink(f.name)
    print(f"medians; {a.starts} starts per side, {a.cells} cells of each kind "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(f"{'side':8} {'start':>9} {'empty cell':>11} {'sub-call':>10} {'compute':>10}")
    for kind in sides:
        starts = statistics.median(r["start"] for r in runs[kind])
        first = runs[kind][0]
        print(f"{kind:8} {starts * 1000:7.0f}ms {first['empty cell'] * 1000:9.2f}ms "
              f"{first['sub-call'] * 1000:8.2f}ms {first['compute'] * 1000:8.0f}ms")


if __name__ == "__main__":
    asyncio.run(main())
