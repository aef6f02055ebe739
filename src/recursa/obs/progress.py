"""A map's progress, read from its `combinator` events, for every view of a run.

`llm_map` and its siblings emit `combinator` start / update / end events; an update carries
`done`, `total`, `rate_per_s` and `eta_s` (recursa.core.combinators). The console, the notebook
line, `recursa chat` and the server's progress stream all show the newest open map the same way:

    llm_map 26/48 done · 0.31/s · ~71 s left
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recursa.base.types import Event


@dataclass
class MapState:
    op: str
    total: int
    done: int = 0
    rate_per_s: float | None = None
    eta_s: float | None = None

    def line(self) -> str:
        parts = [f"{self.op} {self.done}/{self.total} done"]
        if self.rate_per_s:
            parts.append(f"{self.rate_per_s:.2g}/s")
        if self.eta_s is not None and self.done < self.total:
            parts.append(f"~{_duration(self.eta_s)} left")
        return " · ".join(parts)


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s} s" if s < 90 else f"{s // 60} min {s % 60:02d} s"


class MapProgress:
    """The maps still running, from their events; `line()` is the newest one's progress."""

    def __init__(self) -> None:
        self.maps: dict[str, MapState] = {}

    def feed(self, ev: Event) -> bool:
        """Take one event; True when it changed what `line()` shows."""
        if ev.kind != "combinator":
            return False
        d: dict[str, Any] = ev.data
        if ev.phase == "start":
            self.maps[ev.id] = MapState(str(d.get("op", "map")), int(d.get("items", 0)))
        elif ev.phase == "update" and ev.id in self.maps:
            m = self.maps[ev.id]
            m.done = int(d.get("done", m.done))
            m.total = int(d.get("total", m.total))
            m.rate_per_s, m.eta_s = d.get("rate_per_s"), d.get("eta_s")
        elif ev.phase == "end":
            return self.maps.pop(ev.id, None) is not None
        else:
            return False
        return True

    def line(self) -> str:
        return next(reversed(self.maps.values())).line() if self.maps else ""
