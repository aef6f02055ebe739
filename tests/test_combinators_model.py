"""Typed leaves and plans with the real local model (Qwen2.5-Coder-1.5B on llama.cpp): the
constraint holds whatever the model would have said, and a plan comes back valid."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.usefixtures("qwen")]
MODEL = "local:qwen2.5-coder-1.5b"
REVIEWS = [
    "The battery died after two days and support never answered.",
    "Works perfectly, I use it every morning.",
    "Broke the first time I dropped it; waste of money.",
    "Lovely colour and the sound is great.",
    "Arrived late, box crushed, one part missing.",
    "Best purchase this year, my kids adore it.",
]


def test_a_label_map_answers_only_from_the_set(tmp_path: Path):
    """Odd labels a small model would not write by itself ('PLUS' / 'MINUS'): the grammar makes
    every reply one of them, so no slot is None. The constraint is the server's, whatever the
    model: the 135M shows it as well as the 1.5B, and answers far sooner."""
    code = ("labels = llm_map('Is this review happy or unhappy? happy is PLUS, unhappy is "
            "MINUS.', context, labels=['PLUS', 'MINUS'])\nprint(labels)\nFINAL(str(labels))")
    root = ReplayClient([f"```repl\n{code}\n```"])
    trace = tmp_path / "t.jsonl"
    res = RLM(model=root, sub_model="local:smollm2-135m", trace_path=trace,
              preflight=False).completion("label them", context=REVIEWS)
    labels = ast.literal_eval(res.answer)     # the list the cell committed
    assert len(labels) == len(REVIEWS) and set(labels) <= {"PLUS", "MINUS"}
    responses = [e.data["response"] for e in load_events(trace)
                 if e.kind == "subcall" and e.phase == "end"]
    # labels with different first letters: one reply token under a grammar of the bare labels,
    # the start of exactly one label
    assert all(r and sum(x.startswith(r.strip()) for x in ("PLUS", "MINUS")) == 1
               for r in responses), responses


def test_the_root_fills_a_valid_plan_and_it_runs(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    res = RLM(model=MODEL, strategy="plan", max_iterations=3,
              model_options={"temperature": 0.0, "max_tokens": 300},
              trace_path=trace).completion(
        "How many of these reviews are negative?", context="\n".join(REVIEWS))
    assert res.status != "error", res.error
    events = load_events(trace)
    # the constrained reply always parses as a plan (the model's choice may be any of them)
    assert not [e for e in events if e.kind == "turn" and e.data.get("plan_error")]
    for e in events:
        if e.kind == "plan" and e.phase == "point":
            assert e.data["bound"]["calls"] >= 1


def test_a_rank_reads_the_local_models_logprobs(tmp_path: Path):
    """llama.cpp gives the first token's alternatives (logprobs), so the rank's scores are
    log-odds, not the bare word's +1 / -1, and the one item that answers comes first."""
    items = ["The cat slept on the warm mat all afternoon.",
             "Bananas turn yellow as they ripen.",
             "Paris has been the capital city of France for centuries.",
             "The train to Leeds leaves at noon."]
    code = ("ranked = llm_rank('What is the capital of France?', context)\nprint(ranked)\n"
            "FINAL(ranked[0])")
    trace = tmp_path / "t.jsonl"
    res = RLM(model=ReplayClient([f"```repl\n{code}\n```"]), sub_model=MODEL,
              trace_path=trace, preflight=False).completion("rank them", context=items)
    assert res.answer == items[2], res.answer
    end = [e for e in load_events(trace) if e.kind == "combinator" and e.phase == "end"][0]
    scores = end.data["scores"]
    assert len(scores) == 4 and all(s is not None for s in scores)
    assert not set(scores) <= {1.0, 0.0, -1.0}, scores       # read from logprobs
