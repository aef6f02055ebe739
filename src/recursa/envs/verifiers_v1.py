"""recursa environments on verifiers 0.4 (`verifiers.v1`): a taskset, a harness and an env.

    from recursa.envs.verifiers_v1 import load_environment
    import verifiers.v1 as vf
    env = load_environment("oolong", "rlm_tips", num_examples=50, sandbox="local")
    ctx = vf.ModelContext(model="policy", client=vf.EvalClientConfig(base_url=URL))
    async with env.serving():
        episode = await env.run_episode(next(iter(env.taskset)), ctx)

or from verifiers' own CLI, through the `recursa-vf` plugin package (src/recursa_vf):
`vf-eval recursa-vf --env.taskset.env oolong --env.taskset.variant rlm_tips ...`.

verifiers 0.4 gives a harness the whole rollout: it runs its program against an interception
endpoint that records every model call into the trace's message graph. The recursa harness
runs recursa's own rollout (`recursa.envs.run_rollout`, the same loop as `recursa ablate`) in
this process with the policy behind that endpoint, so

* each root turn extends one conversation: the root branch of the trace;
* each sub-call sent to the policy (`sub_model=None`, the default) is a conversation of its
  own: a branch of its own, i.e. its own training sample in verifiers' trainer;
* every sub-call is linked to the root turn whose code made it by a `subagent_call` semantic
  edge (the ACP request-id header the interception reads), so a trainer can credit it.

A `sub_model` spec (e.g. "local:qwen2.5-coder-1.5b") sends sub-calls to that model instead,
outside the interception: they are in recursa's trace (`trace_dir`), not in verifiers'.
The model's code runs in recursa's sandbox (`sandbox=`), never in the verifiers runtime, which
is why the env defaults to the `subprocess` runtime and needs no container.
"""

from __future__ import annotations

import itertools
from typing import Any

from recursa.base.extras import MissingExtra

try:
    import verifiers.v1 as vf
    from verifiers.v1.semantic import ACP_MODEL_REQUEST_ID_HEADER, SemanticEdge, SemanticEdgeSet
except ImportError as e:   # the extra is optional: say how to get it
    raise MissingExtra("verifiers", "the verifiers 0.4 adapter", module="verifiers",
                       detail="verifiers>=0.4") from e

from recursa.base.types import Capabilities, Completion, Message, ModelClient
from recursa.envs.base import check_variant, get_env

PLUGIN_ID = "recursa-vf"     # the importable package verifiers resolves ids to (src/recursa_vf)


# ==================================================================== tasks
class RecursaTaskData(vf.TaskData):
    """One seeded instance. The context is rebuilt from the seed by the harness (it can be
    megabytes), so the trace's task data stays small; `prompt` is the query."""

    env: str
    variant: str
    seed: int
    length_tokens: int | None = None
    gold: str = ""


class RecursaTask(vf.Task[RecursaTaskData]):
    @vf.reward
    async def reward(self, trace: vf.Trace) -> float:
        """The environment's evaluation scorer on the committed (or last) answer."""
        env = get_env(self.data.env)
        return env.reward(trace.last_reply, env.instance(self.data.seed, self.data.length_tokens))


class RecursaTasksetConfig(vf.TasksetConfig):
    env: str = "oolong"
    """research (DeepDive-style), math_python, oolong or verbatim_copy."""
    variant: str = "rlm"
    """llm, rlm or rlm_tips."""
    num_examples: int = 20
    seed: int = 0
    """Instances use seeds seed .. seed+num_examples-1 (the same ones in every variant)."""
    length_tokens: int | None = None
    """Context length; None takes the environment's default."""


class RecursaTaskset(vf.Taskset[RecursaTask, RecursaTasksetConfig]):
    def load(self) -> Any:
        c = self.config
        env = get_env(c.env)
        check_variant(c.variant)
        for seed in range(c.seed, c.seed + c.num_examples):
            inst = env.instance(seed, c.length_tokens)
            data = RecursaTaskData(id=inst.id, name=f"{env.name}-{c.variant}-{seed}",
                                   prompt=env.rlm_query(inst), env=env.name, variant=c.variant,
                                   seed=seed, length_tokens=c.length_tokens, gold=str(inst.gold))
            yield RecursaTask(data, c.task)


# ==================================================================== the harness
class RecursaHarnessConfig(vf.HarnessConfig):
    id: str = PLUGIN_ID
    sandbox: str = "local"
    """recursa sandbox for the model's code: local (bubblewrap), inprocess, docker, ..."""
    sub_model: str | None = None
    """None: sub-calls go to the policy through the interception (recorded as branches);
    else a recursa model spec that serves them (not recorded by verifiers)."""
    native_tools: bool = False
    """Give tool-holding sub-models OpenAI `tools=` instead of recursa's text protocol."""
    trace_dir: str | None = None
    """Also write recursa's own trace (events, spans, reward) here."""
    max_iterations: int = 10
    max_depth: int = 1
    max_subcalls: int | None = None
    max_seconds: float | None = None
    cell_timeout: float = 60.0
    max_consecutive_errors: int = 5
    max_output_chars: int = 8192


class _Calls:
    """Request ids of one rollout's policy calls, and which root turn each sub-call ran under.
    The root loop is sequential, so a sub-call belongs to the latest root turn."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.ids = itertools.count(1)
        self.root: str | None = None
        self.edges: list[tuple[str, str]] = []


class _Tagged:
    """A recursa ModelClient that stamps each request with an ACP request id, so the
    interception records it on its ModelCall and edges can name it."""

    def __init__(self, client: ModelClient, calls: _Calls, *, root: bool, native_tools: bool):
        self.client, self.calls, self.root = client, calls, root
        self.name = client.name
        # the policy client's declaration, without streaming (no astream here) and with
        # native tools as the harness says
        self.capabilities: Capabilities = client.capabilities._replace(streaming=False,
                                                                       tools=native_tools)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        rid = f"{self.calls.prefix}-{'r' if self.root else 's'}{next(self.calls.ids)}"
        if self.root:
            self.calls.root = rid
        elif self.calls.root is not None:
            self.calls.edges.append((self.calls.root, rid))
        headers = {**(options.pop("extra_headers", None) or {}), ACP_MODEL_REQUEST_ID_HEADER: rid}
        return await self.client.complete(messages, extra_headers=headers, **options)

    async def aclose(self) -> None:
        pass   # the harness closes the shared client


def link_subcalls(trace: vf.Trace, edges: list[tuple[str, str]]) -> int:
    """Add a `subagent_call` edge root turn -> sub-call for each pair whose calls both
    committed a message (a failed call has none). Returns how many were added."""
    committed = {c.acp.request_id for c in trace.calls if c.acp is not None and c.node is not None}
    ok = [SemanticEdge(source_request_id=a, target_request_id=b, type="subagent_call")
          for a, b in edges if a in committed and b in committed]
    if ok:
        trace.add_semantic_edges(SemanticEdgeSet(edges=ok))
    return len(ok)


class RecursaHarness(vf.Harness[RecursaHarnessConfig]):
    """Runs recursa's rollout in this process, every policy call through the interception."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False      # the model's code runs in recursa's sandbox, not the runtime
    NEEDS_CONTAINER = False

    async def setup(self, runtime: Any) -> None:
        kind = getattr(getattr(runtime, "config", None), "type", None)
        if kind != "subprocess":   # a box nothing would run in: say where the code runs
            raise ValueError(
                f"the recursa harness runs in the host process, so the {kind!r} runtime would "
                "host nothing: use --env.agent.runtime.type subprocess, and choose where the "
                "model's code runs with --env.agent.harness.sandbox (local, docker, modal, ...)")

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: Any, endpoint: str,
                     secret: str, mcp_urls: dict[str, str], data: vf.TaskData
                     ) -> vf.ProgramResult:
        from recursa.envs.rollout import run_rollout
        from recursa.models.openai_client import OpenAIClient
        d = trace.task.data   # the run's recorded task (a resumed segment's `data` is a copy)
        c = self.config
        policy = OpenAIClient(ctx.model, base_url=endpoint, api_key=secret,
                              name=f"policy:{ctx.model}", max_retries=2)
        calls = _Calls(f"recursa-{trace.id[:12]}")
        root = _Tagged(policy, calls, root=True, native_tools=c.native_tools)
        sub: ModelClient | str = (c.sub_model if c.sub_model is not None else
                                  _Tagged(policy, calls, root=False, native_tools=c.native_tools))
        try:
            ro = await run_rollout(
                d.env, d.variant, d.seed, model=root, sub_model=sub,
                length_tokens=d.length_tokens, trace_dir=c.trace_dir, sandbox=c.sandbox,
                max_iterations=c.max_iterations, max_depth=c.max_depth,
                max_subcalls=c.max_subcalls, max_seconds=c.max_seconds,
                cell_timeout=c.cell_timeout, max_consecutive_errors=c.max_consecutive_errors,
                max_output_chars=c.max_output_chars)
        finally:
            await policy.aclose()
        trace.root_reply = ro.answer
        edges = link_subcalls(trace, calls.edges)
        info = ro.to_dict()
        info.pop("extra", None)
        trace.info["recursa"] = {**info, "subcall_edges": edges}
        trace.record_metrics({
            "recursa_turns": ro.turns, "recursa_subcalls": ro.subcalls,
            "recursa_tool_calls": ro.tool_calls,
            "recursa_sub_input_tokens": ro.sub_input_tokens,
            "recursa_sub_output_tokens": ro.sub_output_tokens,
            "recursa_committed": float(ro.status == "final")})
        if ro.status == "error":   # a model or run failure: the trace keeps the partial answer
            return vf.ProgramResult(exit_code=1, stdout=ro.answer, stderr=ro.error or "error")
        return vf.ProgramResult(exit_code=0, stdout=ro.answer, stderr="")


# ==================================================================== the env
class RecursaEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The policy's seat; the runtime only hosts the harness, so a local subprocess."""


class RecursaEnv(vf.Env[RecursaEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


def load_environment(env: str = "oolong", variant: str = "rlm", *, num_examples: int = 20,
                     seed: int = 0, length_tokens: int | None = None,
                     sub_model: str | None = None, max_turns: int = 10, sandbox: str = "local",
                     **harness: Any) -> RecursaEnv:
    """A verifiers 0.4 env: `num_examples` seeded instances of `env` in `variant`.

    `max_turns` bounds root turns (recursa's `max_iterations`); other `harness` keywords are
    `RecursaHarnessConfig` fields (max_subcalls, max_seconds, cell_timeout, trace_dir, ...)."""
    get_env(env)
    check_variant(variant)
    config = vf.resolve_env_config({
        "taskset": {"id": PLUGIN_ID, "env": env, "variant": variant,
                    "num_examples": num_examples, "seed": seed, "length_tokens": length_tokens},
        "agent": {"harness": {"id": PLUGIN_ID, "sandbox": sandbox, "sub_model": sub_model,
                              "max_iterations": max_turns, **harness},
                  "runtime": {"type": "subprocess"}},
    })
    built = vf.load_environment(config)
    assert isinstance(built, RecursaEnv)
    return built
