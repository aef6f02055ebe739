"""Benchmark 4b - many concurrent runs in one process (16 and 64).

recursa: one RLM, `asyncio.gather` of R `acompletion` calls. The reference has no async API:
R threads, one RLM object each. Every run has its own tag; turn 1 prints it, turn 2 commits
"run-<tag>" only if the REPL output the model saw carried its own tag and no other (the scripted
model checks), so cross-talk between runs shows up as wrong answers. Server latency 0.1 s (ideal
wall time 0.2 s whatever R is). Reported: wall time, throughput (runs / s), wrong answers.
"""

from __future__ import annotations

import time
from typing import Any

from _common import Server, driver_main, make_rlm, run_driver, summary

NAME = "concurrent"
LATENCY = 0.1
CONTEXT = "shared context for every run\n" * 20


def drive(p: dict[str, Any]) -> dict[str, Any]:
    side, runs = p["side"], p["runs"]
    answers: list[str] = []
    t = time.perf_counter()
    if side.startswith("recursa"):
        import asyncio
        rlm = make_rlm(side, p["base_url"])

        async def one(k: int) -> str:
            try:
                res = await rlm.acompletion(f"ROOTQ-tag-{k}: which run is this?", CONTEXT)
                return res.answer
            except Exception as e:
                return f"raised {type(e).__name__}: {e}"

        async def all_runs() -> list[str]:
            return list(await asyncio.gather(*(one(k) for k in range(runs))))

        answers = asyncio.run(all_runs())
    else:
        from concurrent.futures import ThreadPoolExecutor

        def one_thread(k: int) -> str:
            try:
                rlm = make_rlm(side, p["base_url"])
                return rlm.completion(CONTEXT, root_prompt=f"ROOTQ-tag-{k}: which run?").response
            except Exception as e:
                return f"raised {type(e).__name__}: {e}"

        with ThreadPoolExecutor(runs) as ex:
            answers = list(ex.map(one_thread, range(runs)))
    wall = time.perf_counter() - t
    wrong = [(k, a) for k, a in enumerate(answers) if str(a).strip() != f"run-{k}"]
    return {"wall_s": wall, "n_wrong": len(wrong),
            "wrong": [f"run {k}: {str(a)[:160]!r}" for k, a in wrong[:3]]}


def run(ctx) -> dict[str, Any]:
    reps = 1 if ctx.quick else 3
    out: dict[str, Any] = {"latency_s": LATENCY, "ideal_s": 2 * LATENCY, "rows": []}
    for runs in (16, 64):
        for side in ctx.sides:
            walls, n_wrong, wrong, err = [], 0, [], None
            for _rep in range(reps):
                with Server("scripted", latency=LATENCY, dialect=ctx.dialect(side)) as srv:
                    r = run_driver(ctx.python(side), "bench_" + NAME,
                                   {"side": side, "base_url": srv.base_url, "runs": runs},
                                   timeout=300, memory=True)
                if "error" in r:
                    err = r["error"]
                    continue
                walls.append(r["wall_s"])
                n_wrong += r["n_wrong"]
                wrong = wrong or r["wrong"]
                mem = r.get("memory")
            row: dict[str, Any] = {"side": side, "runs": runs, "wall_s": summary(walls),
                                   "runs_wrong": n_wrong, "runs_total": runs * len(walls),
                                   "wrong": wrong}
            if err:
                row["error"] = err
            if walls:
                row["throughput_runs_per_s"] = round(runs / row["wall_s"]["median"], 1)
                row["memory"] = mem
            out["rows"].append(row)
    return out


if __name__ == "__main__":
    driver_main(drive)
