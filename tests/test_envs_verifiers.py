"""The classic verifiers adapter (verifiers 0.1.14 - 0.3): rollouts through verifiers' own
rollout loop with a scripted client. verifiers 0.4 is tested in test_envs_verifiers_v1.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("datasets")
from recursa.envs.verifiers_env import HARNESS_API  # noqa: E402

if HARNESS_API:
    from importlib.metadata import version
    pytest.skip(f"verifiers {version('verifiers')} is installed: the classic API (0.1.14 - 0.3) "
                "is gone; test_envs_verifiers_v1.py tests this version", allow_module_level=True)

from recursa.envs.verifiers_classic import RecursaClient, load_environment  # noqa: E402
from recursa.models import ReplayClient  # noqa: E402


def _input(env: Any, i: int = 0) -> dict[str, Any]:
    row = env.get_eval_dataset()[i]
    return {"prompt": row["prompt"], "example_id": row["example_id"], "answer": row["answer"],
            "info": row["info"]}


async def test_generate_scores_an_rlm_rollout() -> None:
    env = load_environment("verbatim_copy", "rlm_tips", num_examples=2, length_tokens=50,
                           sandbox="inprocess")
    ds = env.get_eval_dataset()
    assert len(ds) == 2 and "<tips>" in ds[0]["prompt"][0]["content"]
    root = ReplayClient(["```repl\nprint(len(context))\n```",
                         "```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"] * 2)
    res = await env.generate(ds, client=RecursaClient(root), model="policy", max_concurrent=1)
    outs = res["outputs"]
    assert [o["reward"] for o in outs] == [1.0, 1.0]
    assert all(o["metrics"]["num_turns"] == 2 for o in outs)
    # the environment's response to turn 1 is the REPL output
    text = json.dumps(outs[0]["completion"], default=str)
    assert "Write the next ```repl block" in text


async def test_sub_calls_are_recorded_with_their_parent_turn() -> None:
    env = load_environment("research", "rlm", num_examples=1, length_tokens=4000,
                           sub_model=ReplayClient([
                               '```tool\n{"name": "search", "arguments": {"query": "x"}}\n```',
                               "ANSWER-FROM-SUB"]),
                           sandbox="inprocess")
    root = ReplayClient(["```repl\nr = llm_query('find it')\nprint(r)\n```",
                         "```repl\nFINAL(r)\n```"])
    state = await env.rollout(_input(env), RecursaClient(root), "policy")
    traj = state["trajectory"]
    assert len(traj) == 2
    [sub] = traj[0]["extras"]["sub_calls"]
    assert sub["prompt"] == "find it" and sub["response"] == "ANSWER-FROM-SUB"
    assert sub["tool_calls"] == 1 and sub["usage"]["input_tokens"] > 0
    assert "sub_calls" not in traj[1]["extras"] or traj[1]["extras"]["sub_calls"] == []
    assert state["recursa"]["answer"] == "ANSWER-FROM-SUB"
    assert state["recursa"]["tool_calls"] == 1 and state["recursa"]["sub_calls"] == 1
    # tool output reached neither the root's prompts nor the completion
    assert "Title:" not in json.dumps(root.calls)
    await env.rubric.score_rollout(state)
    assert state["reward"] == 0.0   # wrong answer, scored by the browsecomp scorer


async def test_policy_serves_sub_calls_when_no_sub_model() -> None:
    env = load_environment("oolong", "rlm", num_examples=1, length_tokens=500,
                           sandbox="inprocess")
    gold = env.get_eval_dataset()[0]["answer"]

    def policy(messages: list[dict[str, Any]]) -> str:
        if messages[-1]["content"] == "say the answer":
            return gold
        if "Write the next" in messages[-1]["content"]:
            return "```repl\nFINAL(r)\n```"
        return "```repl\nr = llm_query('say the answer')\nprint(r)\n```"

    state = await env.rollout(_input(env), RecursaClient(ReplayClient(policy)), "policy")
    assert state["trajectory"][0]["extras"]["sub_calls"][0]["model"] == "policy:policy"
    await env.rubric.score_rollout(state)
    assert state["reward"] == 1.0


async def test_the_loops_own_rules_apply() -> None:
    """The policy's replies go through recursa's step machine: a cell sent again is not run
    again, and an answer stated in prose commits it (design note 10)."""
    env = load_environment("verbatim_copy", "rlm", num_examples=1, length_tokens=50,
                           sandbox="inprocess")
    cell = "```repl\nprint(len(context))\n```"
    root = ReplayClient([cell, cell, "Final answer: copied"])
    state = await env.rollout(_input(env), RecursaClient(root), "policy")
    assert len(state["trajectory"]) == 3
    assert "same code as in turn 1" in root.calls[2][-1]["content"]
    assert state["recursa"]["answer"] == "copied" and state["recursa"]["ready"]


async def test_llm_variants() -> None:
    env = load_environment("math_python", "llm", num_examples=1)
    gold = env.get_eval_dataset()[0]["answer"]
    res = await env.generate(env.get_eval_dataset(),
                             client=RecursaClient(ReplayClient([f"\\boxed{{{gold}}}"])),
                             model="policy")
    assert res["outputs"][0]["reward"] == 1.0
    assert res["outputs"][0]["metrics"]["num_turns"] == 1
    # a tool environment's llm variant runs the tools as the environment's response
    env = load_environment("research", "llm", num_examples=1, length_tokens=4000)
    gold = env.get_eval_dataset()[0]["answer"]
    assert "<tool_call>" in env.get_eval_dataset()[0]["prompt"][0]["content"]
    client = ReplayClient(['```tool\n{"name": "search", "arguments": {"query": "maker"}}\n```',
                           gold])
    state = await env.rollout(_input(env), RecursaClient(client), "policy")
    assert len(state["trajectory"]) == 2 and state["recursa"]["tool_calls"] == 1
    assert "Result of search:\ndoc-" in client.calls[1][-1]["content"]
    await env.rubric.score_rollout(state)
    assert state["reward"] == 1.0


@pytest.mark.model
async def test_local_model_rollout_through_verifiers() -> None:
    from recursa.models import make_client
    env = load_environment("math_python", "rlm_tips", num_examples=1, max_turns=2,
                           sandbox="local")
    client = RecursaClient(make_client("local:smollm2-135m"))
    res = await env.generate(env.get_eval_dataset(), client=client, model="qwen",
                             sampling_args={"max_tokens": 300, "temperature": 0.0})
    out = res["outputs"][0]
    assert out["error"] is None and 0.0 <= out["reward"] <= 1.0
    assert 1 <= out["metrics"]["num_turns"] <= 2
