"""Benchmark 3 - 80 sub-calls in one batch against a server with 0.2 s latency.

The root's turn 1 sends 80 prompts in one `llm_batch` (the reference: `llm_query_batched`),
turn 2 commits the count of answers. Every request, root turns included, waits 0.2 s on the
server, so the ideal wall time is latency x (ceil(80 / concurrency) + 2 root turns).
The target: within 15 % of a raw client at the same concurrency ("floor-raw-http": the same 82
requests over bare asyncio streams, no RLM), for concurrency 16, 32 and 80; "over ideal" is shown
beside it. The reference's batch concurrency is fixed at 16 (LMHandler.batch_max_concurrent;
RLM() does not expose it), so it is compared with the raw client at 16.
"floor-openai-sdk" sends the same requests with the bare openai SDK (what recursa's OpenAI
client was built on before it got its own HTTP/1.1 client, and what rlms uses).
"""

from __future__ import annotations

import math
import time
from typing import Any

from _common import Server, complete, cpu_s, driver_main, make_rlm, run_driver, summary

NAME = "batch"
LATENCY = 0.2
N_SUB = 80
RLMS_FIXED_CONCURRENCY = 16


def _floor_run(base_url: str, conc: int) -> str:
    """The same requests with the bare openai SDK and no RLM: 1 root call, 80 sub-calls under
    a semaphore, 1 root call. What any Python client on the openai SDK pays on this machine."""
    import asyncio

    import openai

    async def go() -> str:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="bench-key") as client:
            sem = asyncio.Semaphore(conc)

            async def call(text: str) -> str:
                async with sem:
                    r = await client.chat.completions.create(
                        model="bench-model", messages=[{"role": "user", "content": text}])
                    return r.choices[0].message.content or ""

            await call(f"ROOTQ-batch-{N_SUB}: turn 1")
            out = await asyncio.gather(*(call(f"SUBQ {i}") for i in range(N_SUB)))
            await call(f"ROOTQ-batch-{N_SUB}: turn 2")
            return str(sum(x == "ok" for x in out))

    return asyncio.run(go())


def _raw_floor_run(base_url: str, conc: int) -> str:
    """The same requests over bare asyncio streams (HTTP/1.1 keep-alive, stdlib json): the
    floor of the machine and the test server, with almost no client CPU."""
    import asyncio
    import json
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    path = u.path.rstrip("/") + "/chat/completions"

    async def go() -> str:
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        sem = asyncio.Semaphore(conc)

        async def call(text: str) -> str:
            async with sem:
                conn = idle.pop() if idle else await asyncio.open_connection(u.hostname, u.port)
                r, w = conn
                body = json.dumps({"model": "bench-model",
                                   "messages": [{"role": "user", "content": text}]}).encode()
                w.write(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: "
                        f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                        + body)
                await w.drain()
                head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                n = int(head.split("content-length:")[1].split("\r\n")[0])
                data = json.loads(await r.readexactly(n))
                idle.append(conn)
                return data["choices"][0]["message"]["content"] or ""

        await call(f"ROOTQ-batch-{N_SUB}: turn 1")
        out = await asyncio.gather(*(call(f"SUBQ {i}") for i in range(N_SUB)))
        await call(f"ROOTQ-batch-{N_SUB}: turn 2")
        for _r, w in idle:
            w.close()
        return str(sum(x == "ok" for x in out))

    return asyncio.run(go())


def drive(p: dict[str, Any]) -> dict[str, Any]:
    if p["side"] in ("floor-openai-sdk", "floor-raw-http"):
        run_once = _floor_run if p["side"] == "floor-openai-sdk" else _raw_floor_run
        times, cpus, wrong = [], [], []
        for i in range(p["warmup"] + p["n"]):
            c, t = cpu_s(), time.perf_counter()
            answer = run_once(p["base_url"], p["concurrency"])
            if i >= p["warmup"]:
                times.append(time.perf_counter() - t)
                cpus.append(cpu_s() - c)
            if answer != str(N_SUB):
                wrong.append(answer)
        return {"times": times, "cpu": cpus, "wrong": wrong[:3], "n_wrong": len(wrong)}
    kw = {"concurrency": p["concurrency"]} if p["side"].startswith("recursa") else {}
    rlm = make_rlm(p["side"], p["base_url"], **kw)
    times, cpus, wrong = [], [], []
    for i in range(p["warmup"] + p["n"]):
        c = cpu_s()
        t = time.perf_counter()
        answer, status = complete(p["side"], rlm, f"ROOTQ-batch-{N_SUB}: count the answers",
                                  "a small context")
        dt = time.perf_counter() - t
        dc = cpu_s() - c
        if answer.strip() != str(N_SUB):
            wrong.append(f"{answer[:80]!r} ({status})")
        if i >= p["warmup"]:
            times.append(dt)
            cpus.append(dc)
    return {"times": times, "cpu": cpus, "wrong": wrong[:3], "n_wrong": len(wrong)}


def waves(times: list[float], gap: float) -> int:
    """Groups of sub-call replies separated by more than `gap` seconds."""
    return sum(1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] > gap)


def run(ctx) -> dict[str, Any]:
    n, warmup = (2, 1) if ctx.quick else (4, 1)
    out: dict[str, Any] = {"latency_s": LATENCY, "subcalls": N_SUB, "rows": []}
    recursa_sides = [s for s in ctx.sides if s != "rlms"]
    cases = [(s, c) for c in (16, 32, 80)
             for s in ([*recursa_sides, "floor-openai-sdk", "floor-raw-http"] if recursa_sides else [])]
    if "rlms" in ctx.sides:
        cases.append(("rlms", RLMS_FIXED_CONCURRENCY))
    for side, conc in cases:
        ideal = LATENCY * (math.ceil(N_SUB / conc) + 2)
        times: list[float] = []
        cpus: list[float] = []
        row: dict[str, Any] = {"side": side, "concurrency": conc, "ideal_s": round(ideal, 3)}
        for _round in range(ctx.rounds):
            with Server("scripted", latency=LATENCY, dialect=ctx.dialect(side)) as srv:
                py = ctx.python("recursa-local") if side.startswith("floor") \
                    else ctx.python(side)
                r = run_driver(py, "bench_" + NAME,
                               {"side": side, "base_url": srv.base_url, "n": n,
                                "warmup": warmup, "concurrency": conc}, timeout=180)
                st = srv.stats()
            if "error" in r:
                row["error"] = r["error"]
                continue
            times += r["times"]
            cpus += r["cpu"]
            row["n_wrong"] = row.get("n_wrong", 0) + r["n_wrong"]
            row["wrong"] = r["wrong"]
            row["waves_per_run"] = round(waves(st.get("sub_reply_times", []), LATENCY / 2)
                                         / (n + warmup), 2)
        row["time_s"] = summary(times)
        row["host_cpu_s"] = summary(cpus)
        med = row["time_s"].get("median")
        if med is not None:
            row["over_ideal"] = round(med / ideal - 1, 3)
        out["rows"].append(row)
    raw = {r["concurrency"]: r["time_s"].get("median") for r in out["rows"]
           if r["side"] == "floor-raw-http"}
    for r in out["rows"]:
        med, floor = r["time_s"].get("median"), raw.get(r["concurrency"])
        if med is not None and floor and r["side"] != "floor-raw-http":
            r["over_raw"] = round(med / floor - 1, 3)
            r["target_met"] = med <= floor * 1.15
    return out


if __name__ == "__main__":
    driver_main(drive)
