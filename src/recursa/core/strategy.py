"""How the root works: `code` (it writes code each turn), `plan` (it fills a typed plan the
runtime runs, recursa.core.strategies.plan) or `auto`, the default: the mode that works for the root
model in use. Light on purpose: choosing imports none of the planner's plan models."""

from __future__ import annotations

import re

STRATEGIES = ("code", "plan", "auto")
DEFAULT = "auto"

_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*b\b", re.I)
SMALL_B = 8        # a root of at most this many billion parameters plans


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    return strategy


def choose(strategy: str, root_model: str, *, code_tools: bool = False) -> tuple[str, str]:
    """The mode a run uses and why. `auto`: plan for small root models (a local model, or a
    name saying at most 8B parameters), which write poor free-form code but fill a typed plan
    well (a 1.5B in code mode answered "0" to a judged count whose answer was 83); code for
    the rest, and for any run with `code_tools` (MCP tools: only code calls them)."""
    if strategy != "auto":
        return strategy, "asked for"
    if code_tools:
        return "code", "auto: the run has MCP tools, which only code can call"
    name = root_model.lower()
    m = _SIZE.search(name)
    if name.startswith("local:"):
        return "plan", "auto: the root is a small local model"
    if m is not None and float(m.group(1)) <= SMALL_B:
        return "plan", f"auto: the root has {m.group(1)}B parameters"
    return "code", "auto: the root is a large model"
