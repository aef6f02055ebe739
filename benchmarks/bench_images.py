"""What images cost: preparing an image context, starting the sandbox with it, and a cell that
crops every image and sends each crop through llm_query (host handler answering at once).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_images.py [--images 20] [--side 512] [--reps 5]

Printed figures are medians over --reps, with a text context of the same payload size measured
side by side as the baseline for the sandbox start.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image as PILImage

from recursa.core import context as ctx
from recursa.sandbox.local import LocalSandbox


def noise_png(side: int, seed: int) -> bytes:
    im = PILImage.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


async def start_and_run(payload, code: str | None) -> tuple[float, float | None]:
    async def handler(kind, args):
        return ["ok"] * len(args.get("prompts", [])) if kind == "llm_batch" else "ok"
    sb = LocalSandbox(prewarm=0)
    t0 = time.perf_counter()
    await sb.start(payload, handler)
    cell = await sb.run("len(context)", timeout=60, max_output_chars=1000)   # first cell waits
    started = time.perf_counter() - t0
    ran = None
    if code:
        t1 = time.perf_counter()
        cell = await sb.run(code, timeout=120, max_output_chars=1000)
        ran = time.perf_counter() - t1
        assert cell.error is None, cell.error
    await sb.close()
    return started, ran


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--side", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    imgs = {f"img{i:03d}.png": noise_png(a.side, i) for i in range(a.images)}
    total = sum(len(b) for b in imgs.values())
    work = Path(tempfile.mkdtemp())
    prep_s = []
    for r in range(a.reps):
        t0 = time.perf_counter()
        prep = ctx.prepare(dict(imgs), work / f"p{r}")
        prep_s.append(time.perf_counter() - t0)
    text = ctx.prepare({k: "x" * (prep.payload.size_bytes // a.images) for k in imgs},
                       work / "text")
    half = a.side // 2
    code = (f"crops = [im.crop((0, 0, {half}, {half})) for _, im in list_images()]\n"
            "out = llm_batch(['what?'] * len(crops), images=crops)")
    img_start, txt_start, cell_s = [], [], []
    for _ in range(a.reps):
        s, c = asyncio.run(start_and_run(prep.payload, code))
        img_start.append(s)
        cell_s.append(c)
        s, _ = asyncio.run(start_and_run(text.payload, None))
        txt_start.append(s)
    med = statistics.median
    print(f"{a.images} PNG images {a.side}x{a.side}, {total / 1e6:.1f} MB; payload "
          f"{prep.payload.size_bytes / 1e6:.1f} MB (base64 in JSON); medians of {a.reps}")
    print(f"  prepare (headers, checks, payload write): {med(prep_s) * 1000:.0f} ms")
    print(f"  sandbox start + first cell, images:       {med(img_start) * 1000:.0f} ms")
    print(f"  sandbox start + first cell, text same size: {med(txt_start) * 1000:.0f} ms "
          f"(ratio {med(img_start) / med(txt_start):.2f})")
    print(f"  cell: crop {a.images} images to {half}x{half} + llm_batch with the crops: "
          f"{med(cell_s) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
