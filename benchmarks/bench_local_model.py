"""The local model's calls: does a batch of sub-calls cost the root its cached history, and what
does recursa add over talking to llama.cpp directly?  (issue: "Local calls that redo no work")

    .venv/bin/python benchmarks/bench_local_model.py                 # default model, ~4 min
    .venv/bin/python benchmarks/bench_local_model.py --model qwen2.5-coder-0.5b --baseline

Measured, in one run, on one server (recursa's own, `LocalClient`):
  * root turn, warm: a ~1,450-token root history whose prefix the server holds, plus a short
    new user message (median of --reps);
  * root turn after sub-calls: the same, right after a batch of 8 distinct sub-calls went
    through the same server (target: within 3x + 1 s of the warm turn);
  * 8 sub-calls through LocalClient (asyncio.gather) against the same kind of prompts sent
    straight to llama.cpp's HTTP endpoint with httpx (target: within 1.2x);
  * prompt and generation tokens/s from llama.cpp's own timings.
With --baseline it also runs the old arrangement (one slot, no prompt cache), where every
sub-call evicts the root's history, to show what the slots and the RAM cache save.
Writes benchmarks/results/local_model.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from recursa.models.local import LocalClient

WORDS = ("river stone market ledger copper window signal harbor orchard lantern thread quarry "
         "meadow falcon cinder basalt walnut kettle saddle beacon").split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def root_history(rng: random.Random) -> list[dict[str, str]]:
    # ~1,450 tokens: a system prompt and three code/output exchanges, like a real root
    msgs = [{"role": "system", "content": "You write Python in ```repl blocks. " + _text(rng, 320)}]
    for i in range(3):
        msgs.append({"role": "assistant",
                     "content": f"```repl\nhits_{i} = [l for l in context.splitlines() if "
                                f"'{rng.choice(WORDS)}' in l]\nprint(len(hits_{i}))\n```"})
        msgs.append({"role": "user", "content": f"{rng.randint(1, 999)}\n" + _text(rng, 250)})
    return msgs


def sub_prompts(rng: random.Random, n: int, words: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Task {i}: which word comes first? " +
              _text(rng, words)}] for i in range(n)]


def _timings(raw: Any) -> dict[str, float]:
    return (raw or {}).get("timings") or {}


async def root_turn(c: LocalClient, hist: list[dict[str, str]], k: int) -> tuple[float, dict]:
    msgs = [*hist, {"role": "user", "content": f"Turn {k}: what next?"}]
    t0 = time.perf_counter()
    comp = await c.complete(msgs, max_tokens=8, temperature=0.0)
    return time.perf_counter() - t0, _timings(comp.raw)


async def via_client(c: LocalClient, prompts: list) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    comps = await asyncio.gather(*(c.complete(p, max_tokens=16, temperature=0.0)
                                   for p in prompts))
    return time.perf_counter() - t0, [_timings(x.raw) for x in comps]


async def via_raw(base_url: str, token: str, prompts: list) -> float:
    async with httpx.AsyncClient(timeout=None) as h:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(h.post(base_url + "/v1/chat/completions",
                                           headers={"Authorization": f"Bearer {token}"},
                                           json={"messages": p, "max_tokens": 16,
                                                 "temperature": 0.0})
                                    for p in prompts))
        for r in rs:
            r.raise_for_status()
        return time.perf_counter() - t0


async def measure(model: str, reps: int, n_sub: int, sub_words: int, slots: int,
                  cache_ram: int, raw: bool) -> dict[str, Any]:
    rng = random.Random(7)
    c = LocalClient(model, slots=slots, cache_ram_mib=cache_ram)
    srv = await c.load()
    hist = root_history(rng)
    await root_turn(c, hist, 0)                       # fill the root's cache once
    warm, after, sub_t, raw_t, after_tim, warm_tim, sub_tims = [], [], [], [], [], [], []
    for r in range(reps):
        dt, tim = await root_turn(c, hist, 1 + 2 * r)
        warm.append(dt)
        warm_tim.append(tim)
        # fresh prompts each time, so neither side finds the other's prompts in the cache
        dt, tims = await via_client(c, sub_prompts(rng, n_sub, sub_words))
        sub_t.append(dt)
        sub_tims.extend(tims)
        dt, tim = await root_turn(c, hist, 2 + 2 * r)
        after.append(dt)
        after_tim.append(tim)
        if raw:
            raw_t.append(await via_raw(srv.base_url, srv.token, sub_prompts(rng, n_sub,
                                                                             sub_words)))
    await c.aclose()
    hist_tokens = warm_tim[0].get("cache_n", 0) + warm_tim[0].get("prompt_n", 0)
    out: dict[str, Any] = {
        "slots": slots, "cache_ram_mib": cache_ram, "history_tokens": hist_tokens,
        "root_warm_s": statistics.median(warm), "root_after_subcalls_s": statistics.median(after),
        "root_after_prompt_tokens_read": [t.get("prompt_n") for t in after_tim],
        "subcalls_client_s": statistics.median(sub_t),
        "prompt_tokens_per_s": statistics.median(t["prompt_per_second"] for t in sub_tims
                                                 if t.get("prompt_per_second")),
        "generation_tokens_per_s": statistics.median(t["predicted_per_second"] for t in sub_tims
                                                     if t.get("predicted_per_second")),
        "server_start_s": round(srv.started_s, 2)}
    out["after_vs_warm"] = out["root_after_subcalls_s"] / out["root_warm_s"]
    out["after_target_s"] = 3 * out["root_warm_s"] + 1
    if raw_t:
        out["subcalls_raw_s"] = statistics.median(raw_t)
        out["client_vs_raw"] = out["subcalls_client_s"] / out["subcalls_raw_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--subcalls", type=int, default=8)
    ap.add_argument("--sub-words", type=int, default=60)
    ap.add_argument("--baseline", action="store_true",
                    help="also run one slot with no prompt cache (the old arrangement)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "local_model.json"))
    a = ap.parse_args()
    res = {"model": a.model, "subcalls": a.subcalls,
           "recursa": asyncio.run(measure(a.model, a.reps, a.subcalls, a.sub_words, 3, 2048,
                                          raw=True))}
    if a.baseline:
        from recursa.models import llama_server
        llama_server.stop_all()
        res["one_slot_no_cache"] = asyncio.run(measure(a.model, 1, a.subcalls, a.sub_words, 1,
                                                       0, raw=False))
    r = res["recursa"]
    print(f"model {a.model}: history {r['history_tokens']} tokens, {a.subcalls} sub-calls")
    print(f"  root turn warm             {r['root_warm_s']:.2f} s")
    print(f"  root turn after sub-calls  {r['root_after_subcalls_s']:.2f} s "
          f"({r['after_vs_warm']:.2f}x; target <= {r['after_target_s']:.2f} s; prompt tokens "
          f"read again: {r['root_after_prompt_tokens_read']})")
    print(f"  {a.subcalls} sub-calls via recursa   {r['subcalls_client_s']:.2f} s, straight to "
          f"llama.cpp {r['subcalls_raw_s']:.2f} s ({r['client_vs_raw']:.2f}x; target <= 1.2x)")
    print(f"  prompt {r['prompt_tokens_per_s']:.1f} tok/s, generation "
          f"{r['generation_tokens_per_s']:.1f} tok/s, server start {r['server_start_s']} s")
    if "one_slot_no_cache" in res:
        b = res["one_slot_no_cache"]
        print(f"  old arrangement (1 slot, no RAM cache): root turn after sub-calls "
              f"{b['root_after_subcalls_s']:.2f} s vs warm {b['root_warm_s']:.2f} s")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
