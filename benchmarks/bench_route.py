"""What `route="auto"` adds to a short request, next to a plain client call.

    PYTHONPATH=src:tests python benchmarks/bench_route.py [--n 200] [--latency 0.0]

One process, one scripted OpenAI-compatible HTTP server (tests/openai_testserver.py, answering
after `--latency` s), one shared OpenAIClient. Medians of `--n` requests (after 10 warm-up
ones) of a two-line question with a one-line context:
  direct call   client.complete(messages): the floor
  route=auto    RLM(model=client, route="auto").acompletion(query, context): routing, the
                ledger, the trace (no sinks), the Result, the same one HTTP call
Prints both medians, their ratio and the difference in ms.

    PYTHONPATH=src:tests python benchmarks/bench_route.py --serve [--n 200] [--latency 0.0]

The same through HTTP, as a `recursa serve` user meets it: a real `recursa serve --route auto`
process (model openai:test-model at the same scripted server, --sandbox inprocess), one
keep-alive httpx client, the context as the system message:
  direct HTTP   POST /v1/chat/completions to the scripted server itself: the floor
  serve auto    the same request to recursa serve, answered on the direct path (checked: the
                X-Recursa-Route header says direct)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from openai_testserver import OpenAITestServer
from recursa.core.rlm import RLM
from recursa.models.openai_client import OpenAIClient

QUERY = "What is the capital of France?\nAnswer in one word."
CONTEXT = "France is a country in Europe; its capital is Paris."


async def main_async(n: int, latency: float) -> None:
    with OpenAITestServer(responder=lambda req: "Paris", latency=latency) as srv:
        client = OpenAIClient("test-model", base_url=srv.base_url, api_key="none")
        rlm = RLM(model=client, route="auto", preflight=False)
        messages = [{"role": "user", "content": f"{CONTEXT}\n\n{QUERY}"}]

        async def direct() -> None:
            await client.complete(messages)

        async def routed() -> None:
            res = await rlm.acompletion(QUERY, CONTEXT)
            assert res.route == "direct" and res.answer == "Paris", res

        times: dict[str, list[float]] = {"direct call": [], "route=auto": []}
        for _ in range(10):
            await direct()
            await routed()
        for _ in range(n):          # interleaved, so drift hits both alike
            for name, fn in (("direct call", direct), ("route=auto", routed)):
                t0 = time.perf_counter()
                await fn()
                times[name].append(time.perf_counter() - t0)
        await client.aclose()
    report(times, n, latency)


def report(times: dict[str, list[float]], n: int, latency: float) -> None:
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:12s} median {v:8.3f} ms  (n={n}, server latency {latency * 1000:g} ms)")
    (floor, k0), (routed, k1) = ((med[k], k) for k in times)
    print(f"ratio {k1} / {k0}: {routed / floor:.3f}  (+{routed - floor:.3f} ms)")


def main_serve(n: int, latency: float) -> None:
    import httpx

    from serve_process import recursa_serve
    key = "bench-route"
    with OpenAITestServer(responder=lambda req: "Paris", latency=latency) as srv, \
            recursa_serve("--model", "openai:test-model", "--base-url", srv.base_url,
                          "--route", "auto", "--sandbox", "inprocess", "--api-key", key,
                          "--log-level", "warning") as (base, _), \
            httpx.Client(timeout=60) as http:
        body = {"model": "recursa", "messages": [{"role": "system", "content": CONTEXT},
                                                 {"role": "user", "content": QUERY}]}

        def direct() -> None:
            r = http.post(srv.base_url + "/chat/completions", json={
                "model": "test-model",
                "messages": [{"role": "user", "content": f"{CONTEXT}\n\n{QUERY}"}]})
            assert r.status_code == 200, r.text

        def served() -> None:
            r = http.post(base + "/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            assert r.headers["x-recursa-route"] == "direct", r.headers
            assert r.json()["choices"][0]["message"]["content"] == "Paris", r.text

        times: dict[str, list[float]] = {"direct HTTP": [], "serve auto": []}
        for _ in range(10):
            direct()
            served()
        for _ in range(n):          # interleaved, so drift hits both alike
            for name, fn in (("direct HTTP", direct), ("serve auto", served)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    report(times, n, latency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--latency", type=float, default=0.0, help="server reply delay, s")
    ap.add_argument("--serve", action="store_true",
                    help="time HTTP requests through a real `recursa serve --route auto`")
    a = ap.parse_args()
    if a.serve:
        main_serve(a.n, a.latency)
    else:
        asyncio.run(main_async(a.n, a.latency))


if __name__ == "__main__":
    main()
