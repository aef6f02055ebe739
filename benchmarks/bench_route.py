"""What `route="auto"` adds to a short request, next to a plain client call.

    PYTHONPATH=src:tests python benchmarks/bench_route.py [--n 200] [--latency 0.0]

One process, one scripted OpenAI-compatible HTTP server (tests/openai_testserver.py, answering
after `--latency` s), one shared OpenAIClient. Medians of `--n` requests (after 10 warm-up
ones) of a two-line question with a one-line context:
  direct call   client.complete(messages): the floor
  route=auto    RLM(model=client, route="auto").acompletion(query, context): routing, the
                ledger, the trace (no sinks), the Result, the same one HTTP call
Prints both medians, their ratio and the difference in ms.
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
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:12s} median {v:8.3f} ms  (n={n}, server latency {latency * 1000:g} ms)")
    ratio = med["route=auto"] / med["direct call"]
    print(f"ratio route=auto / direct: {ratio:.3f}  (+{med['route=auto'] - med['direct call']:.3f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--latency", type=float, default=0.0, help="server reply delay, s")
    a = ap.parse_args()
    asyncio.run(main_async(a.n, a.latency))


if __name__ == "__main__":
    main()
