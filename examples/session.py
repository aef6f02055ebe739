"""Several questions about one context in one session: the second builds on the first.

The context is a service log (about 3,000 lines). The first question makes the model find the
error lines; the second is a follow-up ("which service ...?") that it can answer from the
variables the first question left in the REPL, listed in `session_history` and summarised in
its first message. `session.spent` adds the questions up.

    .venv/bin/python examples/session.py [--model local:qwen2.5-coder-1.5b] [--trace s.jsonl]
"""

from __future__ import annotations

import argparse
import random

from recursa import RLM


def make_log(seed: int = 0, lines: int = 3000) -> tuple[str, int, str]:
    """A log with a known number of ERROR lines, most of them from one service."""
    rng = random.Random(seed)
    services = ["auth", "billing", "search", "mailer", "gateway"]
    worst = rng.choice(services)
    out, errors = [], 0
    for i in range(lines):
        svc = rng.choice(services)
        if rng.random() < 0.02 or (svc == worst and rng.random() < 0.05):
            level, errors = "ERROR", errors + 1
            msg = "request failed: upstream timeout"
        else:
            level, msg = "INFO", "request served"
        out.append(f"2026-03-{1 + i // 200:02d}T{i % 24:02d}:00:00 {level} [{svc}] {msg} id={i}")
    return "\n".join(out), errors, worst


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="local:qwen2.5-coder-1.5b")
    ap.add_argument("--trace", help="write the session's trace (one run per question) here")
    a = ap.parse_args()
    log, errors, worst = make_log()
    rlm = RLM(model=a.model, max_iterations=8, trace_path=a.trace)
    with rlm.session(log, idle_timeout=300) as session:
        for q in ["How many ERROR lines are in the log?",
                  "Which service wrote the most of those ERROR lines?"]:
            res = session.completion(q)
            print(f"Q: {q}\nA: {res.answer}   ({res.status}, {res.turns} turns, "
                  f"{res.elapsed_s:.0f}s)\n")
        print(f"expected: {errors} ERROR lines, most from {worst}")
        print(session.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
