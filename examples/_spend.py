"""The lines every demo prints after its answer: turns, sub-calls, tokens, time and the trace."""

from __future__ import annotations

import time

from recursa import Result


def print_spend(res: Result, t0: float) -> None:
    """`t0`: the `time.monotonic()` the run started at."""
    tokens = sum(u.usage.total_tokens for u in res.usage.values())
    print(f"turns:     {res.turns}")
    print(f"sub-calls: {res.subcalls} (depth 1)")
    print(f"tokens:    {tokens:,} ("
          + ", ".join(f"{role} {u.usage.total_tokens:,}" for role, u in res.usage.items()) + ")")
    print(f"time:      {time.monotonic() - t0:.1f} s")
    print(f"trace:     {res.trace_path}  (view it: .venv/bin/recursa view {res.trace_path})")
