"""Benchmark 6 - `recursa serve` under load: 64 concurrent chat completions.

The upstream is the scripted model server with 0.1 s latency; each request is the two-turn "tag"
program of benchmark 4b (turn 1 prints the request's own tag, turn 2 commits `run-<k>` only if
the REPL output it saw carried that tag and no other), so cross-talk shows up as a wrong answer.

* served-asyncio / served-uvloop: a real `python -m recursa.cli serve --max-runs 64 --loop L`
  process per event loop (uvloop: uvicorn's default when installed; skipped when it is not); a
  load driver (its own process, a lean keep-alive client) sends 64 requests at once (query in the
  last user message, context in the `context` field) and times each one.
* direct: the same 64 runs through `RLM.acompletion` in one process (asyncio.gather), with the
  same upstream and one shared model client, as the server has: what the runs cost without the
  server.
* direct-per-run: the same, but with the clients RLM builds for each completion (its default):
  a new connection to the upstream per run.

Reported per sandbox: all answered?, p50 / p99 / max latency, wall time of the whole wave, and
the server's own overhead = served - direct (p50 and wall), per loop. 3 measured waves each (1 in
--quick), direct and the two served paths alternating, each driver after one warm-up wave;
recursa only (the reference has no server). The server shares its upstream clients between
requests (keep-alive connections).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from typing import Any

from _common import (
    RECURSA_PYTHON,
    REPO,
    Server,
    _kill_group,
    driver_main,
    make_rlm,
    run_driver,
    summary,
)

NAME = "serve"
LATENCY = 0.1
REQUESTS = 64
CONTEXT = "shared context for every run\n" * 20
LOOPS = ("asyncio", "uvloop")
MODES = ("direct", "direct-per-run", *(f"served-{loop}" for loop in LOOPS))


def _have_uvloop() -> bool:
    import importlib.util
    return importlib.util.find_spec("uvloop") is not None


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _wave_stats(lat: list[float], wall: float, wrong: list[str]) -> dict[str, Any]:
    return {"p50_s": _pct(lat, 0.5), "p99_s": _pct(lat, 0.99), "max_s": max(lat, default=None),
            "wall_s": wall, "answered": len(lat) - len(wrong), "wrong": wrong[:3]}


def drive(p: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    n, waves = p["requests"], p["waves"]

    if p["mode"].startswith("direct"):
        if p["mode"] == "direct":
            # One client for every run, as the server shares its upstream clients: the
            # difference to "served" is then the server's own work.
            from recursa import RLM
            from recursa.models import make_client
            shared = make_client("openai:bench-model", base_url=p["upstream"],
                                 api_key="bench-key")
            rlm = RLM(model=shared, sandbox=p["side"].split("-", 1)[1], max_iterations=6)
        else:                                 # "direct-per-run": RLM's own clients per run
            rlm = make_rlm(p["side"], p["upstream"])

        async def one(k: int) -> tuple[float, str]:
            t = time.perf_counter()
            try:
                res = await rlm.acompletion(f"ROOTQ-tag-{k}: which run is this?", CONTEXT)
                answer = res.answer
            except Exception as e:  # noqa: BLE001 - recorded as a wrong answer
                answer = f"raised {type(e).__name__}: {e}"
            return time.perf_counter() - t, answer
    else:
        import httpx
        http = httpx.AsyncClient(base_url=p["server"], timeout=120, trust_env=False,
                                 limits=httpx.Limits(max_connections=n,
                                                     max_keepalive_connections=n))

        async def one(k: int) -> tuple[float, str]:
            body = json.dumps({"model": "recursa", "context": CONTEXT, "messages": [
                {"role": "user", "content": f"ROOTQ-tag-{k}: which run is this?"}]}).encode()
            t = time.perf_counter()
            try:
                r = await http.post("chat/completions", content=body,
                                    headers={"Content-Type": "application/json"})
                data = r.json()
                answer = data["choices"][0]["message"]["content"] if r.status_code == 200 else \
                    f"HTTP {r.status_code}: {data.get('error', {}).get('message', '')[:100]}"
            except Exception as e:  # noqa: BLE001 - recorded as a wrong answer
                answer = f"raised {type(e).__name__}: {e}"
            return time.perf_counter() - t, answer

    async def wave() -> dict[str, Any]:
        t = time.perf_counter()
        res = await asyncio.gather(*(one(k) for k in range(n)))
        wall = time.perf_counter() - t
        wrong = [f"run {k}: {a[:120]!r}" for k, (_, a) in enumerate(res) if a.strip() != f"run-{k}"]
        return _wave_stats([d for d, _ in res], wall, wrong) | {
            "latencies": [d for d, _ in res]}

    async def main() -> list[dict[str, Any]]:
        await wave()                          # warm-up: imports, connections, sandbox spares
        return [await wave() for _ in range(waves)]

    return {"waves": asyncio.run(main())}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Serve:
    """A real `recursa serve` process in front of `upstream`."""

    def __init__(self, upstream: str, sandbox: str, loop: str):
        self.port = _free_port()
        self.cmd = [RECURSA_PYTHON, "-m", "recursa.cli", "serve", "--model",
                    "openai:bench-model", "--base-url", upstream, "--sandbox", sandbox,
                    "--port", str(self.port), "--max-runs", str(REQUESTS),
                    "--max-iterations", "6", "--loop", loop, "--log-level", "warning",
                    "--no-token"]

    def __enter__(self) -> str:
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        env["PYTHONPATH"] = str(REPO / "src")
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"recursa serve exited: {self.proc.stderr.read()[-400:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return f"http://127.0.0.1:{self.port}/v1"
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("recursa serve did not start within 60 s")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)


def run(ctx) -> dict[str, Any]:
    reps = 1 if ctx.quick else 3
    out: dict[str, Any] = {"latency_s": LATENCY, "requests": REQUESTS, "ideal_s": 2 * LATENCY,
                           "waves": reps, "rows": []}
    for side in [s for s in ctx.sides if s.startswith("recursa")]:
        sandbox = side.split("-", 1)[1]
        row: dict[str, Any] = {"side": side}
        got: dict[str, dict[str, list[Any]]] = {m: {"lat": [], "wall": [], "wrong": [],
                                                    "answered": []} for m in MODES}
        errors: dict[str, str] = {}
        loops = [lp for lp in LOOPS if lp != "uvloop" or _have_uvloop()]
        # One upstream and one server per loop per side; direct and served waves alternate, so
        # a change in the machine's load hits all alike.
        with Server("scripted", latency=LATENCY) as up, contextlib.ExitStack() as stack:
            urls: dict[str, str] = {}
            for lp in loops:
                try:
                    urls[lp] = stack.enter_context(_Serve(up.base_url, sandbox, lp))
                except RuntimeError as e:
                    errors[f"served-{lp}"] = str(e)
            for rep in range(reps):
                served = [f"served-{lp}" for lp in urls]
                for mode in ["direct", "direct-per-run",
                             *(served if rep % 2 == 0 else served[::-1])]:
                    params = {"side": side, "mode": mode, "upstream": up.base_url,
                              "server": urls.get(mode.removeprefix("served-"), ""),
                              "requests": REQUESTS, "waves": 1}
                    r = run_driver(RECURSA_PYTHON, "bench_" + NAME, params, timeout=300)
                    if "error" in r:
                        errors[mode] = r["error"]
                        continue
                    for w in r["waves"]:
                        g = got[mode]
                        g["lat"] += w["latencies"]
                        g["wall"].append(w["wall_s"])
                        g["wrong"] += w["wrong"]
                        g["answered"].append(w["answered"])
        for mode, g in got.items():
            if mode in errors and not g["lat"]:
                row[mode] = {"error": errors[mode]}
                continue
            if not g["lat"]:   # served-uvloop without uvloop
                continue
            row[mode] = {"p50_s": _pct(g["lat"], 0.5), "p99_s": _pct(g["lat"], 0.99),
                         "max_s": max(g["lat"]), "wall_s": summary(g["wall"]),
                         "answered": sum(g["answered"]), "total": REQUESTS * len(g["wall"]),
                         "wrong": g["wrong"][:3]}
        d = row.get("direct", {})
        row["all_answered"] = True
        for lp in LOOPS:
            s = row.get(f"served-{lp}", {})
            if "p50_s" in d and "p50_s" in s:
                s["overhead_p50_s"] = s["p50_s"] - d["p50_s"]
                s["overhead_wall_s"] = s["wall_s"]["median"] - d["wall_s"]["median"]
                row["all_answered"] &= s["answered"] == s["total"]
        out["rows"].append(row)
    return out


if __name__ == "__main__":
    driver_main(drive)
