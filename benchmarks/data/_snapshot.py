"""What both rebuild scripts share: fetch a registry package (or take a local copy), check its
pinned SHA-256, and write a snapshot's records.jsonl.gz reproducibly."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from recursa.bench.realdata import DATA_DIR, RECORDS_FILE, SNAPSHOTS  # noqa: E402


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_bytes(url: str, pinned: str, local: str | None) -> bytes:
    """The package's bytes from ``local`` if given, else downloaded from ``url``; refused
    unless its SHA-256 is the pinned one."""
    if local:
        data = Path(local).read_bytes()
    else:
        with urllib.request.urlopen(url, timeout=60) as r:     # noqa: S310 (a fixed https URL)
            data = r.read()
    got = sha256(data)
    if got != pinned:
        raise SystemExit(f"{local or url}: SHA-256 {got}, pinned {pinned}; refusing to build")
    return data


def write_records(name: str, rows: list[dict[str, Any]], check: bool) -> str:
    """Write data/<name>/records.jsonl.gz (gzip mtime 0, so rebuilding gives the same bytes on
    the same zlib); return the SHA-256 of the uncompressed JSON Lines. With ``check``, write
    nothing and fail unless it equals the pin in recursa.bench.realdata.SNAPSHOTS."""
    raw = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    data = raw.encode("utf-8")
    digest = sha256(data)
    pinned = SNAPSHOTS[name].records_sha256
    print(f"{name}: {len(rows)} records, records.jsonl SHA-256 {digest}")
    if check:
        if digest != pinned:
            raise SystemExit(f"differs from the pinned {pinned}")
        print("matches the pinned snapshot")
        return digest
    out = DATA_DIR / name / RECORDS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {out}" + ("" if digest == pinned else
                            "  (NOT the pinned SHA-256: update SNAPSHOTS if this is on purpose)"))
    return digest


def parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--package", help="a local copy of the package instead of downloading it")
    p.add_argument("--check", action="store_true",
                   help="rebuild in memory and compare with the pinned snapshot; write nothing")
    return p
