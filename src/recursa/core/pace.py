"""Pace: how fast model calls go on this machine, measured from the calls a run has made.

A plan knows its bound in calls and tokens before it starts; with a time limit set, the run asks
the pace how long that bound takes here, and refuses work it would have to abandon. The pace is
measured, never assumed: the same plan takes twice as long on a machine half as fast.

Two ways a call's time is known:
- a server that reports its own timings (llama.cpp: prompt tokens read, reply tokens written,
  and the time each took) gives the machine's prefill and decode rates. A local server shares
  one CPU among its slots, so a map's calls add up: tokens / rate, summed.
- otherwise (hosted APIs) the calls' wall latencies: a map's calls run `concurrency` at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from recursa.base.types import Completion


@dataclass
class _Rates:
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    output_tokens: int = 0
    output_s: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def add(self, comp: Completion) -> None:
        t = comp.timing
        if t is not None:
            self.prompt_tokens += t.prompt_tokens
            self.prompt_s += t.prompt_s
            self.output_tokens += t.output_tokens
            self.output_s += t.output_s
        elif not comp.cached and comp.latency_s > 0:
            self.latencies.append(comp.latency_s)


class Pace:
    """What the calls of each model took so far in this run tree (`record` after each call)."""

    def __init__(self) -> None:
        self._by_model: dict[str, _Rates] = {}

    def record(self, model: str, comp: Completion) -> None:
        self._by_model.setdefault(model, _Rates()).add(comp)

    def rates(self, model: str) -> tuple[float, float] | None:
        """(prompt tokens / s, reply tokens / s) measured from a server's own timings, or None
        before any call of `model` reported them."""
        r = self._by_model.get(model)
        if r is None or r.prompt_s <= 0 or r.prompt_tokens < 32:
            return None
        decode = r.output_tokens / r.output_s if r.output_s > 0 and r.output_tokens else None
        prefill = r.prompt_tokens / r.prompt_s
        return prefill, decode or prefill / 8

    def seconds(self, model: str, *, calls: int, input_tokens: int, output_tokens: int,
                concurrency: int) -> float | None:
        """How long `calls` calls of `model` holding these tokens in all take here, or None
        when nothing has been measured yet. Reply tokens are the bound's worst case, so this
        errs long."""
        if calls <= 0:
            return 0.0
        rates = self.rates(model)
        if rates is not None:       # one server, one CPU: its calls' times add up
            prefill, decode = rates
            return input_tokens / prefill + output_tokens / decode
        r = self._by_model.get(model)
        if r is None or not r.latencies:
            return None
        mean = sum(r.latencies) / len(r.latencies)
        return math.ceil(calls / max(1, min(concurrency, calls))) * mean
