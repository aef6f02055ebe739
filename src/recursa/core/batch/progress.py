"""What `recursa batch` shows while it runs: a rich progress bar (done / failed / rate / spend /
ETA) on stderr, one JSON line per item under `--events jsonl`, or nothing under `-q`."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


class BatchProgress:
    """Counts items as they finish and shows them in the chosen shape."""

    def __init__(self, total: int, *, mode: str = "rich", skipped: int = 0):
        self.total, self.mode, self.skipped = total, mode, skipped
        self.done = self.failed = self.cut = 0
        self.cost: float | None = 0.0
        self.tokens = 0
        self.t0 = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        if mode == "rich" and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            self._bar = Progress(TextColumn("[bold]batch[/]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("batch", total=total, info=self._info())

    def rate(self) -> float:
        """Items finished per minute so far."""
        dt = time.monotonic() - self.t0
        return 60.0 * self.done / dt if dt > 0 else 0.0

    def _info(self) -> str:
        spend = "cost ?" if self.cost is None else f"${self.cost:.4f}"
        cut = f"cut {self.cut}  " if self.cut else ""
        return (f"failed {self.failed}  {cut}{self.rate():.1f}/min  {spend}  "
                f"{self.tokens:,} tokens")

    def item(self, row: dict[str, Any], failed: bool, cut: bool = False) -> None:
        """One finished item; `cut`: a limit ended it with no answer (not done)."""
        self.done += 1
        self.failed += failed
        self.cut += cut
        c = row.get("cost_usd")
        self.cost = None if c is None or self.cost is None else self.cost + c
        self.tokens += int(row.get("tokens") or 0)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=self._info())
        elif self.mode == "jsonl":
            self._json("item", key=row["key"], index=row.get("index"), source=row.get("source"),
                       status=row.get("status"), failed=failed, cut=cut,
                       error=row.get("error"), limit=row.get("limit"),
                       cost_usd=c, tokens=row.get("tokens"), wall_s=row.get("wall_s"),
                       done=self.done, total=self.total, spend_usd=self.cost,
                       rate_per_min=round(self.rate(), 2))

    def _json(self, kind: str, **data: Any) -> None:
        sys.stderr.write(json.dumps({"kind": kind, **data}, default=str) + "\n")
        sys.stderr.flush()

    def close(self, summary: dict[str, Any]) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self.mode == "jsonl":
            self._json("summary", **summary)
