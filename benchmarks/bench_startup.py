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
    A `floor` row does the least any Python command on recursa's stack does before its first
    request (start the interpreter, import asyncio, pydantic with one model and httpx without
    the packages `recursa run` hides, send one chat request), measured the same way.

Both run in the dev venv (every extra and test tool: selenium brings trio, uvicorn brings
click) and, as `... (plain venv)` rows, in a venv with only recursa's own dependencies, as
`pip install recursa` gives a user (made once; _common.plain_python).
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
    plain_python,
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


def _floor_script() -> str:
    """The floor row's program. It hides what `recursa run` hides from httpx (imported here,
    not at module level: a 5a driver must not have imported recursa before it times that).
    httpcore is imported inside the hiding, as recursa.frontend.lean_imports does: httpx imports it
    only when its first client is made, and where trio and h2 are installed (the dev venv)
    they would then load after all, ~60 ms that `recursa run` does not pay."""
    from recursa.frontend.lean_imports import COMMAND_UNUSED
    return """
import sys, time
for m in UNUSED:
    sys.modules[m] = None
import asyncio, httpcore, httpx, pydantic
for m in UNUSED:
    del sys.modules[m]
class Message(pydantic.BaseModel):
    role: str
    content: str
async def main(url):
    body = {"model": "m", "messages": [Message(role="user", content="x").model_dump()]}
    async with httpx.AsyncClient(trust_env=False, verify=False) as c:   # plain http: no CA load
        r = await c.post(url + "/chat/completions", json=body)
        print(r.json()["choices"][0]["message"]["content"][:0] + "started")
asyncio.run(main(sys.argv[1]))
""".replace("UNUSED", repr(COMMAND_UNUSED))


def _first_request_times(python: str, sandbox: str | None, runs: int) -> dict[str, Any]:
    """Spawn `recursa run` (or, with sandbox None, the floor script) `runs` times; seconds from
    spawn to the first request's arrival."""
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
            if sandbox is None:
                cmd = [python, "-c", _floor_script(), srv.base_url]
            else:
                cmd = [python, "-m", "recursa.cli", "run", "ROOTQ-start: say started", "-c",
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
    if sandbox is not None:
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
    plain, plain_msg = plain_python(install=ctx.install, log=lambda m: print(m, file=sys.stderr))
    out: dict[str, Any] = {"first_target_s": FIRST_TARGET_S, "cli_target_s": CLI_TARGET_S,
                           "processes": procs, "sides": {}, "cli": {}, "plain_venv": plain_msg}
    # (row, python, side for make_rlm)
    drivers = [(side, ctx.python(side), side) for side in ctx.sides]
    if plain:
        drivers += [(f"{side} (plain venv)", plain, side) for side in ctx.sides
                    if side.startswith("recursa")]
    per: dict[str, dict[str, list[float]]] = {row: {"first": [], "warm": [], "delta": [],
                                                    "build": []} for row, _, _ in drivers}
    errors: dict[str, str] = {}
    for _ in range(procs):           # fresh processes, the sides interleaved
        for row, python, side in drivers:
            with Server("scripted", latency=0.0, dialect=ctx.dialect(side)) as srv:
                r = run_driver(python, "bench_" + NAME,
                               {"side": side, "base_url": srv.base_url, "warm": warm},
                               timeout=240)
            if "error" in r or r.get("n_wrong"):
                errors[row] = r.get("error") or f"{r['n_wrong']} wrong answers"
                continue
            d = per[row]
            d["first"].append(r["first_s"])
            d["warm"].append(r["warm_s"])
            d["delta"].append(r["first_s"] - r["warm_s"])
            d["build"].append(r["build_s"])
    for row, _, side in drivers:
        d = per[row]
        res: dict[str, Any] = {k + "_s": summary(v) for k, v in d.items()}
        med = res["delta_s"].get("median")
        if side.startswith("recursa"):
            res["target_met"] = None if med is None else med <= FIRST_TARGET_S
        if row in errors:
            res["error"] = errors[row]
        out["sides"][row] = res
    pythons = [("", RECURSA_PYTHON)] + ([(" (plain venv)", plain)] if plain else [])
    runs = 3 if ctx.quick else 7
    for suffix, python in pythons:
        for sandbox in ("local", "inprocess"):
            if f"recursa-{sandbox}" in ctx.sides:
                out["cli"][f"recursa-{sandbox}{suffix}"] = _first_request_times(python, sandbox,
                                                                                runs)
        out["cli"][f"floor{suffix}"] = _first_request_times(python, None, runs)
    return out


if __name__ == "__main__":
    driver_main(drive)
