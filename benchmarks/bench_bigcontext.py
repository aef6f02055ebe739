"""Benchmark 2 - a 40 MB (~10 M tokens) context: a regex-findable question in two turns.

Turn 1 searches the context with `re`, turn 2 commits the match. Measured per run: wall time,
trace file size (recursa: its JSONL trace; the reference: its RLMLogger JSONL), and the resident
memory high-water of the driver's whole process tree (host + sandbox workers), polled from /proc
by the orchestrator. Targets: time <= 1/3 of the reference, trace < 1 MB, peak < 400 MB.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from _common import Server, complete, driver_main, ensure_dir, make_rlm, ratio, run_driver, summary

NAME = "bigcontext"
SIZE = 40_000_000
NEEDLE = "QX-48213"
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu ledger invoice shipment customer order status pending shipped returned").split()


def make_context(size: int = SIZE) -> str:
    """Deterministic log-like text of `size` characters with one needle at ~70 %."""
    rng = random.Random(1234)
    pool = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) for _ in range(997)]
    lines, total, i = [], 0, 0
    needle_at = int(size * 0.7)
    placed = False
    while total < size:
        if not placed and total >= needle_at:
            line = f"{i:07d} note: the secret code is {NEEDLE}, keep it safe\n"
            placed = True
        else:
            line = f"{i:07d} {pool[(i * 7919) % 997]}\n"
        lines.append(line)
        total += len(line)
        i += 1
    return "".join(lines)[:size]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        import os
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def drive(p: dict[str, Any]) -> dict[str, Any]:
    t = time.perf_counter()
    context = make_context(p.get("size", SIZE))
    gen_s = time.perf_counter() - t
    rss_ctx = _rss_mb()
    tdir = ensure_dir(Path(p["tracedir"]) / p["side"])
    # warm-up on a small context: imports and first connections are not part of the figure
    complete(p["side"], make_rlm(p["side"], p["base_url"]), "ROOTQ-overhead: length?", "warm up")
    times, traces, wrong = [], [], []
    for i in range(p["n"]):
        trace = str(tdir / f"run{i}.jsonl") if p["side"].startswith("recursa") \
            else str(ensure_dir(tdir / f"run{i}"))
        rlm = make_rlm(p["side"], p["base_url"], trace=trace)
        t = time.perf_counter()
        answer, status = complete(p["side"], rlm, "ROOTQ-needle: what is the secret code?",
                                  context)
        times.append(time.perf_counter() - t)
        if answer.strip() != NEEDLE:
            wrong.append(f"{answer[:80]!r} ({status})")
        tp = Path(trace)
        files = [tp] if tp.is_file() else list(tp.glob("*.jsonl")) if tp.is_dir() else []
        traces.append(sum(f.stat().st_size for f in files))
        for f in files:   # do not leave hundreds of MB behind
            f.unlink()
        del rlm
    return {"times": times, "trace_bytes": traces, "wrong": wrong[:3], "n_wrong": len(wrong),
            "context_chars": len(context), "gen_s": gen_s, "rss_with_context_mb": rss_ctx}


def run(ctx) -> dict[str, Any]:
    n = 1 if ctx.quick else 3
    out: dict[str, Any] = {"context_mb": SIZE / 1e6, "sides": {}}
    for side in ctx.sides:
        with Server("scripted", latency=0.0, dialect=ctx.dialect(side)) as srv:
            r = run_driver(ctx.python(side), "bench_" + NAME,
                           {"side": side, "base_url": srv.base_url, "n": n,
                            "tracedir": str(ctx.workdir / "traces")},
                           timeout=600, memory=True)
        if "error" in r:
            out["sides"][side] = {"error": r["error"], "memory": r.get("memory")}
            continue
        out["sides"][side] = {
            "time_s": summary(r["times"]), "trace_bytes": summary(r["trace_bytes"]),
            "n_wrong": r["n_wrong"], "wrong": r["wrong"], "memory": r.get("memory"),
            "host_vmhwm_mb": r.get("host_vmhwm_mb"),
            "rss_with_context_mb": round(r["rss_with_context_mb"], 1)}
    ref = out["sides"].get("rlms", {}).get("time_s", {}).get("median")
    for side in ctx.sides:
        s = out["sides"][side]
        if side.startswith("recursa") and "time_s" in s:
            s["ratio_to_rlms"] = ratio(s["time_s"]["median"], ref)
            peak = (s.get("memory") or {}).get("peak_tree_rss_mb")
            s["targets"] = {
                "time_le_third_of_rlms": None if ref is None else s["time_s"]["median"] <= ref / 3,
                "trace_lt_1mb": s["trace_bytes"]["max"] < 1_000_000,
                "peak_lt_400mb": None if peak is None else peak < 400}
    return out


if __name__ == "__main__":
    driver_main(drive)
