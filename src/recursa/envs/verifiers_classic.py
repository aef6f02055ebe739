"""recursa environments as classic `verifiers` environments (verifiers 0.1.14 - 0.3).

    from recursa.envs.verifiers_env import load_environment   # picks this module on < 0.4
    env = load_environment(env="oolong", variant="rlm_tips", num_examples=50)
    results = await env.generate(env.get_dataset(), client=client, model="my-policy")

Written against the classic verifiers API — `vf.MultiTurnEnv` / `vf.Rubric` / `vf.stop` /
`vf.cleanup` — which verifiers 0.1.x ships at the top level and 0.2-0.3 as `verifiers.legacy`
(aliased back to the top level). verifiers 0.4 removed it; `verifiers_v1` is the adapter there.

The policy is the root model. Each root turn is one trajectory step; the environment's response
is what recursa's own loop (`recursa.core.loop.Run`, the step machine every front end drives) makes
of the policy's reply: the REPL's output for its code, with the loop's guards, answer rules and
last-answer turn (or, in the `llm` variant of a tool environment, the tool results). verifiers
owns the conversation and the policy's calls; the step machine owns the rules. Sub-model calls made by that code go to `sub_model` (a recursa spec or
client) or, when it is None, to the policy itself through the rollout's client; each is recorded
in `extras["sub_calls"]` of the trajectory step whose code made it (its parent turn), with its
prompt, response, usage and tool-call count, so a trainer can credit or train on them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from recursa.base.extras import MissingExtra

try:
    import verifiers as vf
    from verifiers.types import Response, ResponseMessage
    from verifiers.types import Usage as VfUsage
except ImportError as e:   # the extra is optional: say how to get it
    raise MissingExtra("verifiers", "the classic verifiers adapter", module="verifiers",
                       detail="the classic API: verifiers>=0.1.14,<0.4; 0.4 is served by "
                              "recursa.envs.verifiers_v1") from e

from recursa.base.types import (
    Capabilities,
    Completion,
    Event,
    Message,
    ModelClient,
    ModelError,
    Result,
    Usage,
)
from recursa.core import context as ctx
from recursa.core import prompts
from recursa.core.budget import Budget, Ledger
from recursa.core.loop import Ask, Run, RunEnv, first_messages
from recursa.core.tools import ToolSet, call_tool, parse_text_calls
from recursa.envs.base import Env, check_variant, get_env
from recursa.obs.trace import CallbackSink, Tracer

MAX_ROOT_TURNS = 10_000    # verifiers' max_turns bounds the turns, not the loop's budget


# ==================================================================== clients
def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # content parts
        return "".join(str(p.get("text", "") if isinstance(p, dict) else
                           getattr(p, "text", "")) for p in content)
    return str(content)


def _plain(messages: Any) -> list[Message]:
    out = []
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else getattr(m, "role", "user")
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", "")
        out.append({"role": str(role), "content": _text(content)})
    return out


class RecursaClient(vf.Client):  # type: ignore[misc]
    """A verifiers client backed by any recursa ModelClient (local GGUF, replay script, ...),
    so rollouts run without an OpenAI-compatible server."""

    def __init__(self, client: ModelClient):
        super().__init__(client)

    def setup_client(self, config: Any) -> Any:
        raise NotImplementedError("RecursaClient wraps a ready recursa ModelClient")

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[list[Message], dict[str, Any]]:
        return _plain(messages), {}

    async def get_native_response(self, prompt: list[Message], model: str,
                                  sampling_args: dict[str, Any], tools: Any = None,
                                  **kwargs: Any) -> Completion:
        opts = {k: v for k, v in (sampling_args or {}).items()
                if k in ("max_tokens", "temperature", "top_p", "stop", "seed")}
        if "max_completion_tokens" in (sampling_args or {}):
            opts["max_tokens"] = sampling_args["max_completion_tokens"]
        try:
            return await self.client.complete(prompt, **opts)
        except ModelError as e:
            raise vf.ModelError(str(e)) from e

    async def raise_from_native_response(self, response: Completion) -> None:
        if not response.text:
            raise vf.EmptyModelResponseError("empty response")

    async def from_native_response(self, response: Completion) -> Any:
        u = response.usage
        return Response(id=f"recursa-{time.time_ns()}", created=int(time.time()),
                        model=response.model or self.client.name,
                        usage=VfUsage(prompt_tokens=u.input_tokens, reasoning_tokens=0,
                                      completion_tokens=u.output_tokens,
                                      total_tokens=u.input_tokens + u.output_tokens),
                        message=ResponseMessage(content=response.text, finish_reason="stop",
                                                is_truncated=False))

    async def close(self) -> None:
        await self.client.aclose()


class PolicyClient:
    """A recursa ModelClient that sends sub-calls to the policy (the rollout's verifiers
    client and model), for training a natively recursive model on its own sub-calls."""

    def __init__(self, client: Any, model: str, sampling_args: dict[str, Any] | None = None):
        self.client, self.model = client, model
        self.name = f"policy:{model}"
        self.sampling_args = dict(sampling_args or {})
        # the trainer's policy: no price, window or streaming recursa could rely on
        self.capabilities = Capabilities()

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        t0 = time.perf_counter()
        args = {**self.sampling_args, **{k: v for k, v in options.items()
                                         if k in ("max_tokens", "temperature", "stop")}}
        try:
            resp = await self.client.get_response(
                prompt=[vf.UserMessage(content=m["content"]) if m["role"] == "user" else
                        vf.SystemMessage(content=m["content"]) if m["role"] == "system" else
                        vf.AssistantMessage(content=m["content"]) for m in messages],
                model=self.model, sampling_args=args)
        except vf.Error as e:
            raise ModelError(f"policy sub-call failed: {e}") from e
        text = _text(resp.message.content)
        if not text:
            raise ModelError("policy sub-call returned no text")
        u = resp.usage
        return Completion(text=text, model=self.name, latency_s=time.perf_counter() - t0,
                          usage=Usage(input_tokens=u.prompt_tokens if u else 0,
                                      output_tokens=u.completion_tokens if u else 0),
                          cost_usd=None, raw=resp)

    async def aclose(self) -> None:
        pass


# ==================================================================== the environment
class _Run:
    """Host-side objects of one rollout (kept out of `state`, which must stay serialisable)."""

    def __init__(self) -> None:
        self.machine: Run | None = None       # the loop's step machine for this rollout
        self.tracer: Tracer | None = None
        self.events: list[Event] = []
        self.tools: ToolSet | None = None


class RecursaEnv(vf.MultiTurnEnv):  # type: ignore[misc]
    """One recursa environment in one variant, as a verifiers multi-turn environment."""

    def __init__(self, env: Env, variant: str, *, sub_model: str | ModelClient | None = None,
                 length_tokens: int | None = None, sandbox: str = "local",
                 max_output_chars: int = 8192, cell_timeout: float = 60.0,
                 max_consecutive_errors: int = 5, **kwargs: Any):
        self.env, self.variant = env, check_variant(variant)
        self.sub_model = sub_model
        self.length_tokens = length_tokens
        self.sandbox_kind = sandbox
        self.max_output_chars = max_output_chars
        self.cell_timeout = cell_timeout
        self.max_consecutive_errors = max_consecutive_errors
        self._runs: dict[str, _Run] = {}
        super().__init__(rubric=vf.Rubric(funcs=[self.reward_fn]), **kwargs)

    # ---------------------------------------------------------------- lifecycle
    async def setup_state(self, state: Any) -> None:
        info = state["info"]
        inst = self.env.instance(int(info["seed"]), info.get("length_tokens"))
        run = self._runs[state["trajectory_id"]] = _Run()
        state["recursa"] = {"answer": "", "ready": False, "sub_calls": 0, "tool_calls": 0,
                            "sub_input_tokens": 0, "sub_output_tokens": 0}
        tools = self.env.tools(inst)
        run.tools = ToolSet.of(tools) if tools else None
        if self.variant == "llm":
            return
        policy = PolicyClient(state["client"], state["model"], state.get("sampling_args"))
        if self.sub_model is None:
            sub: ModelClient = policy
        elif isinstance(self.sub_model, str):
            from recursa.models import make_client
            sub = make_client(self.sub_model)
        else:
            sub = self.sub_model
        run.tracer = Tracer([CallbackSink(run.events.append)])
        # rlm_query stays a plain sub-call here (depth 0), as verifiers trains the root only
        budget = Budget(max_iterations=MAX_ROOT_TURNS, max_depth=0,
                        cell_timeout=self.cell_timeout,
                        max_consecutive_errors=self.max_consecutive_errors)
        from recursa.sandbox import make_sandbox
        kind = self.sandbox_kind
        env = RunEnv(budget=budget, ledger=Ledger(budget), tracer=run.tracer,
                     root_client=policy, sub_client=sub, tools=run.tools,
                     make_sandbox=lambda: make_sandbox(kind),
                     max_output_chars=self.max_output_chars, tips=self.env.tips_for(self.variant),
                     tool_names=run.tools.names if run.tools else None)
        run.machine = Run(env, self.env.rlm_query(inst))
        first = await run.machine.start(self.env.rlm_context(inst))
        if not isinstance(first, Ask):     # the run ended before its first turn
            raise vf.Error(f"the recursa run could not start: {first.error}")

    @vf.cleanup
    async def close_run(self, state: Any) -> None:
        run = self._runs.pop(state["trajectory_id"], None)
        if run is None:
            return
        if run.machine is not None:
            res = await run.machine.close()     # a rollout cut by max_turns ends here
            if not state["recursa"]["answer"]:
                state["recursa"]["answer"] = res.answer
        if run.tracer is not None:
            run.tracer.close()

    # ---------------------------------------------------------------- one environment turn
    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        run = self._runs[state["trajectory_id"]]
        text = _text(getattr(messages[-1], "content", None) if not isinstance(messages[-1], dict)
                     else messages[-1].get("content"))
        if self.variant == "llm":
            return await self._llm_response(run, text, state)
        return await self._repl_response(run, text, state)

    async def _llm_response(self, run: _Run, text: str, state: Any) -> Any:
        calls = parse_text_calls(text, run.tools.names) if run.tools else []
        if not calls:
            state["recursa"].update(answer=text, ready=True)
            state["final_env_response"] = []
            return []
        out = []
        for c in calls:
            tool = run.tools.get(c.name) if run.tools else None
            result = f"Error: {c.error}" if c.error or tool is None else \
                await call_tool(tool, c.arguments)
            state["recursa"]["tool_calls"] += 1
            out.append(vf.UserMessage(content=f"Result of {c.name}:\n"
                                      f"{result[:run.tools.max_output_chars if run.tools else 0]}"))
        return out

    async def _repl_response(self, run: _Run, text: str, state: Any) -> Any:
        """The policy's reply is one step of recursa's loop; what the loop sends next is the
        environment's response (the run's end: the last outputs, and verifiers stops)."""
        machine = run.machine
        assert machine is not None
        start = len(run.events)
        last = machine.asked is not None and machine.asked.last   # the last-answer turn's reply
        step = await machine.step(Completion(text=text, model=str(state.get("model") or "")))
        subs = self._sub_calls(run.events[start:])
        if state["trajectory"]:
            state["trajectory"][-1]["extras"]["sub_calls"] = subs   # the parent turn's
        r = state["recursa"]
        r["sub_calls"] += len(subs)
        r["tool_calls"] += sum(s.get("tool_calls") or 0 for s in subs)
        r["sub_input_tokens"] += sum(s["usage"].get("input_tokens", 0) for s in subs)
        r["sub_output_tokens"] += sum(s["usage"].get("output_tokens", 0) for s in subs)
        r["answer"] = str(machine.st.answer.get("content") or "")
        if isinstance(step, Result):
            r.update(answer=step.answer, ready=step.status == "final")
            ran = not last and machine.st.last_turn == machine.st.turns and \
                machine.st.last_code is not None
            shown = machine.st.last_shown if ran else ""
            state["final_env_response"] = [vf.UserMessage(content=shown)] if shown else []
            return state["final_env_response"]
        return [vf.UserMessage(content=step.feedback or prompts.NO_CODE)]

    @staticmethod
    def _sub_calls(events: list[Event]) -> list[dict[str, Any]]:
        ends = [e for e in events if e.kind == "subcall" and e.phase == "end"]
        starts = {e.id: e for e in events if e.kind == "subcall" and e.phase == "start"}
        out = []
        for e in ends:
            s = starts.get(e.id)
            out.append({"prompt": s.data.get("prompt") if s else None,
                        "response": e.data.get("response"), "error": e.data.get("error"),
                        "model": e.data.get("model"), "usage": e.data.get("usage") or {},
                        "tool_calls": e.data.get("tool_calls", 0),
                        "elapsed_s": e.data.get("elapsed_s")})
        return out

    # ---------------------------------------------------------------- reward
    async def reward_fn(self, state: Any, info: dict[str, Any], **kwargs: Any) -> float:
        """The environment's evaluation scorer on the committed (or last) answer."""
        inst = self.env.instance(int(info["seed"]), info.get("length_tokens"))
        answer = state.get("recursa", {}).get("answer") or ""
        if not answer:
            # single-turn llm, or no answer committed (recursa, at a limit, also falls back
            # to the root's last reply)
            traj = state.get("trajectory") or []
            if traj:
                answer = _text(getattr(traj[-1]["completion"][-1], "content", ""))
        return self.env.reward(answer, inst)


def _prompt(env: Env, variant: str, inst: Any, max_output_chars: int) -> list[Message]:
    if variant == "llm":
        msgs = env.llm_messages(inst)
        tools = env.tools(inst)
        if tools:
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n"
                       + ToolSet.of(tools).protocol_prompt()}
        return msgs
    with tempfile.TemporaryDirectory(prefix="recursa-vf-") as d:
        prep = ctx.prepare(env.rlm_context(inst), Path(d))
    tools = env.tools(inst)
    # the step machine of each rollout writes the same messages (RecursaEnv.setup_state)
    return first_messages(env.rlm_query(inst), prep.description,
                          max_output_chars=max_output_chars, tips=env.tips_for(variant),
                          tool_names=ToolSet.of(tools).names if tools else None)


def load_environment(env: str = "oolong", variant: str = "rlm", *, num_examples: int = 20,
                     seed: int = 0, length_tokens: int | None = None,
                     sub_model: str | ModelClient | None = None, max_turns: int = 10,
                     sandbox: str = "local", max_output_chars: int = 8192,
                     **kwargs: Any) -> RecursaEnv:
    """A verifiers environment: `num_examples` seeded instances of `env` in `variant`.

    `sub_model=None` sends sub-calls to the policy; `max_turns` bounds root turns (the llm
    variant of a tool environment counts tool rounds)."""
    from datasets import Dataset
    e = get_env(env)
    check_variant(variant)
    rows = []
    for i in range(num_examples):
        inst = e.instance(seed + i, length_tokens)
        rows.append({"prompt": _prompt(e, variant, inst, max_output_chars),
                     "answer": str(inst.gold),
                     "info": {"env": e.name, "variant": variant, "seed": seed + i,
                              "length_tokens": length_tokens, "instance": inst.id,
                              "query": e.rlm_query(inst)}})
    turns = 1 if variant == "llm" and not e.uses_tools else max_turns
    return RecursaEnv(e, variant, sub_model=sub_model, length_tokens=length_tokens,
                      sandbox=sandbox, max_output_chars=max_output_chars,
                      eval_dataset=Dataset.from_list(rows), max_turns=turns,
                      env_id=f"recursa-{e.name}-{variant}", **kwargs)
