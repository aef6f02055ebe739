"""Benchmark 5 - start-up: the first completion in a new process, and `recursa run` to its first
model request.

5a. Each driver is a fresh interpreter: it imports the library, builds one RLM, times its first
    completion, then `warm` more. Reported per side: medians over the fresh processes of the
    first completion, of the warm ones (each process's median), and of first - warm (the
    first-use cost: imports on first use, first connection, first sandbox).
    Target: first - warm <= 0.2 s.
5b. `python -m recursa.cli run QUESTION -c FILE --base-url URL` is started as a subprocess; the
    scripted server (a thread of this process) records when the first request arrives. Reported:
    median of (arrival - the moment before the process was spawned) over the runs, and the CPU
    time of the whole `recursa run` process (start-up is most of it; it depends far less on
    the machine's load than the wall time). Target: <= 0.3 s. The reference has no CLI, so 5b has recursa rows only.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from _common import (
    RECURSA_PYTHON,
    REPO,
    TESTS_DIR,
    Server,
    complete,
    driver_main,
    make_rlm,
    run_driver,
    summary,
)

NAME = "startup"
CONTEXT = "The quick brown fox jumps over the lazy dog.\n" * 50
FIRST_TARGET_S = 0.2
CLI_TARGET_S = 0.3


def drive(p: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    rlm = make_rlm(p["side"], p["base_url"])
    build_s = time.perf_counter() - t0
    times, wrong = [], 0
    for _ in range(1 + p["warm"]):
        t = time.perf_counter()
        answer, _status = complete(p["side"], rlm, "ROOTQ-overhead: how long is the context?",
                                   CONTEXT)
        times.append(time.perf_counter() - t)
        wrong += answer.strip() != str(len(CONTEXT))
    return {"build_s": build_s, "first_s": times[0], "warm_s": statistics.median(times[1:]),
            "n_wrong": wrong}


def _children_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _first_request_times(sandbox: str, runs: int) -> dict[str, Any]:
    """Spawn `recursa run` `runs` times; seconds from spawn to the first request's arrival."""
    sys.path.insert(0, str(TESTS_DIR))
    from openai_testserver import OpenAITestServer

    arrivals: list[float] = []
    lock = threading.Lock()

    def responder(req: dict[str, Any]) -> str:
        with lock:
            arrivals.append(time.time())
        return "```repl\nanswer['content'] = 'started'\nanswer['ready'] = True\n```"

    out: list[float] = []
    cpu: list[float] = []
    errors: list[str] = []
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONPATH"] = str(REPO / "src")
    with tempfile.TemporaryDirectory() as tmp, OpenAITestServer(responder=responder) as srv:
        ctx = os.path.join(tmp, "context.txt")
        with open(ctx, "w") as f:
            f.write(CONTEXT)
        for _ in range(runs):
            arrivals.clear()
            cmd = [RECURSA_PYTHON, "-m", "recursa.cli", "run", "ROOTQ-start: say started", "-c",
                   ctx, "--model", "openai:bench-model", "--base-url", srv.base_url,
                   "--sandbox", sandbox, "-q"]
            c0 = _children_cpu()
            t0 = time.time()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                                   cwd=tmp)
            except subprocess.TimeoutExpired:
                errors.append("timed out")
                continue
            cpu.append(_children_cpu() - c0)
            if p.returncode != 0 or p.stdout.strip() != "started" or not arrivals:
                errors.append(f"exit {p.returncode}: {p.stderr.strip()[-200:]}")
                continue
            out.append(arrivals[0] - t0)
    res: dict[str, Any] = {"to_first_request_s": summary(out), "samples": out,
                           "run_cpu_s": summary(cpu)}
    if errors:
        res["errors"] = errors[:3]
    med = res["to_first_request_s"].get("median")
    res["target_met"] = None if med is None else med <= CLI_TARGET_S
    return res


def _compile_bytecode() -> None:
    """Write recursa's .pyc files first, as pip does when it installs a wheel: with
    PYTHONDONTWRITEBYTECODE set (CI, containers), an editable checkout would otherwise compile
    every module from source in every fresh process, which is not what a user's start costs."""
    import compileall
    compileall.compile_dir(str(REPO / "src" / "recursa"), quiet=1)


def run(ctx) -> dict[str, Any]:
    procs, warm = (3, 3) if ctx.quick else (7, 5)
    _compile_bytecode()
    out: dict[str, Any] = {"first_target_s": FIRST_TARGET_S, "cli_target_s": CLI_TARGET_S,
                           "processes": procs, "sides": {}, "cli": {}}
    per: dict[str, dict[str, list[float]]] = {s: {"first": [], "warm": [], "delta": [],
                                                  "build": []} for s in ctx.sides}
    errors: dict[str, str] = {}
    for _ in range(procs):           # fresh processes, the sides interleaved
        for side in ctx.sides:
            with Server("scripted", latency=0.0, dialect=ctx.dialect(side)) as srv:
                r = run_driver(ctx.python(side), "bench_" + NAME,
                               {"side": side, "base_url": srv.base_url, "warm": warm},
                               timeout=240)
            if "error" in r or r.get("n_wrong"):
                errors[side] = r.get("error") or f"{r['n_wrong']} wrong answers"
                continue
            d = per[side]
            d["first"].append(r["first_s"])
            d["warm"].append(r["warm_s"])
            d["delta"].append(r["first_s"] - r["warm_s"])
            d["build"].append(r["build_s"])
    for side in ctx.sides:
        d = per[side]
        row: dict[str, Any] = {k + "_s": summary(v) for k, v in d.items()}
        med = row["delta_s"].get("median")
        if side.startswith("recursa"):
            row["target_met"] = None if med is None else med <= FIRST_TARGET_S
        if side in errors:
            row["error"] = errors[side]
        out["sides"][side] = row
    for sandbox in ("local", "inprocess"):
        if f"recursa-{sandbox}" in ctx.sides:
            out["cli"][sandbox] = _first_request_times(sandbox, 3 if ctx.quick else 7)
    return out


if __name__ == "__main__":
    driver_main(drive)
