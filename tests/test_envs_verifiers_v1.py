"""The verifiers 0.4 adapter: episodes through verifiers' own env, harness session and
interception server, with the policy behind a scripted OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

pytest.importorskip("verifiers")
from recursa.envs.verifiers_env import HARNESS_API  # noqa: E402

if not HARNESS_API:
    from importlib.metadata import version
    pytest.skip(f"verifiers {version('verifiers')} is installed: the harness API is 0.4+; "
                "test_envs_verifiers.py tests this version", allow_module_level=True)

import verifiers.v1 as vf  # noqa: E402

from openai_testserver import Fault, OpenAITestServer  # noqa: E402
from recursa.envs.verifiers_env import PLUGIN_ID, RecursaEnv, RecursaHarness, load_environment  # noqa: E402


def _text(m: dict[str, Any]) -> str:
    c = m.get("content")
    return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [])


def _is_root(req: dict[str, Any]) -> bool:   # the RLM's system prompt teaches ```repl blocks
    return req["messages"][0]["role"] == "system" and "```repl" in _text(req["messages"][0])


async def _episodes(env: RecursaEnv, url: str, n: int | None = None) -> list[vf.Episode]:
    ctx = vf.ModelContext(model="policy",
                          client=vf.EvalClientConfig(base_url=url, api_key_var="RECURSA_NO_KEY"))
    async with env.serving():
        tasks = list(env.taskset)[:n]
        return [await env.run_episode(t, ctx) for t in tasks]


async def test_rlm_tips_rollouts_are_scored_and_recorded() -> None:
    env = load_environment("verbatim_copy", "rlm_tips", num_examples=2, length_tokens=50,
                           sandbox="inprocess")
    systems = []

    def policy(req: dict[str, Any]) -> str:
        systems.append(_text(req["messages"][0]))
        if len(req["messages"]) == 2:
            return "```repl\nprint(len(context))\n```"
        return "```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"

    with OpenAITestServer(responder=policy) as srv:
        eps = await asyncio.wait_for(_episodes(env, srv.base_url), 120)
    for ep in eps:
        [t] = ep.traces
        assert ep.ok and t.ok and t.stop_condition == "agent_completed", t.errors
        assert t.reward == 1.0 and t.root_reply == ep.task.data.gold
        assert t.num_turns == 2 and t.num_branches == 1
        # the root conversation: system, first user, reply, REPL feedback, reply
        roles = [m.role for m in t.branches[0].messages]
        assert roles == ["system", "user", "assistant", "user", "assistant"]
        assert "Write the next ```repl block" in t.branches[0].messages[3].content
        info = t.info["recursa"]
        assert info["status"] == "final" and info["turns"] == 2 and info["subcalls"] == 0
        assert t.metrics["recursa_committed"] == 1.0
    assert all("<tips>" in s for s in systems)


async def test_policy_sub_calls_are_branches_linked_to_their_turn(tmp_path: Any) -> None:
    env = load_environment("oolong", "rlm", num_examples=1, length_tokens=500,
                           sandbox="inprocess", trace_dir=str(tmp_path))
    [task] = list(env.taskset)
    gold = task.data.gold

    def policy(req: dict[str, Any]) -> str:
        last = _text(req["messages"][-1])
        if last in ("say the answer", "say it again"):
            return gold
        if "Write the next" in last:
            return "```repl\nFINAL(r)\n```"
        return ("```repl\nr = llm_query('say the answer')\n"
                "rs = llm_batch(['say it again'])\nprint(r, rs)\n```")

    with OpenAITestServer(responder=policy) as srv:
        [ep] = await asyncio.wait_for(_episodes(env, srv.base_url), 120)
    [t] = ep.traces
    assert t.ok and t.reward == 1.0
    assert t.num_turns == 4 and t.num_branches == 3
    root, *subs = sorted(t.branches, key=lambda b: -len(b.nodes))
    assert [m.role for m in root.messages] == ["system", "user", "assistant", "user",
                                               "assistant"]
    assert sorted(_text(b.messages[0].model_dump()) for b in subs) == ["say it again",
                                                                       "say the answer"]
    for b in subs:   # each sub-call is a whole training sample of its own
        assert [m.role for m in b.messages] == ["user", "assistant"] and b.trainable
        assert b.messages[-1].content == gold and b.nodes[-1].sampled
        # linked to the root turn whose code made it (the first root reply)
        assert b.nodes[-1].semantic_parents == [vf.ParentLink(node=t.nodes.index(root.nodes[2]),
                                                              type="subagent_call")]
    assert t.info["recursa"]["subcalls"] == 2 and t.info["recursa"]["subcall_edges"] == 2
    assert len(t.calls) == 4 and all(c.acp is not None for c in t.calls)
    # recursa's own trace of the same run, with the reward recorded in it
    from recursa.envs import reward_of
    from recursa.obs.trace import read_trace
    events = read_trace(t.info["recursa"]["trace_path"]).events
    assert reward_of(events)["reward"] == 1.0
    assert sum(e.kind == "subcall" and e.phase == "end" for e in events) == 2


async def test_research_sub_calls_use_tools_and_tool_output_stays_out_of_the_root() -> None:
    env = load_environment("research", "rlm_tips", num_examples=1, length_tokens=4000,
                           sandbox="inprocess")
    lock, seen = threading.Lock(), {"sub": 0}

    def policy(req: dict[str, Any]) -> str:
        if _is_root(req):
            if "Write the next" in _text(req["messages"][-1]):
                return "```repl\nFINAL(r)\n```"
            return "```repl\nr = llm_query('find who made it')\nprint(r)\n```"
        with lock:
            seen["sub"] += 1
            first = seen["sub"] == 1
        assert "<tools>" in _text(req["messages"][0])
        return ('<tool_call>\n{"name": "search", "arguments": {"query": "maker"}}\n</tool_call>'
                if first else "Nobody")

    with OpenAITestServer(responder=policy) as srv:
        [ep] = await asyncio.wait_for(_episodes(env, srv.base_url), 120)
    [t] = ep.traces
    assert t.ok and t.root_reply == "Nobody" and t.reward == 0.0
    info = t.info["recursa"]
    assert info["tool_calls"] == 1 and info["subcalls"] == 1
    # the sub-call's tool loop: two model turns, one conversation, both linked to root turn 1
    sub = [b for b in t.branches if b.messages[0].role == "system"
           and "<tools>" in b.messages[0].content]
    assert len(sub) == 1 and [m.role for m in sub[0].messages] == [
        "system", "user", "assistant", "user", "assistant"]
    assert sub[0].messages[3].content.startswith("Result of search:\ndoc-")
    assert info["subcall_edges"] == 2
    root = max(t.branches, key=lambda b: "```repl" in (b.messages[0].content or ""))
    assert not any("doc-" in (m.content if isinstance(m.content, str) else "")
                   for m in root.messages)


async def test_a_sub_model_serves_sub_calls_outside_the_interception(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = load_environment("oolong", "rlm", num_examples=1, length_tokens=500,
                           sandbox="inprocess", sub_model="vllm:helper")
    [task] = list(env.taskset)

    def policy(req: dict[str, Any]) -> str:
        if "Write the next" in _text(req["messages"][-1]):
            return "```repl\nFINAL(r)\n```"
        return "```repl\nr = llm_query('say the answer')\nprint(r)\n```"

    with OpenAITestServer(responder=policy) as srv, \
            OpenAITestServer(responder=lambda req: task.data.gold) as helper:
        monkeypatch.setenv("VLLM_BASE_URL", helper.base_url)
        [ep] = await asyncio.wait_for(_episodes(env, srv.base_url), 120)
        assert helper.request_count == 1 and srv.request_count == 2
    [t] = ep.traces
    assert t.ok and t.reward == 1.0
    # only the policy's root turns are in verifiers' trace; recursa counted the sub-call
    assert t.num_turns == 2 and t.num_branches == 1
    assert t.info["recursa"]["subcalls"] == 1 and t.info["recursa"]["subcall_edges"] == 0


async def test_llm_variants() -> None:
    env = load_environment("math_python", "llm", num_examples=1)
    [task] = list(env.taskset)
    with OpenAITestServer(responder=lambda req: f"\\boxed{{{task.data.gold}}}") as srv:
        [ep] = await asyncio.wait_for(_episodes(env, srv.base_url), 60)
    [t] = ep.traces
    assert t.ok and t.reward == 1.0 and t.num_turns == 1
    # the llm variant of a tool environment: the policy holds the tools itself
    env = load_environment("research", "llm", num_examples=1, length_tokens=4000)
    [task] = list(env.taskset)

    def policy(req: dict[str, Any]) -> str:
        if len(req["messages"]) == 2:
            assert "<tool_call>" in _text(req["messages"][0])
            return '```tool\n{"name": "search", "arguments": {"query": "maker"}}\n```'
        assert "Result of search" in _text(req["messages"][-1]) or "doc-" in \
            _text(req["messages"][-1])
        return task.data.gold

    with OpenAITestServer(responder=policy) as srv:
        [ep] = await asyncio.wait_for(_episodes(env, srv.base_url), 60)
    [t] = ep.traces
    assert t.ok and t.reward == 1.0 and t.num_turns == 2 and t.num_branches == 1
    assert t.info["recursa"]["tool_calls"] == 1


async def test_a_failed_model_fails_the_trace_and_keeps_what_ran() -> None:
    env = load_environment("math_python", "rlm", num_examples=1, sandbox="inprocess")

    def policy(req: dict[str, Any]) -> Any:
        return Fault.status(400, body='{"error": {"message": "bad request"}}')

    with OpenAITestServer(responder=policy) as srv:
        [ep] = await asyncio.wait_for(_episodes(env, srv.base_url), 60)
    [t] = ep.traces
    assert not t.ok and not ep.ok
    assert t.errors and "400" in t.errors[-1].message
    assert t.info["recursa"]["status"] == "error" and t.info["recursa"]["error"]
    assert t.calls and t.calls[0].error is not None


def test_the_plugin_id_resolves_for_verifiers_cli() -> None:
    # what `vf-eval recursa-vf --env.taskset.env math_python` builds
    config = vf.resolve_env_config({"taskset": {"id": PLUGIN_ID, "env": "math_python",
                                                "num_examples": 3}})
    env = vf.load_environment(config)
    assert isinstance(env, RecursaEnv) and isinstance(env._harnesses["agent"], RecursaHarness)
    assert env.config.agent.runtime.type == "subprocess"
    tasks = list(env.taskset)
    assert [t.data.seed for t in tasks] == [0, 1, 2] and tasks[0].data.variant == "rlm"


async def test_a_container_runtime_is_refused_with_the_reason() -> None:
    config = vf.resolve_env_config({"taskset": {"id": PLUGIN_ID, "env": "math_python",
                                                "num_examples": 1},
                                    "agent": {"runtime": {"type": "subprocess"}}})
    harness = vf.load_environment(config)._harnesses["agent"]

    class Box:
        config = vf.DockerConfig()

    with pytest.raises(ValueError, match="'docker' runtime would host nothing.*sandbox"):
        await harness.setup(Box())


def test_bad_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown variant 'rlm_tip'.*rlm_tips"):
        load_environment("oolong", "rlm_tip")
    with pytest.raises(KeyError, match="unknown environment 'olong'.*oolong"):
        load_environment("olong", "rlm")



@pytest.mark.slow
def test_vf_eval_runs_the_plugin(tmp_path: Any) -> None:
    """verifiers' own CLI: `vf-eval recursa-vf ...` finds the plugin package and scores."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    def policy(req: dict[str, Any]) -> str:
        if len(req["messages"]) == 2:
            return "```repl\nprint(len(context))\n```"
        return "```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with OpenAITestServer(responder=policy) as srv:
        p = subprocess.run(
            [str(Path(sys.executable).parent / "vf-eval"), PLUGIN_ID,
             "--env.taskset.env", "verbatim_copy", "--env.taskset.variant", "rlm",
             "--env.taskset.num-examples", "2", "--env.taskset.length-tokens", "50",
             "--env.agent.harness.id", PLUGIN_ID, "--env.agent.harness.sandbox", "inprocess",
             "-m", "policy", "--client.base-url", srv.base_url,
             "--client.api-key-var", "RECURSA_NO_KEY", "--no-push", "-o", str(tmp_path)],
            env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    [traces] = list(tmp_path.glob("*/traces.jsonl"))
    episodes = [json.loads(line) for line in traces.read_text().splitlines()]
    assert len(episodes) == 2 and all(e["ok"] for e in episodes)
    for e in episodes:
        [t] = e["traces"]
        assert t["rewards"]["reward"]["score"] == 1.0
        assert t["info"]["recursa"]["status"] == "final"


@pytest.mark.model
async def test_local_model_episode_through_verifiers(monkeypatch: pytest.MonkeyPatch) -> None:
    # the policy is the local llama.cpp server, reached by verifiers' own client
    from recursa.models.local import LocalClient
    # a window of its own, so a server of its own. (Its socket once vanished mid-episode in the
    # full run: a forked sandbox worker deleted the shared server's directory, fixed in
    # llama_server; test_llama_socket.py checks it.)
    local = LocalClient("smollm2-135m", name="local:smollm2-135m", n_ctx=4096)
    srv = await local.load()
    monkeypatch.setenv("RECURSA_TEST_LLAMA_TOKEN", srv.token)
    # llama-server listens on a private Unix socket only (no TCP port to race for or to reach
    # from elsewhere); verifiers' client speaks TCP, so a loopback forwarder joins the two
    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(srv.socket_path)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            finally:
                w.close()
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)
    proxy = await asyncio.start_server(forward, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    env = load_environment("math_python", "rlm_tips", num_examples=1, max_turns=2,
                           sandbox="local")
    ctx = vf.ModelContext(model="smollm2-135m",
                          client=vf.EvalClientConfig(base_url=f"http://127.0.0.1:{port}/v1",
                                                     api_key_var="RECURSA_TEST_LLAMA_TOKEN"),
                          sampling=vf.SamplingConfig(max_tokens=200, temperature=0.0))
    async with env.serving():
        ep = await env.run_episode(next(iter(env.taskset)), ctx)
    proxy.close()
    await local.aclose()
    [t] = ep.traces
    assert t.ok, t.errors
    assert 1 <= t.info["recursa"]["turns"] <= 2 and 0.0 <= t.reward <= 1.0
    assert t.calls and all(c.usage is not None and c.usage.completion_tokens > 0
                           for c in t.calls if c.error is None)
    assert all(c.usage.completion_tokens <= 200 for c in t.calls if c.usage)
