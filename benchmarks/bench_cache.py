"""What a response-cache hit costs, in microseconds, next to the sqlite read it rests on.

    PYTHONPATH=src python benchmarks/bench_cache.py [--n 2000] [--kb 32]

A request like a root turn's (a system prompt and a few turns, `--kb` KiB of text in all) is
stored once; then, side by side in one process, medians of `--n` repetitions of:
  sqlite get    ResponseCache.get(key): the indexed read alone
  key           canonical JSON + sha256 of the request
  hit           CachedClient.complete() on a hit: key + get + building the Completion
  no cache      the same call on the bare scripted client (the floor of any call)
and of a miss (model call on the scripted client + the write in a worker thread).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from recursa.models.cache import CachedClient, ResponseCache, client_identity, request_key
from recursa.models.replay import ReplayClient


def request(kb: int, salt: str = "") -> list[dict[str, str]]:
    chunk = ("The quick brown fox jumps over the lazy dog; 0123456789. " * 20)[:1000]
    per = max(1, kb // 6)
    msgs = [{"role": "system", "content": "You are a REPL agent. " + chunk * per}]
    for i in range(5):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"turn {i} {salt} " + chunk * per})
    return msgs


async def timed(n: int, fn) -> list[float]:   # noqa: ANN001 - a coroutine factory
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def main_async(n: int, kb: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = ResponseCache(Path(d) / "c.sqlite")
        inner = ReplayClient(lambda m: "```repl\nprint(len(context))\n```")
        client = CachedClient(inner, store)
        msgs = request(kb)
        opts = {"temperature": 0, "max_tokens": 512}
        await client.complete(msgs, **opts)                    # store it
        ident = client_identity(inner)
        key = request_key(ident, msgs, opts)
        for _ in range(50):                                    # warm up
            await client.complete(msgs, **opts)

        async def get() -> None:
            store.get(key)

        async def keyed() -> None:
            request_key(ident, msgs, opts)

        async def hit() -> None:
            await client.complete(msgs, **opts)

        async def bare() -> None:
            await inner.complete(msgs, **opts)

        salts = iter(range(10**9))

        async def miss() -> None:
            await client.complete(request(kb, f"miss{next(salts)}"), **opts)

        res = {name: statistics.median(await timed(n, fn))
               for name, fn in (("sqlite get", get), ("key", keyed), ("hit", hit),
                                ("no cache", bare))}
        res["miss (+write)"] = statistics.median(await timed(max(50, n // 10), miss))
        size = sum(len(m["content"]) for m in msgs)
        print(f"request {size / 1024:.0f} KiB in {len(msgs)} messages; {len(store)} entries; "
              f"medians of {n} (miss: {max(50, n // 10)})")
        for name, us in res.items():
            print(f"  {name:14s} {us:8.1f} us")
        print(f"  hit beyond sqlite get: {res['hit'] - res['sqlite get']:.1f} us "
              f"(key {res['key']:.1f} us of it)")
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--kb", type=int, default=32, help="request size in KiB")
    a = ap.parse_args()
    asyncio.run(main_async(a.n, a.kb))


if __name__ == "__main__":
    main()
