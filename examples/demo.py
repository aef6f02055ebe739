"""`make demo`: a judged count over real reviews, more text than the model's window holds.

About 4,300 tokens of one-sentence reviews from Amazon, IMDb and Yelp (twice the 2,048-token
window the local Qwen2.5-Coder-1.5B is loaded with here), each labelled negative or positive by
the people who published the data (the UCI "Sentiment Labelled Sentences", Kotzias et al. 2015,
CC BY 4.0: recursa.bench.realdata), and a question such as "Count the reviews in this list that
express a negative opinion." No review says its label, so every review has to be judged. The
model never sees the reviews: in the planned mode (auto picks it for a small local model) it
fills a typed plan (judge each record as one of two sides, count), the runtime shows the plan's
bound on sub-calls and tokens, runs one small sub-call per review (a one-token reply,
constrained to the two sides), counts in code, and the model answers from the counts. The
answer is right within 15% of the truth counted from the labels. Beside it, the no-model
baselines on the same reviews: a grep for the question's words, a regex, the VADER sentiment
lexicon (the best of them on this question's dev half: right on 72% of 50 dev seeds) and
zero-shot similarity with a small embedding model (all-MiniLM-L6-v2, with the bench extra).

The run is bounded by sub-calls and tokens, not by wall time, so it answers the same on a
machine half as fast; `--max-seconds` sets a time limit (a plan that cannot finish in time at
the machine's measured pace is then not started, and a map cut by it answers from what it
judged, saying so).

    .venv/bin/python examples/demo.py [--seed N ...] [--task FAMILY] [--strategy auto|plan|code]

Seeds from 1000 draw reviews and phrasings from the data's test half (the default, 1000); below
1000 from its dev half, the only one anything was tuned on. Several seeds run one after another,
with a tally at the end. `--task real_wordnet_count` asks the same of WordNet's definitions.
"""

from __future__ import annotations

import argparse
import sys
import time

from _spend import print_spend

from recursa import RLM
from recursa.bench.baselines import baseline_answer
from recursa.bench.realdata import TEST_SEED_BASE
from recursa.bench.tasks import get_task
from recursa.bench.tasks.base import Instance
from recursa.obs.console import ConsoleView

WINDOW = 2048
TOKENS = 4300
TASK = "real_sentiment_count"
# the no-model baselines (none needs labelled examples) and the one that scores best on the dev
# half of both real-label counts at this size (benchmarks/bench_real_baselines.py: sentiment
# .72, glosses .38; docs/bench/README.md)
BASELINES = ("grep", "regex", "lexicon", "embed")
BEST_ON_DEV = "lexicon"


def baselines(inst: Instance) -> None:
    task = get_task(inst.task)
    for name in BASELINES:
        try:
            answer = baseline_answer(name, inst, str(inst.context))
        except Exception as e:      # the embed extra not installed: say so, do not fail
            print(f"{name + ':':10s} (not run: {type(e).__name__}: {str(e)[:80]}; "
                  "pip install -e '.[bench]' adds it)")
            continue
        right = task.score(answer, inst).score == 1.0
        best = "  <- the best no-model baseline on the dev half" if name == BEST_ON_DEV else ""
        print(f"{name + ':':10s} {answer.strip()[:60]!r} -> {'right' if right else 'wrong'}"
              f"{best}")


def run_one(inst: Instance, a: argparse.Namespace) -> bool:
    task = get_task(inst.task)
    n = len([x for x in str(inst.context).splitlines() if x.strip()])
    print(f"context: {n} records, {len(str(inst.context)):,} characters (~"
          f"{len(str(inst.context)) // 4:,} tokens; the model's window: {WINDOW:,} tokens)")
    print(f"query:   {inst.query}\n")
    view = ConsoleView()
    local = a.model.startswith("local:")
    # bounded by calls and tokens, not wall time: the same run is right on a machine half as
    # fast (a 170 s limit tuned on one machine cut the map halfway on a slower one)
    rlm = RLM(model=a.model, max_iterations=6, max_output_chars=2000, max_seconds=a.max_seconds,
              max_subcalls=a.max_subcalls, max_tokens=a.max_tokens,
              model_options={"temperature": 0.0, "max_tokens": 400},
              sub_model_options={"temperature": 0.0, "max_tokens": 200},
              client_options={"n_ctx": WINDOW} if local else None,
              trace_dir="traces", sinks=[view], strategy=a.strategy)
    t0 = time.monotonic()
    res = rlm.completion(inst.query, context=inst.context)
    view.close()
    right = task.score(res.answer, inst).score == 1.0
    counts = inst.meta.get("counts") or {}
    gold = ", ".join(f"{s} {c}" for s, c in sorted(counts.items(), key=lambda x: -x[1])) \
        if counts else f"{inst.gold}"
    rule = ("within 15% of the truth" if inst.meta.get("question_type") == "count" else
            "the right one and no other")
    print(f"answer:    {res.answer.strip()[:600]}")
    print(f"status:    {res.status} (ready={res.ready})"
          + (f"; stopped at {res.limit}" if res.limit else ""))
    if res.partial:
        print(f"partial:   the answer rests on {res.partial}")
    if res.error:
        print(f"why:       {res.error}")
    print(f"right:     {'yes' if right else 'no'} under the strict judge ({rule}; the "
          f"truth, counted from the labels the data's publishers gave: {gold})")
    baselines(inst)
    print_spend(res, t0)
    return right


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, nargs="+", default=[TEST_SEED_BASE])
    ap.add_argument("--strategy", default="auto", choices=["auto", "plan", "code"])
    ap.add_argument("--model", default="local:qwen2.5-coder-1.5b")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="each run's time limit (default none: the run is bounded by calls and "
                    "tokens; with a limit, a plan that cannot finish in time is not started)")
    ap.add_argument("--max-subcalls", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=120_000)
    ap.add_argument("--task", default=TASK, help="a real-label family (recursa bench list)")
    a = ap.parse_args()
    task = get_task(a.task)
    right = 0
    for i, seed in enumerate(a.seed):
        if i:
            print("\n" + "-" * 78 + "\n")
        split = "test" if seed >= TEST_SEED_BASE else "dev"
        print(f"seed {seed} ({'held-out test' if split == 'test' else 'dev'} half)")
        right += run_one(task.generate(seed, TOKENS, split=split), a)
    if len(a.seed) > 1:
        print(f"\nright on {right} of {len(a.seed)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
