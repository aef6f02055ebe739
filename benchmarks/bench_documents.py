"""What reading documents as contexts costs: pages (or rows) per second and peak memory of the
host, for a big PDF and a big CSV (and an XLSX), each read the two ways recursa reads them:

- `prepare`: what `recursa run --context FILE` and RLM.completion(context=Path(FILE)) do: the
  document is streamed into the sandbox's payload file, a page / a few thousand rows at a time;
- `load`: recursa.documents.load(FILE), the whole Document in memory (its text held once).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_documents.py [--pages 2000] [--csv-mb 200]

The files are generated offline first (fpdf2 writes the PDF from the bench corpora's real text;
the CSV's rows quote that text too). Each measurement runs in a fresh process, so its peak
resident memory (VmHWM) is its own; "above start" subtracts the process's memory after imports.
Needs the docs extra and fpdf2 (dev extra).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def vmhwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def paragraphs() -> list[str]:
    from recursa.bench.corpora import get_corpus
    return [p for p in get_corpus().paragraphs if p.isascii() and 200 < len(p) < 1500]


def make_pdf(path: Path, pages: int, unique: int = 100) -> None:
    """`unique` pages of real text set by fpdf2 (slow: ~10 pages/s here), then copied by PDFium
    up to `pages` (a real 2,000-page file whose pages repeat every `unique`)."""
    import pypdfium2 as pdfium
    from fpdf import FPDF
    paras = paragraphs()
    doc = FPDF()
    doc.set_font("Helvetica", size=9)
    for i in range(min(unique, pages)):
        doc.add_page()
        for k in range(3):
            doc.multi_cell(0, 4, paras[(3 * i + k) % len(paras)][:900], new_x="LMARGIN",
                           new_y="NEXT")
    seed = path.with_suffix(".seed.pdf")
    doc.output(str(seed))
    src = pdfium.PdfDocument(str(seed))
    out = pdfium.PdfDocument.new()
    while len(out) < pages:
        n = min(len(src), pages - len(out))
        out.import_pages(src, pages=list(range(n)))
    out.save(str(path))
    out.close()
    src.close()
    seed.unlink()


def make_csv(path: Path, mb: int) -> int:
    paras = paragraphs()
    target = mb * 1024 * 1024
    n = 0
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "title", "score", "text"])
        while f.tell() < target:
            p = paras[n % len(paras)]
            w.writerow([n, p[:40], n % 97, p])
            n += 1
    return n


def make_xlsx(path: Path, rows: int) -> None:
    import openpyxl
    paras = paragraphs()
    wb = openpyxl.Workbook(write_only=True)
    ws = wb.create_sheet("data")
    ws.append(["id", "title", "score", "text"])
    for n in range(rows):
        p = paras[n % len(paras)]
        ws.append([n, p[:40], n % 97, p[:300]])
    wb.save(str(path))


def child(mode: str, file: str) -> None:
    """One measurement in this fresh process; prints a JSON line."""
    from recursa.core import context as ctx
    from recursa.documents import load
    start_mb = vmhwm_mb()
    t0 = time.perf_counter()
    if mode == "prepare":
        with tempfile.TemporaryDirectory() as d:
            prep = ctx.prepare(Path(file), Path(d))
            chars, payload = prep.chars, prep.payload.size_bytes
            desc, parts = prep.description, -1
    elif mode == "sandbox":
        import asyncio

        from recursa.sandbox.local import LocalSandbox

        async def handler(kind: str, args: dict) -> str:
            return "ok"

        async def go() -> tuple[str, float]:
            with tempfile.TemporaryDirectory() as d:
                prep = ctx.prepare(Path(file), Path(d))
                sb = LocalSandbox(prewarm=0)
                await sb.start(prep.payload, handler)
                t1 = time.perf_counter()
                cell = await sb.run(
                    "print(len(context), len(context.parts), [l for l in open("
                    "'/proc/self/status') if l.startswith('VmHWM')][0].split()[1])",
                    timeout=600, max_output_chars=1000)
                await sb.close()
                return cell.stdout, time.perf_counter() - t1
        out, first = asyncio.run(go())
        chars, parts, worker_kb = (int(x) for x in out.split())
        payload, desc = 0, f"worker peak {worker_kb / 1024:.0f} MB; first cell {first:.2f} s"
    else:
        doc = load(file)
        chars, payload, desc = len(doc), 0, ""
        parts = len(doc.parts)
    secs = time.perf_counter() - t0
    peak = vmhwm_mb()
    print(json.dumps({"mode": mode, "file": os.path.basename(file), "secs": secs,
                      "chars": chars, "payload_bytes": payload, "peak_mb": peak,
                      "start_mb": start_mb, "parts": parts, "desc": desc}))


def measure(mode: str, file: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(file)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--csv-mb", type=int, default=200)
    ap.add_argument("--xlsx-rows", type=int, default=50_000)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    with tempfile.TemporaryDirectory(prefix="recursa-bench-docs-") as d:
        work = Path(d)
        t0 = time.perf_counter()
        pdf = work / "big.pdf"
        make_pdf(pdf, a.pages)
        print(f"generated {pdf.name}: {a.pages:,} pages, {pdf.stat().st_size / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        big = work / "big.csv"
        rows = make_csv(big, a.csv_mb)
        print(f"generated {big.name}: {rows:,} rows, {big.stat().st_size / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        xl = work / "big.xlsx"
        make_xlsx(xl, a.xlsx_rows)
        print(f"generated {xl.name}: {a.xlsx_rows:,} rows, {xl.stat().st_size / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.1f} s")
        units = {"big.pdf": (a.pages, "pages"), "big.csv": (rows, "rows"),
                 "big.xlsx": (a.xlsx_rows, "rows")}
        print(f"\n{'file':<10} {'mode':<8} {'secs':>7} {'units/s':>12} {'MB/s':>7} "
              f"{'text MB':>8} {'peak MB':>8} {'above start':>11}")
        for f in (pdf, big, xl):
            for mode in ("prepare", "load", "sandbox"):
                r = measure(mode, f)
                n, unit = units[f.name]
                print(f"{f.name:<10} {mode:<8} {r['secs']:7.2f} "
                      f"{n / r['secs']:9,.0f} {unit:<4}"
                      f"{f.stat().st_size / 1e6 / r['secs']:6.1f} {r['chars'] / 1e6:8.1f} "
                      f"{r['peak_mb']:8.0f} {r['peak_mb'] - r['start_mb']:11.0f}"
                      + (f"   (host; {r['desc']})" if mode == "sandbox" else ""))


if __name__ == "__main__":
    main()
