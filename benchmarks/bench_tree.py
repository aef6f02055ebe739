"""Benchmark 4a - depth 2: one batch of child RLMs that each make a batch of sub-calls.

The root's turn 1 runs `rlm_batch` (the reference: `rlm_query_batched`) over K=8 child prompts;
each child is a two-turn RLM whose turn 1 sends M=4 sub-calls in one batch and whose turn 2
answers "C<i>:<ok count>"; the root's turn 2 joins the answers. Server latency 0.1 s, so the ideal
is 5 sequential model calls = 0.5 s. The answer is checked slot by slot, which shows failures and
answers that landed in the wrong slot (cross-talk between parallel children). The reference runs
its children in threads (max_concurrent_subcalls, set to K here).
"""

from __future__ import annotations

import time
from typing import Any

from _common import Server, complete, driver_main, make_rlm, run_driver, summary

NAME = "tree"
LATENCY = 0.1
K, M = 8, 4


def expected() -> list[str]:
    return [f"C{i}:{M}" for i in range(K)]


def drive(p: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {"depth": 1}
    if p["side"] == "rlms":
        kw["subcall_workers"] = K
    times, bad, samples = [], 0, []
    for _i in range(p["n"]):
        rlm = make_rlm(p["side"], p["base_url"], **kw)
        t = time.perf_counter()
        try:
            answer, status = complete(p["side"], rlm, f"ROOTQ-tree-{K}-{M}: ask the children",
                                      "a small context")
        except Exception as e:   # the reference may raise; that is a result too
            answer, status = f"raised {type(e).__name__}: {e}", "raised"
        times.append(time.perf_counter() - t)
        got = answer.split("|")
        ok = sum(1 for a, b in zip(got, expected(), strict=False) if a.strip() == b)
        if ok != K:
            bad += 1
            samples.append(f"{answer[:300]!r} ({status})")
        else:
            samples.append("ok")
    return {"times": times, "n_bad": bad, "samples": samples[:3]}


def run(ctx) -> dict[str, Any]:
    n = 2 if ctx.quick else 4
    out: dict[str, Any] = {"latency_s": LATENCY, "children": K, "subcalls_per_child": M,
                           "ideal_s": 5 * LATENCY, "sides": {}}
    for side in ctx.sides:
        with Server("scripted", latency=LATENCY, dialect=ctx.dialect(side)) as srv:
            r = run_driver(ctx.python(side), "bench_" + NAME,
                           {"side": side, "base_url": srv.base_url, "n": n}, timeout=300)
            st = srv.stats()
        if "error" in r:
            out["sides"][side] = {"error": r["error"]}
            continue
        out["sides"][side] = {"time_s": summary(r["times"]), "runs": n, "runs_wrong": r["n_bad"],
                              "samples": r["samples"], "server_counts": st.get("counts")}
    return out


if __name__ == "__main__":
    driver_main(drive)
