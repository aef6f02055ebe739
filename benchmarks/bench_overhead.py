"""Benchmark 1 - per-completion overhead of a two-turn run.

The server answers instantly (latency 0), so the wall time of `completion()` is all overhead:
building clients, starting the REPL/sandbox, loading the context, two HTTP round trips to
127.0.0.1, running two cells, tracing and tearing down. Each driver builds one RLM object, runs
`warmup` completions, then times `n`. Target: recursa <= 1/10 of the reference.
"""

from __future__ import annotations

import time
from typing import Any

from _common import Server, complete, cpu_s, driver_main, make_rlm, ratio, run_driver, summary

NAME = "overhead"
CONTEXT = "The quick brown fox jumps over the lazy dog.\n" * 50   # 2,250 chars


def drive(p: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    rlm = make_rlm(p["side"], p["base_url"])
    build_s = time.perf_counter() - t0
    expected = str(len(CONTEXT))
    samples, cpus, wrong = [], [], []
    for i in range(p["warmup"] + p["n"]):
        c = cpu_s()
        t = time.perf_counter()
        answer, status = complete(p["side"], rlm, "ROOTQ-overhead: how long is the context?",
                                  CONTEXT)
        dt = time.perf_counter() - t
        dc = cpu_s() - c
        if answer.strip() != expected:
            wrong.append(f"{answer!r} ({status})")
        if i == 0:
            first = dt
        if i >= p["warmup"]:
            samples.append(dt)
            cpus.append(dc)
    return {"samples": samples, "cpu": cpus, "first_s": first, "build_s": build_s, "wrong": wrong[:3],
            "n_wrong": len(wrong)}


def run(ctx) -> dict[str, Any]:
    n, warmup = (5, 1) if ctx.quick else (15, 2)
    out: dict[str, Any] = {"sides": {}}
    samples: dict[str, list[float]] = {s: [] for s in ctx.sides}
    cpus: dict[str, list[float]] = {s: [] for s in ctx.sides}
    extra: dict[str, dict[str, Any]] = {s: {} for s in ctx.sides}
    for _round in range(ctx.rounds):
        for side in ctx.sides:
            with Server("scripted", latency=0.0, dialect=ctx.dialect(side)) as srv:
                r = run_driver(ctx.python(side), "bench_" + NAME,
                               {"side": side, "base_url": srv.base_url, "n": n,
                                "warmup": warmup}, timeout=240)
                st = srv.stats()
            if "error" in r:
                extra[side]["error"] = r["error"]
                continue
            samples[side] += r["samples"]
            cpus[side] += r["cpu"]
            extra[side].update(first_s=r["first_s"], n_wrong=r["n_wrong"] +
                               extra[side].get("n_wrong", 0), wrong=r["wrong"],
                               requests=st.get("requests"))
    for side in ctx.sides:
        out["sides"][side] = {"overhead_s": summary(samples[side]),
                              "cpu_s": summary(cpus[side]), **extra[side]}
    ref = out["sides"].get("rlms", {}).get("overhead_s", {}).get("median")
    ref_cpu = out["sides"].get("rlms", {}).get("cpu_s", {}).get("median")
    for side in ctx.sides:
        if side.startswith("recursa"):
            med = out["sides"][side]["overhead_s"].get("median")
            out["sides"][side]["ratio_to_rlms"] = ratio(med, ref)
            out["sides"][side]["cpu_ratio_to_rlms"] = ratio(
                out["sides"][side]["cpu_s"].get("median"), ref_cpu)
            out["sides"][side]["target_met"] = (None if ref is None or med is None
                                                else med <= ref / 10)
    return out


if __name__ == "__main__":
    driver_main(drive)
