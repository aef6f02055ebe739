"""`make demo`: a real RLM run with the local Qwen2.5-Coder-0.5B model over a real long text.

The text is the Python standard library's `argparse.py` (about 100 kB, some 25,000 tokens:
three times the 8,192-token window the local model runs with), which nobody wrote for this
demo. The model never sees it whole: it writes code against the `context` variable.
"""

from __future__ import annotations

import sys
import sysconfig
import time
from pathlib import Path

from recursa import RLM
from recursa.console import ConsoleView

WORD = "Action"
QUERY = (f"How many times does the word '{WORD}' occur in context? "
         "Use Python's str.count and then call FINAL with the number.")


def main() -> int:
    path = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    text = path.read_text(encoding="utf-8")
    truth = text.count(WORD)
    print(f"context: {path} ({len(text):,} characters, ~{len(text) // 4:,} tokens)")
    print(f"query:   {QUERY}\n")
    view = ConsoleView()
    rlm = RLM(model="local:qwen2.5-coder-0.5b", max_iterations=6, max_output_chars=1500,
              model_options={"temperature": 0.0}, trace_dir="traces", sinks=[view])
    t0 = time.monotonic()
    res = rlm.completion(QUERY, context=path)
    view.close()
    tokens = sum(u.usage.total_tokens for u in res.usage.values())
    print(f"answer:    {res.answer.strip()[:500]}")
    print(f"status:    {res.status} (ready={res.ready})")
    print(f"turns:     {res.turns}")
    print(f"sub-calls: {res.subcalls}")
    print(f"tokens:    {tokens:,} "
          + ", ".join(f"{role} {u.usage.total_tokens:,}" for role, u in res.usage.items()))
    print(f"time:      {time.monotonic() - t0:.1f} s")
    print(f"trace:     {res.trace_path}  (view it: .venv/bin/recursa view {res.trace_path})")
    correct = str(truth) in res.answer
    print(f"check:     the file holds {truth} occurrences: "
          + ("the answer is right" if correct else "the answer is wrong (a 0.5B model errs)"))
    return 0 if res.status != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
