"""The no-model baselines on the real-label families, on the DEV split only.

1. Per record: the share of each snapshot's dev records that lexicon, embed and classifier
   label right (sentiment: negative / positive; wordnet: animal / plant / food / person, or
   "other" for the four files no question asks about).
2. Per instance: each baseline's mean score (each family's own scorer) over dev seeds 0..n-1 of
   every real family at 2x and 4x a 2,048-token window; counts also with the mean relative error.
3. judge_agg (synthetic reviews, where lexicon and embed run too) at 1,536 and 8,192 tokens, on
   dev seeds and on the test seeds 0..n-1 the committed held-out rounds used (no model, nothing
   tuned on them).

    python benchmarks/bench_real_baselines.py [-n 50] [--window 2048] [--json PATH]

No network; the embedding model loads from its pinned package files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from recursa.bench import get_task  # noqa: E402
from recursa.bench.baselines import BASELINES, baseline_answer  # noqa: E402
from recursa.bench.record_baselines import (  # noqa: E402
    LABEL_BASELINES,
    applies,
    record_accuracy,
)
from recursa.bench.tasks import REAL  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=50, help="dev seeds per family and length")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    out: dict[str, object] = {"per_record": {}, "per_instance": {}}
    print("per-record accuracy on the dev half")
    print(f"{'snapshot':10s} " + " ".join(f"{b:>10s}" for b in LABEL_BASELINES))
    for snap in ("sentiment", "wordnet"):
        accs = {b: record_accuracy(b, snap) for b in LABEL_BASELINES}
        out["per_record"][snap] = accs          # type: ignore[index]
        print(f"{snap:10s} " + " ".join(f"{accs[b]:10.3f}" for b in LABEL_BASELINES))
    print(f"\nmean score over seeds 0-{a.n - 1} of the split named (counts: mean relative error "
          "in brackets)")
    print(f"{'family/split':26s} {'length':>6s} " + " ".join(f"{b:>12s}" for b in BASELINES))
    cells = [(name, mult * a.window, "dev") for name in REAL for mult in (2, 4)]
    cells += [("judge_agg", length, split) for split in ("dev", "test") for length in (1536, 8192)]
    for name, length, split in cells:
        task = get_task(name)
        names = [b for b in BASELINES if applies(b, name)]
        scores: dict[str, list[float]] = {b: [] for b in names}
        rel: dict[str, list[float]] = {b: [] for b in names}
        t0 = time.monotonic()
        for seed in range(a.n):
            inst = task.generate(seed, length, split=split)
            for b in names:
                sc = task.score(baseline_answer(b, inst, inst.context, seed), inst)
                scores[b].append(sc.score)
                if "rel_error" in sc.metrics:
                    rel[b].append(sc.metrics["rel_error"])
        cell = {b: {"score": statistics.fmean(v),
                    "rel_error": statistics.fmean(rel[b]) if rel[b] else None}
                for b, v in scores.items()}
        out["per_instance"][f"{name}@{length}/{split}"] = cell     # type: ignore[index]
        print(f"{name + '/' + split:26s} {length:6d} " + " ".join(
            f"{cell[b]['score']:5.2f}" + (f" [{cell[b]['rel_error']:4.2f}]"
                                          if cell[b]["rel_error"] is not None else " " * 7)
            if b in cell else f"{'-':>12s}"
            for b in BASELINES) + f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
