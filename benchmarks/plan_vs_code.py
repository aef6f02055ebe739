"""The local 1.5B as root and sub-model on two dev-style inputs, in code and plan mode.

    PYTHONPATH=src python benchmarks/plan_vs_code.py [--runs reviews:plan,lines:code] [--n 30]

- `reviews`: N short product reviews whose sentiment is not written as a word; "How many of
  the reviews are negative?" (needs a judgement per record; a count of the word 'negative' is 0).
- `lines`: a 1,200-line log; "How many lines does the context have?" (a plain question about
  the input itself, which must stay right in every mode).

Prints one line per run: input, mode, answer, right or not, turns, sub-calls, tokens, seconds.
Seeded; dev-style inputs written here, not the bench's tasks.
"""

from __future__ import annotations

import argparse
import random
import re
import time

from recursa import RLM

GOOD = ["Works perfectly, I use it every morning.", "Lovely colour and the sound is great.",
        "Best purchase this year, my kids adore it.", "Setup took a minute and it just works.",
        "Sturdy, quiet, and the battery lasts for days.", "Exactly as described, would buy again."]
BAD = ["The battery died after two days and support never answered.",
       "Broke the first time I dropped it; waste of money.",
       "Arrived late, box crushed, one part missing.", "Stopped charging within a week.",
       "The app crashes constantly and the refund is still pending.",
       "Cheap plastic, it cracked on day one."]


def reviews(n: int, seed: int = 0) -> tuple[str, int]:
    rng = random.Random(seed)
    bad = rng.sample(range(n), n // 3)
    lines = [f"Review {i + 1} (customer {rng.randint(1000, 9999)}): "
             f"{rng.choice(BAD if i in bad else GOOD)}" for i in range(n)]
    return "\n".join(lines) + "\n", len(bad)


def log_lines(n: int = 1200) -> str:
    return "".join(f"{i:05d} event={['start', 'stop', 'tick'][i % 3]} value={i * 7 % 101}\n"
                   for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="reviews:plan,reviews:code,lines:plan,lines:code,"
                    "lines:code-noex", help="input:mode pairs")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=300)
    a = ap.parse_args()
    text, gold = reviews(a.n)
    cases = {"reviews": ("How many of the reviews are negative?", text, str(gold)),
             "lines": ("How many lines does the context have?", log_lines(), "1200")}
    for run in a.runs.split(","):          # input:mode
        name, mode = run.split(":")
        query, context, want = cases[name]
        if True:
            rlm = RLM(model="local:qwen2.5-coder-1.5b", strategy=mode.split("-")[0],
                      example=not mode.endswith("noex"), max_iterations=6,
                      max_seconds=a.max_seconds, max_output_chars=2000,
                      model_options={"temperature": 0.0, "max_tokens": 400},
                      sub_model_options={"temperature": 0.0, "max_tokens": 200},
                      trace_path=f"/tmp/plan_vs_code-{name}-{mode}.jsonl")
            t0 = time.monotonic()
            res = rlm.completion(query, context=context)
            right = want in re.findall(r"\d+", res.answer)
            print(f"{name:8} {mode:10} answer={res.answer[:60]!r:64} right={right!s:5} "
                  f"gold={want} status={res.status} turns={res.turns} "
                  f"subcalls={res.subcalls} "
                  f"tokens={sum(u.usage.total_tokens for u in res.usage.values()):,} "
                  f"s={time.monotonic() - t0:.0f}", flush=True)


if __name__ == "__main__":
    main()
