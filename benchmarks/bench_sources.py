"""What checking an answer's sources costs (recursa.core.sources.check), by context size and by how
the quote is found: exact, normalized, fuzzy (a typo), not at all (the worst case: every text is
scanned three ways), a long piece narrowed to the answer's line, and a 300-file folder.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_sources.py [--sizes 100000,1000000,10000000] [--reps 3]

Printed figures are medians over --reps, in milliseconds per source.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from recursa.core import sources

WORDS = [f"w{i}" + "abcdefghij"[i % 10] * (i % 7 + 1) for i in range(4000)]


def text(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    out, n = [], 0
    while n < chars:
        line = " ".join(rng.choice(WORDS) for _ in range(12)) + ".\n"
        out.append(line)
        n += len(line)
    return "".join(out)


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    fact = "The Ada meeting was held in Lyon on the third of May."
    print(f"{'context':>12} {'exact':>9} {'normalized':>11} {'fuzzy':>9} {'unfound':>9} "
          f"{'narrowed':>9}   (ms per source)")
    for size in (int(s) for s in a.sizes.split(",")):
        ctx = text(size, 1)
        mid = ctx.index("\n", size // 2) + 1
        ctx = ctx[:mid] + fact + "\n" + ctx[mid:]
        cases = {
            "exact": fact,
            "normalized": "the ada  meeting WAS held\nin lyon",
            "fuzzy": "The Ada meting was held in Lyon on the thrid of May",
            "unfound": "An invented sentence about a meeting in Paris at the town hall.",
            "narrowed": ctx[mid - 1500:mid + 1500],
        }
        row = []
        for name, quote in cases.items():
            [s] = sources.check([quote], ctx, "Lyon")
            assert s.found == (name != "unfound"), (name, s)
            row.append(timed(lambda q=quote, c=ctx: sources.check([q], c, "Lyon"), a.reps))
        print(f"{size:>12,} " + " ".join(f"{ms:>{w}.1f}" for ms, w in
                                         zip(row, (9, 11, 9, 9, 9), strict=True)))
    folder = {f"src/mod{i:03d}.py": text(20_000, i) for i in range(300)}
    folder["src/mod150.py"] += fact + "\n"
    for name, quote in (("exact", fact), ("unfound", "An invented sentence about Paris.")):
        ms = timed(lambda q=quote: sources.check([q], folder, "Lyon"), a.reps)
        print(f"300 files x 20k chars, {name}: {ms:.1f} ms")


if __name__ == "__main__":
    main()
