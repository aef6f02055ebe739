"""Environments: variants, tips, BM25 tools, rewards matching the scorers, scored rollouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recursa.bench import get_task
from recursa.core.retrieval import BM25Index
from recursa.envs import ENVS, VARIANTS, get_env, run_rollout, run_rollouts, strip_tips
from recursa.envs.research import make_corpus_tools
from recursa.envs.rollout import reward_of
from recursa.models import ReplayClient
from recursa.obs.trace import load, load_events


def test_four_environments_three_variants() -> None:
    assert set(ENVS) == {"research", "math_python", "oolong", "verbatim_copy"}
    assert VARIANTS == ("llm", "rlm", "rlm_tips")
    for env in ENVS.values():
        assert env.tips_for("rlm_tips") == env.tips and env.tips
        assert env.tips_for("rlm") is None and env.tips_for("llm") is None
    with pytest.raises(ValueError):
        get_env("oolong").tips_for("rlm_plus")
    with pytest.raises(KeyError):
        get_env("nope")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_reward_matches_the_evaluation_scorer(name: str) -> None:
    env = get_env(name)
    inst = env.instance(3, 1000 if name != "math_python" else None)
    task = get_task(env.task)
    gold = str(inst.gold) if name != "math_python" else f"\\boxed{{{inst.gold}}}"
    assert env.reward(gold, inst) == task.score(gold, inst).score == 1.0
    assert env.reward("", inst) == task.score("", inst).score
    assert 0.0 <= env.reward("something else", inst) < 1.0


def test_strip_tips() -> None:
    text = "System text.\n<tips>\nDo X.\nThen Y.\n</tips>\nAfter."
    assert strip_tips(text) == "System text.\nAfter."
    assert strip_tips("no tips") == "no tips"


def test_bm25_and_corpus_tools() -> None:
    docs = {"d1": "Title: Whales\n\nThe blue whale is the largest animal.",
            "d2": "Title: Ships\n\nA ship sails on the sea; whales swim near ships.",
            "d3": "Title: Cats\n\nCats sleep a lot."}
    ranked = BM25Index(list(docs.values())).search("blue whale")
    assert ranked[0]["id"] == 0 and all(h["id"] != 2 for h in ranked)
    search, open_page = make_corpus_tools(docs, page_chars=20)
    hits = search("largest animal", k=2)
    assert hits.splitlines()[0].startswith("d1 | Whales | score")
    assert search("zebra") == "No results."
    page = open_page("d1")
    assert page.startswith("Title: Whales\n\nThe b") and "offset=20" in page
    with pytest.raises(KeyError):
        open_page("d9")
    from recursa.core.tools import make_tool
    assert make_tool(search).parameters["required"] == ["query"]


def test_research_env_hides_the_corpus_from_the_root() -> None:
    env = get_env("research")
    inst = env.instance(0, 4000)
    ctx = env.rlm_context(inst)
    assert set(ctx) == {"question", "corpus"} and inst.query == ctx["question"]
    assert [t.__name__ for t in env.tools(inst)] == ["search", "open_page"]
    msgs = env.llm_messages(inst)
    assert "doc-0" not in json.dumps(msgs)


def test_llm_messages_hold_the_context() -> None:
    env = get_env("oolong")
    inst = env.instance(0, 800)
    [system, user] = env.llm_messages(inst)
    assert system["role"] == "system" and str(inst.context)[:200] in user["content"]
    assert user["content"].endswith(inst.query)
    math = get_env("math_python")      # question_only: the problem is the question
    inst = math.instance(0)
    assert math.llm_messages(inst)[1] == {"role": "user", "content": inst.query}


# ------------------------------------------------------------------ scored rollouts
async def test_rlm_rollout_records_reward_in_the_trace(tmp_path: Path) -> None:
    env = get_env("verbatim_copy")
    root = ReplayClient(["```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"])
    ro = await run_rollout(env, "rlm_tips", 1, model=root, length_tokens=60,
                           trace_dir=tmp_path, sandbox="inprocess")
    assert ro.reward == 1.0 and ro.status == "final" and ro.turns == 1
    assert ro.root_input_tokens > 0 and ro.sub_input_tokens == 0
    assert "<tips>" in root.calls[0][0]["content"]
    run = load(ro.trace_path)
    rec = reward_of(load_events(ro.trace_path))
    assert rec is not None and rec["reward"] == 1.0 and rec["variant"] == "rlm_tips"
    assert any(p.data.get("reward") == 1.0 for p in run.root.points)   # attached to the run


async def test_llm_rollout_is_traced_like_a_run(tmp_path: Path) -> None:
    env = get_env("math_python")
    inst = env.instance(2)
    client = ReplayClient([f"The answer is \\boxed{{{inst.gold}}}."])
    ro = await run_rollout(env, "llm", 2, model=client, trace_dir=tmp_path)
    assert ro.reward == 1.0 and ro.turns == 1 and ro.root_output_tokens > 0
    run = load(ro.trace_path)
    assert run.finished and run.status == "final" and run.totals.turns == 1
    assert run.by_role["root"].usage.output_tokens == ro.root_output_tokens


async def test_research_rollouts_use_tools_in_both_variants(tmp_path: Path) -> None:
    env = get_env("research")
    inst = env.instance(0, 4000)
    gold = str(inst.gold)
    call = '```tool\n{"name": "search", "arguments": {"query": "maker"}}\n```'
    # llm: the model itself holds the tools
    ro = await run_rollout(env, "llm", 0, model=ReplayClient([call, gold]),
                           length_tokens=4000, trace_dir=tmp_path)
    assert (ro.reward, ro.tool_calls, ro.subcalls) == (1.0, 1, 0)
    # rlm: only the sub-model holds them; the root sees the sub-model's answer
    root = ReplayClient(["```repl\nr = llm_query('Find the answer with search.')\nFINAL(r)\n```"])
    sub = ReplayClient([call, gold])
    ro = await run_rollout(env, "rlm", 0, model=root, sub_model=sub, length_tokens=4000,
                           trace_dir=tmp_path, sandbox="inprocess")
    assert (ro.reward, ro.tool_calls, ro.subcalls) == (1.0, 1, 1)
    assert ro.sub_input_tokens > 0
    assert "search, open_page" in root.calls[0][0]["content"]
    assert "doc-0" not in json.dumps(root.calls)


async def test_failed_rollout_scores_zero(tmp_path: Path) -> None:
    from recursa.base.types import ModelError
    ro = await run_rollout("oolong", "llm", 0, model=ReplayClient([ModelError("down")]),
                           length_tokens=500, trace_dir=tmp_path)
    assert ro.status == "error" and ro.reward == 0.0 and "down" in (ro.error or "")


async def test_run_rollouts_same_seeds_per_variant(tmp_path: Path) -> None:
    def answer(messages: list[dict[str, Any]]) -> str:
        if messages[0]["content"].startswith("You answer a query"):
            return "```repl\nFINAL('wrong')\n```"
        return "wrong"
    seen: list[Any] = []
    rs = await run_rollouts("oolong", ["llm", "rlm"], 2, model=ReplayClient(answer),
                            concurrency=2, seed0=5, length_tokens=500, trace_dir=tmp_path,
                            sandbox="inprocess", on_done=seen.append)
    assert sorted((r.variant, r.seed) for r in rs) == [("llm", 5), ("llm", 6), ("rlm", 5),
                                                      ("rlm", 6)]
    assert len(seen) == 4 and len(list(tmp_path.glob("*.jsonl"))) == 4
    with pytest.raises(ValueError):
        await run_rollouts("oolong", ["bogus"], 1, model=ReplayClient(answer))
