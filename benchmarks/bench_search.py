"""Benchmark: the REPL's search() index (recursa.core.semantic) on ~64k and ~1M tokens of real text.

Per size, each run is a fresh subprocess (so its peak RSS is its own) that loads the model,
builds the index over Wikipedia text with ten paraphrased needles in it (tests/search_needles.py)
and runs 40 queries. Printed: medians over the runs of
- model load (WordLlama from its wheel), index build (wall and CPU time), query time;
- peak RSS of the process, and how much the build added to it (peak minus RSS before);
- recall@5 and @20 of the needles for BM25 alone, the static embeddings alone, the contextual
  encoder alone (MiniLM, the `contextual` extra), BM25 + static fused (hybrid2, "hybrid" without
  the extra) and all three fused (hybrid3), for the paraphrased questions and for plain keyword
  ones (each run is another seed: another haystack and needle positions);
- the contextual encoder's cost: encoding every sentence (once per index) and a query.
Contextual modes run up to --contextual-max tokens (encoding 1M tokens takes many minutes).
The machine is shared: the wall times carry its load (printed), the CPU times much less so.

`--suite para_niah` instead measures on the bench's paraphrased-needle family, dev split only
(ParaNIAH(split="dev"): its own templates, dev paragraphs of the corpus; the test split stays
held out): one instance per seed, recall of the passage holding the needle for its question.

    python benchmarks/bench_search.py [--runs 3] [--sizes 64000,1000000] [--json PATH]
    python benchmarks/bench_search.py --suite para_niah [--runs 20] [--sizes 16384]
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


def compared(contextual: bool) -> dict[str, tuple[str, ...]]:
    """The rankings compared: name -> what SemanticIndex.fuse fuses."""
    out = {"bm25": ("bm25",), "semantic": ("semantic",), "hybrid2": ("bm25", "semantic")}
    if contextual:
        out |= {"contextual": ("contextual",), "bm25+ctx": ("bm25", "contextual"),
                "hybrid3": ("bm25", "semantic", "contextual")}
    return out


def contextual_cost(index: object, queries: list[str]) -> dict:
    """Encode every sentence of the index (timed), then time the queries per fused mode."""
    from recursa.core.contextual import encoder
    t = time.perf_counter()
    encoder().load()
    load_s = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    index.contextual_vectors()                                   # type: ignore[attr-defined]
    enc_s, enc_cpu = time.perf_counter() - t, time.process_time() - c
    out = {"ctx_load_s": load_s, "ctx_encode_s": enc_s, "ctx_encode_cpu_s": enc_cpu,
           "units": len(index._spans)}                            # type: ignore[attr-defined]
    for name, rankings in (("hybrid2", ("bm25", "semantic")),
                           ("hybrid3", ("bm25", "semantic", "contextual"))):
        times = []
        for q in queries:
            t = time.perf_counter()
            index.fuse(q, rankings)                              # type: ignore[attr-defined]
            times.append(time.perf_counter() - t)
        out[f"query_ms_{name}"] = 1000 * statistics.median(times)
    return out


def child_para(tokens: int, runs: int) -> dict:
    """The para_niah suite: dev seeds 0..runs-1 in this one process."""
    from recursa.bench.tasks.para_niah import ANSWER_SUFFIX, ParaNIAH
    from recursa.core import contextual
    from recursa.core.semantic import SemanticIndex, default_embedder
    default_embedder()
    modes = compared(contextual.available())
    found: dict[str, dict[str, int]] = {str(k): dict.fromkeys(modes, 0) for k in TOP_K}
    costs = []
    for seed in range(runs):
        inst = ParaNIAH().generate(seed, tokens, split="dev")
        text, query = inst.context, inst.query.removesuffix(ANSWER_SUFFIX)
        t, c = time.perf_counter(), time.process_time()
        index = SemanticIndex(text)
        cost = {"build_s": time.perf_counter() - t, "build_cpu_s": time.process_time() - c,
                "passages": len(index), "tokens": index.tokens}
        if "contextual" in modes:
            cost |= contextual_cost(index, [query])
        costs.append(cost)
        at = text.index(inst.meta["needles"][0])
        gold = {i for i, p in enumerate(index.passages) if p.start <= at < p.end}
        for name, rankings in modes.items():
            top = [i for i, _ in index.fuse(query, rankings)]
            for k in TOP_K:
                found[str(k)][name] += bool(gold & set(top[:k]))
    med = {k: statistics.median(c[k] for c in costs) for k in costs[0]}
    return {**med, "runs": runs, "found_in_top_k": {
        k: {m: f"{v}/{runs}" for m, v in by.items()} for k, by in found.items()}}


def child(tokens: int, seed: int, contextual_max: int = 0) -> dict:
    """One run, in its own process."""
    from recursa.core import contextual
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
        index.fuse(q, ("bm25", "semantic"))      # hybrid without the contextual encoder
        times.append(time.perf_counter() - t)
    use_ctx = contextual.available() and tokens <= contextual_max
    extra = contextual_cost(index, queries[:20]) if use_ctx else {}
    modes = compared(use_ctx)
    found = {k: found_in_top(index, text, k, modes) for k in TOP_K}
    return {"tokens": index.tokens, "chars": len(text), "passages": len(index),
            "load_s": load_s, "build_s": build_s, "build_cpu_s": build_cpu,
            "query_ms": 1000 * statistics.median(times), "peak_rss_mb": peak,
            "build_rss_mb": peak - before, **extra,
            "found": {str(k): {kind: {m: sum(v) for m, v in getattr(f, kind).items()}
                               for kind in ("paraphrase", "lexical")} for k, f in found.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="64000,1000000")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--suite", choices=("wiki", "para_niah"), default="wiki")
    ap.add_argument("--contextual-max", type=int, default=64000,
                    help="run the contextual modes up to this many tokens")
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-para", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    if a.child_para:
        print(json.dumps(child_para(*a.child_para)))
        return
    out = {"suite": a.suite, "load_avg_start": os.getloadavg()[0], "cpus": os.cpu_count(),
           "sizes": {}}
    for size in (int(s) for s in a.sizes.split(",")):
        if a.suite == "para_niah":
            res = subprocess.run([sys.executable, __file__, "--child-para", str(size),
                                  str(a.runs)], capture_output=True, text=True, check=True)
            r = json.loads(res.stdout.strip().splitlines()[-1])
            out["sizes"][size] = r
            print(f"para_niah dev, {size:,} tokens ({r['passages']:.0f} passages, "
                  f"{r.get('units', 0):.0f} sentences), {r['runs']} seeds; medians:")
            print(f"  index {r['build_s']:.2f} s wall, {r['build_cpu_s']:.2f} s CPU"
                  + (f" | contextual: encode {r['ctx_encode_s']:.1f} s wall, "
                     f"{r['ctx_encode_cpu_s']:.1f} s CPU, query hybrid2 "
                     f"{r['query_ms_hybrid2']:.0f} ms, hybrid3 {r['query_ms_hybrid3']:.0f} ms"
                     if "ctx_encode_s" in r else ""))
            for k, by in r["found_in_top_k"].items():
                print(f"  needle in the top {k}: " + ", ".join(f"{m} {v}" for m, v in by.items()))
            continue
        runs = []
        for seed in range(a.runs):
            res = subprocess.run([sys.executable, __file__, "--child", str(size), str(seed),
                                  str(a.contextual_max)],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        keys = ["tokens", "passages", "load_s", "build_s", "build_cpu_s", "query_ms",
                "peak_rss_mb", "build_rss_mb"]
        keys += [k for k in runs[0] if k.startswith(("ctx_", "query_ms_", "units"))]
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        n = 10 * len(runs)
        modes = list(runs[0]["found"][str(TOP_K[0])]["paraphrase"])
        found = {str(k): {kind: {m: f"{sum(r['found'][str(k)][kind][m] for r in runs)}/{n}"
                                 for m in modes}
                          for kind in ("paraphrase", "lexical")} for k in TOP_K}
        out["sizes"][size] = {**med, "runs": len(runs), "found_in_top_k": found}
        print(f"~{size:,} tokens ({med['tokens']:,.0f} counted, {med['passages']:,.0f} passages, "
              f"median of {len(runs)} runs)")
        print(f"  model load {med['load_s']:.2f} s | index {med['build_s']:.2f} s wall, "
              f"{med['build_cpu_s']:.2f} s CPU | query {med['query_ms']:.1f} ms")
        print(f"  peak RSS {med['peak_rss_mb']:.0f} MB (the build added "
              f"{med['build_rss_mb']:.0f} MB)")
        if "ctx_encode_s" in med:
            print(f"  contextual: model load {med['ctx_load_s']:.2f} s | encode "
                  f"{med['units']:.0f} sentences {med['ctx_encode_s']:.1f} s wall, "
                  f"{med['ctx_encode_cpu_s']:.1f} s CPU | query hybrid2 "
                  f"{med['query_ms_hybrid2']:.0f} ms, hybrid3 {med['query_ms_hybrid3']:.0f} ms")
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
