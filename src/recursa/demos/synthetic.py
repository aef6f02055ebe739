"""Synthetic traces: realistic-looking runs of any size, for tests and viewer benchmarks.

Events are written through `JsonlSink` exactly as a real run writes them, with made-up but
consistent timestamps: sub-calls of one cell overlap in time (as an `llm_batch` does), and every
`child_every`-th cell starts a child RLM with turns of its own.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from recursa.base.types import Event
from recursa.obs.trace import JsonlSink, new_id

_WORDS = ("alpha beta gamma delta context chunk record customer order invoice total "
          "answer evidence summary line error value count month region").split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


class _Writer:
    def __init__(self, sink: JsonlSink, run_id: str):
        self.sink, self.run_id, self.count = sink, run_id, 0

    def emit(self, kind: str, id: str, parent: str | None, phase: str, t: float, depth: int,
             **data: Any) -> None:
        self.sink.emit(Event(kind=kind, id=id, parent=parent, run_id=self.run_id,  # type: ignore[arg-type]
                             phase=phase, t=t, depth=depth, data=data))  # type: ignore[arg-type]
        self.count += 1


def write_synthetic_trace(path: str | Path, *, events: int = 10_000, subcalls_per_cell: int = 16,
                          child_every: int = 4, seed: int = 0, finish: bool = True,
                          model: str = "openai:gpt-5", sub_model: str = "openai:gpt-5-mini",
                          marker: str = "NEEDLE-42") -> int:
    """Write a run of about `events` events to `path`; returns the number written.

    `marker` is placed in one cell's code (about half way) so search can be tested.
    `finish=False` leaves the run without its end events, as a killed run would.
    """
    rng = random.Random(seed)
    path = Path(path)
    if path.exists():
        path.unlink()
    sink = JsonlSink(path, redact=lambda s: s)
    w = _Writer(sink, new_id())
    t = 1_700_000_000.0
    root = new_id()
    w.emit("run", root, None, "start", t, 0, query="Which region had the most refunds?",
           model=model, budget={"max_iterations": 30})
    w.emit("run", new_id(), root, "point", t, 0, context_sha256="ab" * 32, context_bytes=10_485_760,
           context_chars=10_400_000, description="type: str\nsize: 10,400,000 chars\npreview: ...")
    turns: dict[str, int] = {}     # turns so far, per RLM (the run and each child)
    marked = False

    def one_turn(parent: str, depth: int, t: float, budget: int) -> float:
        nonlocal marked
        turns[parent] = turn_no = turns.get(parent, 0) + 1
        tid = new_id()
        w.emit("turn", tid, parent, "start", t, depth, turn=turn_no)
        t += rng.uniform(0.5, 3.0)
        for i in range(rng.randint(1, 2)):
            cid = new_id()
            code = (f"chunks = [context[i:i+100000] for i in range(0, len(context), 100000)]\n"
                    f"res = llm_batch([f'Count refunds by region in: {{c}}' for c in chunks])\n"
                    f"print(res[:3])  # {_text(rng, 6)}")
            if not marked and w.count >= budget // 2:
                code += f"\n# {marker}"
                marked = True
            w.emit("cell", cid, tid, "start", t, depth, index=i, code=code)
            t0 = t
            end = t
            for _ in range(subcalls_per_cell):
                sid = new_id()
                st = t0 + rng.uniform(0.0, 0.05)
                w.emit("subcall", sid, cid, "start", st, depth, model=sub_model,
                       prompt="Count refunds by region in: " + _text(rng, 60), prompt_chars=400)
                dur = rng.uniform(0.4, 2.5)
                u = {"input_tokens": rng.randint(800, 30000), "output_tokens": rng.randint(20, 300),
                     "cached_tokens": 0}
                if rng.random() < 0.02:
                    w.emit("subcall", sid, cid, "end", st + dur, depth, error="Error: rate limited",
                           elapsed_s=dur)
                else:
                    w.emit("subcall", sid, cid, "end", st + dur, depth, model=sub_model,
                           response=_text(rng, 25), usage=u,
                           cost_usd=round(u["input_tokens"] * 2.5e-7 + u["output_tokens"] * 2e-6, 6),
                           latency_s=dur, elapsed_s=dur)
                end = max(end, st + dur)
            t = end
            if depth == 0 and child_every and turn_no % child_every == 0 and w.count < budget:
                ch = new_id()
                w.emit("child", ch, cid, "start", t, depth + 1, query="Summarise chunk 3",
                       model=model, budget={})
                t = one_turn(ch, depth + 1, t, budget)
                w.emit("final", new_id(), ch, "point", t, depth + 1, answer="north: 41 refunds",
                       status="final", ready=True, limit=None, error=None)
                w.emit("child", ch, cid, "end", t, depth + 1, status="final", turns=1)
            t += rng.uniform(0.01, 0.2)
            w.emit("cell", cid, tid, "end", t, depth, output=str([_text(rng, 8)] * 3),
                   error=False, elapsed_s=round(t - t0, 4), timed_out=False, restarted=False,
                   ready=False)
        u = {"input_tokens": rng.randint(2000, 40000), "output_tokens": rng.randint(100, 900),
             "cached_tokens": 0}
        w.emit("turn", tid, parent, "end", t, depth,
               text="Let me split the context.\n```repl\n...\n```\n" + _text(rng, 80), usage=u,
               cost_usd=round(u["input_tokens"] * 1.25e-6 + u["output_tokens"] * 1e-5, 6),
               model=model, latency_s=1.2, blocks=1)
        return t

    while w.count < events - 4:
        t = one_turn(root, 0, t, events)
    if finish:
        w.emit("final", new_id(), root, "point", t, 0, answer="The north region (412 refunds).",
               status="final", ready=True, limit=None, error=None)
        w.emit("run", root, None, "end", t, 0, status="final", turns=turns[root],
               elapsed_s=round(t - 1_700_000_000.0, 4))
    sink.close()
    return w.count


# ==================================================================== a real (scripted) run
def _is_rlm_turn(messages: list[dict[str, Any]]) -> bool:
    first = messages[0] if messages else {}
    return first.get("role") == "system" and "REPL" in str(first.get("content", ""))


def demo_context(size: int, seed: int = 0) -> str:
    """Support-ticket-like text of about `size` characters."""
    rng = random.Random(seed)
    regions = ("north", "south", "east", "west")
    lines: list[str] = []
    n = 0
    i = 0
    while n < size:
        i += 1
        kind = rng.choice(("refund", "question", "complaint", "refund", "praise"))
        line = (f"ticket {i:06d} region={rng.choice(regions)} type={kind} "
                f"text={_text(rng, rng.randint(5, 15))}")
        lines.append(line)
        n += len(line) + 1
    return "\n".join(lines)[:size]


def demo_run(trace_path: str | Path, *, context: str | None = None, context_size: int = 200_000,
             extra_turns: int = 0, sandbox: str = "inprocess", seed: int = 0,
             sinks: list[Any] | None = None) -> Any:
    """Run a real RLM over `context` with scripted models, writing its trace; returns the Result.

    Everything but the models is real: the loop, the sandbox running the code, the dispatcher
    fanning out an `llm_batch` (sub-calls take 50-250 ms, in parallel), a child RLM via
    `rlm_query`, budget accounting and the trace. `extra_turns` adds peek-only turns, for checking
    how the trace grows with turns. The sub-call prompts hold fixed-size excerpts, so the trace
    does not depend on the context's size.
    """
    import asyncio

    from recursa.core.rlm import RLM
    from recursa.models.replay import ReplayClient

    rng = random.Random(seed)
    if context is None:
        context = demo_context(context_size, seed)
    root_steps = [
        "Let me look at the context first.\n```repl\nprint(len(context))\nprint(context[:300])\n```",
        *[f"Peeking again (step {k}).\n```repl\nprint(context[{k * 100}:{k * 100 + 200}])\n```"
          for k in range(extra_turns)],
        "I'll split it into 8 parts and count refunds in each, in parallel.\n```repl\n"
        "step = max(1, len(context) // 8)\n"
        "parts = [context[i:i + step] for i in range(0, len(context), step)][:8]\n"
        "counts = llm_batch([f'How many refund tickets in part {i}? ' + p[:1500]"
        " for i, p in enumerate(parts)])\n"
        "print(counts)\n```",
        "Now a child RLM summarises the per-part answers.\n```repl\n"
        "summary = rlm_query('CHILD-TASK: summarise these refund counts', context=str(counts))\n"
        "print(summary)\n```",
        "Done.\n```repl\n"
        "total = sum(int(c.split()[-1]) for c in counts)\n"
        "FINAL(f'{total} refund tickets; {summary}')\n```",
    ]
    child_steps = [
        "Reading the counts.\n```repl\nprint(context[:200])\n"
        "s = llm_query('Summarise in one line: ' + context[:500])\nprint(s)\n```",
        "```repl\nFINAL(s)\n```",
    ]

    async def root(messages: list[dict[str, Any]]) -> str:
        if not _is_rlm_turn(messages):
            raise AssertionError("sub-calls go to the sub model")
        n = sum(m["role"] == "assistant" for m in messages)
        steps = child_steps if "CHILD-TASK" in messages[1]["content"] else root_steps
        await asyncio.sleep(0.02)
        return steps[min(n, len(steps) - 1)]

    async def sub(messages: list[dict[str, Any]]) -> str:
        await asyncio.sleep(rng.uniform(0.05, 0.25))
        prompt = str(messages[-1]["content"])
        if prompt.startswith("Summarise"):
            return "Refunds are spread over all parts, most in part 3."
        return f"refund tickets: {prompt.count('type=refund')}"

    rlm = RLM(model=ReplayClient(root, name="replay:big", model="big-model", cost_usd=0.002),
              sub_model=ReplayClient(sub, name="replay:small", model="small-model",
                                     cost_usd=0.0001),
              sandbox=sandbox, max_depth=1, trace_path=trace_path, sinks=sinks)
    return rlm.completion("How many refund tickets are there, and where?", context=context)
