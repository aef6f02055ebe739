"""Prompt caching on Anthropic: billed input tokens and cost of one 10-turn RLM run, with and
without recursa's cache_control breakpoints.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_prompt_cache.py [--turns 10] [--model ...]

The root model is a scripted reply served by a local fake of the Messages API
(tests/provider_fakes.py) that bills like the real one: prefixes up to a `cache_control`
breakpoint are written (1.25x input price) once they reach the model's minimum (1024 tokens for
Sonnet 4.5), and a later request starting with a written prefix reads it (0.1x). Each turn
prints 3,000 characters of the context, so the root's history grows the way a real run's does.
The real recursa loop, sandbox and AnthropicClient run; only the model is scripted. Tokens are
the fake's (4 characters a token); prices are recursa's table for the model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from provider_fakes import PromptCache, ProviderFake  # noqa: E402
from recursa import RLM  # noqa: E402
from recursa.base.types import Capabilities, Usage  # noqa: E402
from recursa.models.anthropic_client import AnthropicClient  # noqa: E402
from recursa.models.pricing import cost_usd, price_for  # noqa: E402

CONTEXT = "".join(f"record {i:05d}: the value of item {i} is {i * 7 % 1000}.\n"
                  for i in range(4000))          # ~180k characters


class Root:
    """Turn k < turns prints the k-th 3,000-character slice; the last turn answers."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, last_user: str) -> str:
        with self.lock:
            self.n += 1
            k = self.n
        if k < self.turns:
            return (f"Looking at part {k}.\n```repl\n"
                    f"print(context[{(k - 1) * 3000}:{k * 3000}])\n```\n")
        return ('Done.\n```repl\nanswer["content"] = "item 3 is 21"\n'
                'answer["ready"] = True\n```\n')


class Recorder:
    """Wraps the client to keep each call's usage and cache writes."""

    def __init__(self, client: AnthropicClient) -> None:
        self.client = client
        self.name = client.name
        self.calls: list[tuple[Usage, int]] = []

    async def complete(self, messages: list[dict[str, Any]], **options: Any):
        before = self.client.cache_write_tokens
        comp = await self.client.complete(messages, **options)
        self.calls.append((comp.usage, self.client.cache_write_tokens - before))
        return comp

    @property
    def capabilities(self) -> Capabilities:   # the wrapped client's prices; no astream here
        return self.client.capabilities._replace(streaming=False)

    async def aclose(self) -> None:
        await self.client.aclose()


def run_once(model: str, turns: int, cache: bool, min_tokens: int) -> dict[str, Any]:
    with ProviderFake(Root(turns), cache=PromptCache(min_tokens=min_tokens)) as fake:
        client = AnthropicClient(model, base_url=fake.url, api_key="fake",
                                 name=f"anthropic:{model}", prompt_cache=cache)
        rec = Recorder(client)
        rlm = RLM(rec, sandbox="inprocess", max_iterations=turns + 2)

        async def go() -> Any:
            try:
                return await rlm.acompletion("What is the value of item 3?", CONTEXT)
            finally:
                await client.aclose()

        res = asyncio.run(go())
    u = sum((c[0] for c in rec.calls), Usage())
    writes = sum(c[1] for c in rec.calls)
    fresh = u.input_tokens - u.cached_tokens - writes
    cost = sum(cost_usd(model, cu, cache_write_tokens=w) or 0.0 for cu, w in rec.calls)
    # "billed input tokens": what the input costs, in full-price input tokens
    p = price_for(model)
    assert p is not None
    write_price = p.cache_write if p.cache_write is not None else 1.25 * p.input
    billed = fresh + u.cached_tokens * (p.cached_input or p.input) / p.input \
        + writes * write_price / p.input
    return {"status": res.status, "answer": res.answer, "turns": res.turns,
            "calls": len(rec.calls), "input": u.input_tokens, "fresh": fresh,
            "read": u.cached_tokens, "write": writes, "output": u.output_tokens,
            "billed_input": billed, "cost": cost, "result_cost": res.cost_usd}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--model", default="claude-sonnet-4-5")
    ap.add_argument("--min-tokens", type=int, default=1024,
                    help="smallest cacheable prefix (1024 Sonnet 4.5; 4096 Haiku/Opus 4.5)")
    a = ap.parse_args()
    rows = {"without caching": run_once(a.model, a.turns, False, a.min_tokens),
            "with caching": run_once(a.model, a.turns, True, a.min_tokens)}
    print(f"{a.turns}-turn RLM run, anthropic:{a.model} on a fake Messages API "
          f"(min cacheable prefix {a.min_tokens} tokens)\n")
    print(f"{'':17}{'calls':>6}{'input tok':>11}{'uncached':>10}{'cache rd':>10}"
          f"{'cache wr':>10}{'output':>8}{'billed in':>11}{'cost USD':>11}")
    for label, r in rows.items():
        print(f"{label:17}{r['calls']:>6}{r['input']:>11,}{r['fresh']:>10,}{r['read']:>10,}"
              f"{r['write']:>10,}{r['output']:>8,}{r['billed_input']:>11,.0f}{r['cost']:>11.5f}")
        assert r["status"] == "final" and r["turns"] == a.turns, r
        assert abs((r["result_cost"] or 0) - r["cost"]) < 1e-9, r   # what the run reported
    off, on = rows["without caching"], rows["with caching"]
    print(f"\nbilled input tokens: {on['billed_input'] / off['billed_input']:.2f}x; "
          f"cost: {on['cost'] / off['cost']:.2f}x "
          f"({(1 - on['cost'] / off['cost']) * 100:.0f}% less) with caching")


if __name__ == "__main__":
    main()
