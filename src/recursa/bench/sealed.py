"""A sealed test split: test seeds are drawn once, logged, and each (task, length, method,
model) cell runs on them once.

The log (docs/bench/sealed-seeds.json) is JSON with two lists:

- ``draws``: when a block of fresh test seeds was drawn, for which tasks and lengths, and the
  commit the checkout was at. A new block always starts above every seed logged before (and at
  1000 or more), so fresh seeds are never ones a test trace was read for.
- ``runs``: each `bench run --sealed` start: the cell (task, length, method, model), its seeds,
  the commit that ran it (`git describe --dirty`), the results directory and the time.

`check_run` refuses a run whose test seeds were not drawn in the log, or whose cell already ran
on any of these seeds, unless it resumes the same results directory at the same commit. A
change made after reading a test trace therefore needs `recursa bench seeds draw` first, and a
run with `--seed` set to the new block. The no-model baselines are pure functions of the code and
are not sealed (their rows are re-derived freely); everything else is.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

FIRST_TEST_SEED = 1000
BLOCK = 100              # new blocks start at a multiple of this, above every logged seed


class SealedError(ValueError):
    """A run the sealed log forbids."""


def load_log(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        return {"draws": [], "runs": []}
    log = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(log, dict) or not isinstance(log.get("draws"), list) \
            or not isinstance(log.get("runs"), list):
        raise SealedError(f"{p} is not a sealed-seeds log (expected draws and runs lists)")
    return log


def save_log(path: str | Path, log: dict[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _seeds(entry: dict[str, Any]) -> set[int]:
    return set(range(int(entry["seed"]), int(entry["seed"]) + int(entry["n"])))


def next_free_seed(log: dict[str, Any]) -> int:
    used = [s for e in log["draws"] + log["runs"] for s in _seeds(e)]
    top = max([FIRST_TEST_SEED - 1, *used])
    return (top // BLOCK + 1) * BLOCK


def draw_seeds(path: str | Path, tasks: list[str], lengths: list[int], n: int, commit: str,
               note: str = "") -> dict[str, Any]:
    """Log a fresh block of ``n`` test seeds for these tasks and lengths; returns the entry."""
    if n < 1:
        raise SealedError("draw at least one seed")
    log = load_log(path)
    entry = {"seed": next_free_seed(log), "n": n, "tasks": sorted(tasks),
             "lengths": sorted(lengths), "drawn_at": _now(), "commit": commit, "note": note}
    log["draws"].append(entry)
    save_log(path, log)
    return entry


def _cells(specs: list[dict[str, Any]]) -> dict[tuple[str, int, str, str], set[int]]:
    from .baselines import BASELINE_MODEL
    cells: dict[tuple[str, int, str, str], set[int]] = {}
    for s in specs:
        cfg = s["config"]
        if cfg.get("model") == BASELINE_MODEL:
            continue
        from .methods import MethodConfig
        label = MethodConfig.model_validate(cfg).label
        cells.setdefault((s["task"], int(s["length"]), label, cfg.get("model") or ""),
                         set()).add(int(s["seed"]))
    return cells


def check_run(path: str | Path, specs: list[dict[str, Any]], out: str, commit: str) -> None:
    """Raise SealedError unless every sealed cell's seeds were drawn for it and none of them
    ran before (a resume of the same results directory at the same commit is allowed)."""
    log = load_log(path)
    problems = []
    for (task, length, method, model), seeds in sorted(_cells(specs).items()):
        drawn: set[int] = set()
        for d in log["draws"]:
            if task in d["tasks"] and length in d["lengths"]:
                drawn |= _seeds(d)
        if missing := seeds - drawn:
            problems.append(f"{task} {length} {method}: seeds {_span(missing)} were not drawn "
                            f"for it in {path}")
            continue
        for r in log["runs"]:
            if (r["task"], r["length"], r["method"], r["model"]) != (task, length, method, model):
                continue
            if (again := seeds & _seeds(r)) and (r["out"], r["commit"]) != (out, commit):
                problems.append(
                    f"{task} {length} {method} ({model}) already ran on test seeds "
                    f"{_span(again)} at {r['commit']} ({r['started_at']}, {r['out']})")
    if problems:
        raise SealedError(
            "the sealed test split refuses this run:\n  " + "\n  ".join(problems) + "\n"
            f"Draw fresh seeds (recursa bench seeds draw --task ... --lengths ... -n N --log "
            f"{path}) and run with --seed set to the block it prints.")


def record_run(path: str | Path, specs: list[dict[str, Any]], out: str, commit: str) -> None:
    """Log the sealed cells of this run as started (before any instance runs, so a crash is
    logged too)."""
    log = load_log(path)
    for (task, length, method, model), seeds in sorted(_cells(specs).items()):
        known = any((r["task"], r["length"], r["method"], r["model"], r["out"], r["commit"])
                    == (task, length, method, model, out, commit) and seeds <= _seeds(r)
                    for r in log["runs"])
        if not known:
            log["runs"].append({"task": task, "length": length, "method": method,
                                "model": model, "seed": min(seeds), "n": len(seeds),
                                "commit": commit, "out": out, "started_at": _now()})
    save_log(path, log)


def _span(seeds: set[int]) -> str:
    s = sorted(seeds)
    return f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0])
