"""An append-only JSONL file of keyed rows, durable per row: what makes a long run resumable.

Shared by `recursa batch`, `recursa bench run` and the env rollouts: each finished item is one
line, flushed and fsynced before anything else looks at it; the last row per key wins; a torn
last line (the process was killed mid-write) is cut off when the file is reopened.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from recursa.base.privatefiles import open_private, private_dir


class ResultsFile:
    """Append-only JSONL of rows: fsync per row, torn tail repaired on open, last row per key
    wins."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        private_dir(self.path.parent)
        self.rows: dict[str, dict[str, Any]] = {}
        self.skipped_lines = 0
        self._repair_and_load()
        # rows carry answers and errors (which may quote the context): owner-only
        self._f = open_private(self.path, "a")
        self._lock = threading.Lock()

    def _repair_and_load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            # killed mid-write: drop the partial line so the next row starts on a fresh line
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(cut)
            data = data[:cut]
            self.skipped_lines += 1
        for line in data.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                self.skipped_lines += 1
                continue
            if isinstance(row, dict) and "key" in row:
                self.rows[row["key"]] = row

    def done(self, retry_errors: bool = False) -> set[str]:
        return {k for k, r in self.rows.items()
                if not (retry_errors and r.get("status") == "error")}

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, default=str, ensure_ascii=False) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()
            os.fsync(self._f.fileno())
            self.rows[row["key"]] = row

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()
