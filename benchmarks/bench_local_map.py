"""The local map at the floor: the demo's map on the local 1.5B, against reading its input once.

In one run on one machine, against one llama-server (the demo's: 2,048-token slots, 3 slots):
  floor       the demo's context read once at this machine's prefill rate (llama-server alone:
              the text in window-sized pieces, one reply token each), in seconds
  raw arms    the demo's leaf prompts sent straight to llama-server, 3 at a time (its slots):
                text_first_json       recursa before issue 33 (the text, then the question,
                                      a JSON-string reply): no two leaves share a prefix
                question_first_json   the question first (a prefix every leaf shares)
                question_first_token  the same, one reply token under a grammar (the default)
                question_first_token_1slot  the default with one slot (what the slots give)
  recursa     the same map through recursa: a scripted root fills the demo's plan, the map runs
              in the sandbox through the dispatcher (the combinator span's wall)
Prints each wall, the leaves' accuracy against the data's own labels (dev records), and the
ratios recursa / raw default (goal <= 1.1) and recursa / floor (goal <= 1.3).

Usage: .venv/bin/python benchmarks/bench_local_map.py [--seed 0] [--tokens 4300] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from recursa import RLM
from recursa.bench.realdata import records, sentiment_site_case
from recursa.core.combinators import LeafType, leaf_prompt
from recursa.core.strategies.plan import leaf_question
from recursa.models.local import LocalClient
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

MODEL = "qwen2.5-coder-1.5b"
WINDOW = 2048
LABELS = ["positive", "negative"]        # the plan's: the opposite first, the counted last
RESULTS = Path(__file__).resolve().parent / "results"


def old_prompt(item: str, instruction: str, leaf: LeafType) -> str:
    return f"{item}\n\n---\n{instruction.replace('the text', 'the text above')}\n" \
        f"{leaf.instruction}"


async def floor(client: LocalClient, text: str) -> dict:
    """The context read once: pieces of ~1,500 tokens, one reply token each; the server's own
    prompt timings give the rate."""
    lines, pieces, cur = text.splitlines(), [], []
    for line in lines:
        cur.append(line)
        if sum(len(x) for x in cur) > 1500 * 4:
            pieces.append("\n".join(cur))
            cur = []
    if cur:
        pieces.append("\n".join(cur))
    t0 = time.perf_counter()
    tokens = seconds = 0.0
    for p in pieces:
        c = await client.complete([{"role": "user", "content": p}], max_tokens=1,
                                  temperature=0.0)
        assert c.timing is not None, "the local server gave no timings"
        tokens += c.timing.prompt_tokens
        seconds += c.timing.prompt_s
    rate = tokens / seconds
    return {"prompt_tokens": int(tokens), "prefill_tokens_per_s": round(rate, 1),
            "floor_s": round(tokens / rate, 2), "wall_s": round(time.perf_counter() - t0, 2)}


async def raw_arm(client: LocalClient, recs: list[tuple[str, str]], build, opts: dict,
                  slots: int) -> dict:
    leaf = LeafType.of(labels=LABELS)
    question = leaf_question(LABELS)
    sem = asyncio.Semaphore(slots)

    async def one(text: str):
        async with sem:
            c = await client.complete([{"role": "user", "content": build(text, question, leaf)}],
                                      **opts)
            return leaf.parse(c.text), c.usage.cached_tokens, c.usage.input_tokens
    t0 = time.perf_counter()
    out = await asyncio.gather(*(one(t) for t, _ in recs))
    wall = time.perf_counter() - t0
    right = sum(v == gold for (v, _, _), (_, gold) in zip(out, recs, strict=True))
    return {"wall_s": round(wall, 2), "accuracy": round(right / len(recs), 3),
            "prompt_tokens": sum(n for _, _, n in out),
            "cached_tokens": sum(c for _, c, _ in out)}


def through_recursa(context: str, query: str, trace: Path) -> dict:
    plan = json.dumps({"plan": "label_count", "label": "negative", "opposite": "positive",
                       "group_by": "Site"})

    def root(messages):
        if messages[0]["content"].startswith("You plan"):
            return plan
        if messages[0]["content"].startswith("A program has labelled"):
            return '{"op": "which_most"}'
        return "none"
    rlm = RLM(model=ReplayClient(root, name="replay:root"), sub_model=f"local:{MODEL}",
              client_options={"n_ctx": WINDOW}, strategy="plan", trace_path=trace,
              preflight=False)
    t0 = time.perf_counter()
    res = rlm.completion(query, context=context)
    wall = time.perf_counter() - t0
    evs = load_events(trace)
    span = [e for e in evs if e.kind == "combinator" and e.phase in ("start", "end")]
    subs = [e for e in evs if e.kind == "subcall" and e.phase == "end"]
    return {"map_wall_s": round(span[-1].t - span[0].t, 2), "run_wall_s": round(wall, 2),
            "answer": res.answer, "subcalls": res.subcalls,
            "cached_tokens": sum((e.data.get("usage") or {}).get("cached_tokens", 0)
                                 for e in subs)}


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0, help="a dev seed (< 1000)")
    ap.add_argument("--tokens", type=int, default=4300)
    ap.add_argument("--out", default=str(RESULTS / "local_map.json"))
    a = ap.parse_args()
    if a.seed >= 1000:
        ap.error("use a dev seed: this measures speed and dev accuracy")
    context, query, answer, _ = sentiment_site_case(a.seed, a.tokens)
    gold = {r.text: r.label for r in records("sentiment", "dev")}
    recs = [(line.split(" | ", 2)[2], gold[line.split(" | ", 2)[2]])
            for line in context.splitlines() if line.strip()]
    client = LocalClient(MODEL, n_ctx=WINDOW)
    await client.complete([{"role": "user", "content": "hi"}], max_tokens=1)    # load
    out: dict = {"seed": a.seed, "records": len(recs), "context_chars": len(context)}
    out["floor"] = await floor(client, context)
    print("floor:", out["floor"], flush=True)
    json_opts = {"json_schema": {"type": "string", "enum": LABELS}, "max_tokens": 8,
                 "temperature": 0.0}
    token_opts = LeafType.of(labels=LABELS).options(client)
    arms = {"text_first_json": (old_prompt, json_opts, 3),
            "question_first_json": (leaf_prompt, json_opts, 3),
            "question_first_token": (leaf_prompt, token_opts, 3),
            "question_first_token_1slot": (leaf_prompt, token_opts, 1)}
    out["raw"] = {}
    for name, (build, opts, slots) in arms.items():
        out["raw"][name] = await raw_arm(client, recs, build, opts, slots)
        print(name, out["raw"][name], flush=True)
    await client.aclose()
    trace = RESULTS / "local_map_trace.jsonl"
    trace.unlink(missing_ok=True)
    out["recursa"] = await asyncio.to_thread(through_recursa, context, query, trace)
    out["recursa"]["right"] = out["recursa"]["answer"].strip() == answer
    print("recursa:", out["recursa"], flush=True)
    raw = out["raw"]["question_first_token"]["wall_s"]
    f = out["floor"]["floor_s"]
    out["ratios"] = {
        "recursa_to_raw": round(out["recursa"]["map_wall_s"] / raw, 3),
        "recursa_to_floor": round(out["recursa"]["map_wall_s"] / f, 3),
        "raw_default_to_floor": round(raw / f, 3),
        "raw_before_to_floor": round(out["raw"]["text_first_json"]["wall_s"] / f, 3)}
    print("ratios:", out["ratios"], "(goals: recursa_to_raw <= 1.1, recursa_to_floor <= 1.3)")
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
