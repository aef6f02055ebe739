"""What confining the document parser costs, and what the hostile files of issue 35 cost the
host now (docs/documents.md, docs/security.md quote its output).

    .venv/bin/python tests/measure_parse.py [--runs 5] [--old-src DIR]

1. Overhead: a normal PDF, Word and Excel file (the test suite's, built from the bench corpora,
   and bigger ones) loaded with `recursa.documents.load` in each mode (RECURSA_DOCUMENT_SANDBOX:
   off = in the host as before, bwrap, limits), each mode in a fresh process: the first load
   (which imports the format's library) and the median of the next ones.
2. Hostile files: each loaded by a fresh host process that measures itself (helpers_hostile):
   seconds until the load ended, what it ended with, and the growth of the host's peak
   resident memory. `--old-src DIR` runs the same with another checkout's src/ first on the
   path (e.g. `git archive 0d6b732 src | tar -x -C /tmp/old`), capped at 4 GB and 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

LOAD = r"""
import json, sys, time
from recursa.documents import load
out = {}
for path in sys.argv[2:]:
    ts = []
    for _ in range(int(sys.argv[1])):
        t = time.perf_counter()
        load(path)
        ts.append(time.perf_counter() - t)
    out[path] = [ts[0], sorted(ts[1:])[len(ts[1:]) // 2] if len(ts) > 1 else ts[0]]
print(json.dumps(out))
"""


def overhead(d: Path, runs: int) -> None:
    import helpers_documents as h
    import helpers_hostile as hh
    t = h.texts()
    files = {"PDF, 4 pages": h.pdf(d / "report.pdf", t), "Word, 3 sections": h.docx(d / "notes.docx", t),
             "Excel, 2 sheets": h.xlsx(d / "book.xlsx", t),
             "Word, 20,000 paragraphs": hh.docx_paragraphs(d / "long.docx", 20_000)}
    modes = ["off", "bwrap", "limits"]
    got = {}
    for m in modes:
        p = subprocess.run([sys.executable, "-c", LOAD, str(runs), *map(str, files.values())],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "RECURSA_DOCUMENT_SANDBOX": m})
        got[m] = json.loads(p.stdout)
    print(f"load average {os.getloadavg()[0]:.1f}; seconds: first load / median of the next "
          f"{runs - 1}")
    print(f"{'file':26}" + "".join(f"{m:>18}" for m in modes))
    for label, path in files.items():
        cells = "".join(f"{got[m][str(path)][0]:8.3f} /{got[m][str(path)][1]:7.3f}  "
                        for m in modes)
        print(f"{label:26}{cells}")


def hostile(d: Path, old_src: str | None) -> None:
    import helpers_hostile as hh
    cases = [("load", hh.sqlite_generated(d / "gen.sqlite")),
             ("load", hh.sqlite_huge_value(d / "value.sqlite")),
             ("load", hh.xlsx_shared_string(d / "shared.xlsx")),
             ("load", hh.docx_bomb(d / "bomb.docx")),
             ("load", hh.docx_wide_table(d / "wide.docx")),
             ("load", hh.docx_paragraphs(d / "long.docx", 60_000)),
             ("load", hh.tar_gz_bomb(d / "bomb.tar.gz")),
             ("prepare", hh.folder_gitignore_dev_zero(d / "zero")),
             ("prepare", hh.folder_with_fifos(d / "fifos"))]
    cases.append(("inner", d / "fifos" / "pipe.txt"))
    runs = [("now", {})] + ([("old", {"PYTHONPATH": old_src})] if old_src else [])
    print(f"load average {os.getloadavg()[0]:.1f}")
    for label, env in runs:
        for how, path in cases:
            w = Path(tempfile.mkdtemp(dir=d))
            r = hh.measure_host(how, path, None if how == "load" else w, timeout=60, env=env)
            end = "ok" if r["ok"] else str(r.get("error"))[:110]
            print(f"{label:4} {how:8} {path.name:14} {path.stat().st_size if path.is_file() else 0:>9,} B"
                  f" {r['seconds']:7.2f} s  host +{r['rss_growth_mb']:6.0f} MB  {end}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--old-src", help="another checkout's src/ to measure the hostile files with")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overhead(Path(tmp), a.runs)
        (Path(tmp) / "h").mkdir()
        hostile(Path(tmp) / "h", a.old_src)


if __name__ == "__main__":
    main()
