"""Benchmark: the REPL's search() index (recursa.core.semantic) on ~64k and ~1M tokens of real text.

Per size, each run is a fresh subprocess (so its peak RSS is its own) that loads the model,
builds the index over Wikipedia text with ten paraphrased needles in it (tests/search_needles.py)
and runs 40 queries. Printed: medians over the runs of
- model load (WordLlama from its wheel), index build (wall and CPU time), query time;
- peak RSS of the process, and how much the build added to it (peak minus RSS before);
- recall@5 and @20 of the needles for BM25 alone, the embeddings alone and the fused search,
  for the paraphrased questions and for plain keyword ones (each run is another seed: another
  haystack and needle positions).
The machine is shared: the wall times carry its load (printed), the CPU times much less so.

    python benchmarks/bench_search.py [--runs 3] [--sizes 64000,1000000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))      # the needles (tests/search_needles.py)

CHARS_PER_TOKEN = 4
TOP_K = (5, 20)          # recall of the needles in the first k hits


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(tokens: int, seed: int) -> dict:
    """One run, in its own process."""
    from recursa.core.semantic import SemanticIndex, default_embedder
    from search_needles import NEEDLES, found_in_top, haystack
    t = time.perf_counter()
    default_embedder()
    load_s = time.perf_counter() - t
    text = haystack(seed, tokens * CHARS_PER_TOKEN)
    before = _rss_mb()
    t, c = time.perf_counter(), time.process_time()
    index = SemanticIndex(text)
    build_s, build_cpu = time.perf_counter() - t, time.process_time() - c
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queries = [q for _, para, lex in NEEDLES for q in (para, lex)] * 2
    times = []
    for q in queries:
        t = time.perf_counter()
        index.search(q, 5)
        times.append(time.perf_counter() - t)
    found = {k: found_in_top(index, text, k) for k in TOP_K}
    return {"tokens": index.tokens, "chars": len(text), "passages": len(index),
            "load_s": load_s, "build_s": build_s, "build_cpu_s": build_cpu,
            "query_ms": 1000 * statistics.median(times), "peak_rss_mb": peak,
            "build_rss_mb": peak - before,
            "found": {str(k): {kind: {m: sum(v) for m, v in getattr(f, kind).items()}
                               for kind in ("paraphrase", "lexical")} for k, f in found.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="64000,1000000")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    out = {"load_avg_start": os.getloadavg()[0], "cpus": os.cpu_count(), "sizes": {}}
    for size in (int(s) for s in a.sizes.split(",")):
        runs = []
        for seed in range(a.runs):
            res = subprocess.run([sys.executable, __file__, "--child", str(size), str(seed)],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("tokens", "passages", "load_s", "build_s", "build_cpu_s", "query_ms",
                         "peak_rss_mb", "build_rss_mb")}
        n = 10 * len(runs)
        found = {str(k): {kind: {m: f"{sum(r['found'][str(k)][kind][m] for r in runs)}/{n}"
                                 for m in ("bm25", "semantic", "hybrid")}
                          for kind in ("paraphrase", "lexical")} for k in TOP_K}
        out["sizes"][size] = {**med, "runs": len(runs), "found_in_top_k": found}
        print(f"~{size:,} tokens ({med['tokens']:,.0f} counted, {med['passages']:,.0f} passages, "
              f"median of {len(runs)} runs)")
        print(f"  model load {med['load_s']:.2f} s | index {med['build_s']:.2f} s wall, "
              f"{med['build_cpu_s']:.2f} s CPU | query {med['query_ms']:.1f} ms")
        print(f"  peak RSS {med['peak_rss_mb']:.0f} MB (the build added "
              f"{med['build_rss_mb']:.0f} MB)")
        for k, kinds in found.items():
            for kind, by in kinds.items():
                print(f"  needles in the top {k}, {kind} questions: "
                      + ", ".join(f"{m} {v}" for m, v in by.items()))
    out["load_avg_end"] = os.getloadavg()[0]
    print(f"load average {out['load_avg_start']:.1f} -> {out['load_avg_end']:.1f} "
          f"on {out['cpus']} CPUs")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
