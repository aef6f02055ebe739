"""An append-only JSONL file of keyed rows, durable per row: what makes a long run resumable.

Shared by `recursa batch`, `recursa bench run` and the env rollouts: each finished item is one
line, flushed and fsynced before anything else looks at it; the last row per key wins; a torn
last line (the process was killed mid-write) is cut off when the file is reopened.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recursa.base.privatefiles import open_private, private_dir


class RowsFileError(ValueError):
    """A row of a rows file that cannot be trusted, by file and line."""

    def __init__(self, path: Path, line: int, problem: str):
        super().__init__(f"{path}, line {line}: {problem}. The rows file records which items "
                         f"are done; fix or delete that line, or write to a new --out")
        self.path, self.line, self.problem = path, line, problem


class ResultsFile:
    """Append-only JSONL of rows: fsync per row, torn tail repaired on open, last row per key
    wins."""

    def __init__(self, path: str | Path, *, check: Callable[[Any], str | None] | None = None):
        """`check(row)`: what is wrong with a row read back (None: nothing); a row it names
        stops the load with a RowsFileError naming the file and the line."""
        self.path = Path(path)
        private_dir(self.path.parent)
        self.rows: dict[str, dict[str, Any]] = {}
        self.skipped_lines = 0
        self._check = check
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
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                if self._check is not None:
                    raise RowsFileError(self.path, n, "it is not valid JSON") from None
                self.skipped_lines += 1
                continue
            problem = self._check(row) if self._check is not None else None
            if problem:
                raise RowsFileError(self.path, n, problem)
            if isinstance(row, dict) and isinstance(row.get("key"), str):
                self.rows[row["key"]] = row

    def done(self, retry_errors: bool = False,
             redo: Callable[[dict[str, Any]], bool] | None = None) -> set[str]:
        """Keys with a row, but for failed rows (`retry_errors`) and those `redo` names."""
        return {k for k, r in self.rows.items()
                if not (retry_errors and r.get("status") == "error")
                and not (redo is not None and redo(r))}

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
