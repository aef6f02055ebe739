"""Run rollouts of an environment variant, score them, and record the reward in the trace.

The reward goes into the run's own trace file as one more event: a point event of kind `run`
with `data.reward` (the trace format's event kinds are fixed, so no new kind is invented), no
parent (the reader attaches parentless points to the run), written after the run has ended.
`recursa export-sft` filters on it; `reward_of(path)` reads it back.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recursa.budget import Budget, Ledger
from recursa.dispatch import Dispatcher, Node
from recursa.envs.base import Env, check_variant, get_env
from recursa.tools import ToolSet, run_tool_loop
from recursa.trace import JsonlSink, Tracer, new_id
from recursa.types import Event, ModelClient, RecursaError


@dataclass
class Rollout:
    env: str
    variant: str
    seed: int
    instance: str
    reward: float = 0.0
    answer: str = ""
    status: str = ""
    root_input_tokens: int = 0
    root_output_tokens: int = 0
    sub_input_tokens: int = 0
    sub_output_tokens: int = 0
    subcalls: int = 0
    tool_calls: int = 0
    turns: int = 0
    elapsed_s: float = 0.0
    trace_path: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_reward(trace_path: str | Path, run_id: str, reward: float, **info: Any) -> None:
    """Append the reward of a finished run to its trace (see the module docstring)."""
    ev = Event(kind="run", id=new_id(), parent=None, run_id=run_id, phase="point",
               t=time.time(), depth=0, data={"reward": float(reward), **info})
    with open(trace_path, "a", encoding="utf-8") as f:
        f.write(ev.model_dump_json() + "\n")


def reward_of(events: list[Event]) -> dict[str, Any] | None:
    """The last reward record among a run's events, or None."""
    for ev in reversed(events):
        if ev.kind == "run" and ev.phase == "point" and "reward" in ev.data:
            return dict(ev.data)
    return None


async def run_rollout(env: Env | str, variant: str, seed: int, *,
                      model: str | ModelClient, sub_model: str | ModelClient | None = None,
                      length_tokens: int | None = None, trace_dir: str | Path | None = None,
                      root_options: dict[str, Any] | None = None,
                      sub_options: dict[str, Any] | None = None,
                      sandbox: str = "local", **limits: Any) -> Rollout:
    """One scored rollout. Never raises for a model or run failure: it becomes `error`."""
    env = get_env(env) if isinstance(env, str) else env
    check_variant(variant)
    inst = env.instance(seed, length_tokens)
    ro = Rollout(env=env.name, variant=variant, seed=seed, instance=inst.id)
    t0 = time.monotonic()
    try:
        if variant == "llm":
            run_id, trace = await _llm_rollout(env, inst, ro, model=model,
                                               trace_dir=trace_dir, options=root_options)
        else:
            run_id, trace = await _rlm_rollout(env, inst, ro, variant, model=model,
                                               sub_model=sub_model, trace_dir=trace_dir,
                                               root_options=root_options,
                                               sub_options=sub_options, sandbox=sandbox,
                                               **limits)
    except RecursaError as e:
        ro.error, ro.status, run_id, trace = f"{type(e).__name__}: {e}", "error", "", None
    ro.elapsed_s = round(time.monotonic() - t0, 3)
    ro.reward = env.reward(ro.answer, inst) if ro.answer else 0.0
    ro.trace_path = str(trace) if trace else None
    if trace and run_id:
        record_reward(trace, run_id, ro.reward, env=env.name, variant=variant, seed=seed,
                      instance=inst.id, gold=str(inst.gold)[:200])
    return ro


async def _rlm_rollout(env: Env, inst: Any, ro: Rollout, variant: str, *,
                       model: str | ModelClient, sub_model: str | ModelClient | None,
                       trace_dir: str | Path | None, root_options: dict[str, Any] | None,
                       sub_options: dict[str, Any] | None, sandbox: str,
                       **limits: Any) -> tuple[str, Path | None]:
    from recursa.rlm import RLM
    tools = env.tools(inst)
    rlm = RLM(model=model, sub_model=sub_model, sandbox=sandbox, tips=env.tips_for(variant),
              sub_tools=tools or None, trace_dir=trace_dir, model_options=root_options,
              sub_model_options=sub_options, **limits)
    res = await rlm.acompletion(env.rlm_query(inst), env.rlm_context(inst))
    ro.answer, ro.status, ro.turns, ro.subcalls = res.answer, res.status, res.turns, res.subcalls
    ro.error = res.error
    root = res.usage.get("root")
    if root:
        ro.root_input_tokens, ro.root_output_tokens = root.usage.input_tokens, \
            root.usage.output_tokens
    for role in ("sub", "child"):   # child RLM turns are sub-model work too
        ru = res.usage.get(role)
        if ru:
            ro.sub_input_tokens += ru.usage.input_tokens
            ro.sub_output_tokens += ru.usage.output_tokens
    ro.tool_calls = rlm.sub_tools.calls if rlm.sub_tools else 0
    return res.run_id, Path(res.trace_path) if res.trace_path else None


async def _llm_rollout(env: Env, inst: Any, ro: Rollout, *, model: str | ModelClient,
                       trace_dir: str | Path | None, options: dict[str, Any] | None
                       ) -> tuple[str, Path | None]:
    """The plain-LLM variant: one answer (with the tools, for a tool environment), traced in
    the same format as an RLM run so reports and SFT export treat every variant alike."""
    from recursa.models import make_client
    owned = isinstance(model, str)
    client = make_client(model) if isinstance(model, str) else model
    run_id = new_id()
    path = Path(trace_dir) / f"run-{run_id}.jsonl" if trace_dir else None
    tracer = Tracer([JsonlSink(path)] if path else [], run_id)
    ledger = Ledger(Budget())
    disp = Dispatcher(ledger=ledger, tracer=tracer, sub_client=client, clients={})
    messages = env.llm_messages(inst)
    run_ev = tracer.emit("run", phase="start", depth=0, query=inst.query, model=client.name,
                         variant="llm")
    tracer.emit("run", parent=run_ev, system=messages[0]["content"],
                first_user=messages[1]["content"])
    turn_ev = tracer.emit("turn", phase="start", parent=run_ev, depth=0, turn=1)
    status, err, tool_calls = "final", None, 0
    t0 = time.monotonic()
    try:
        tools = env.tools(inst)
        if tools:
            ts = ToolSet.of(tools)
            loop = await run_tool_loop(disp, client, messages, ts,
                                       node=Node(depth=0, parent=turn_ev, role="root"),
                                       parent=turn_ev, role="root", options=options,
                                       first_is_subcall=False)
            comp, tool_calls = loop.completion, loop.tool_calls
        else:
            comp = await disp.call_model(client, messages, role="root", subcall=False,
                                         options=options)
        text = comp.text
        tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=0, text=text,
                    usage=comp.usage.model_dump(), cost_usd=comp.cost_usd, model=comp.model,
                    latency_s=round(comp.latency_s, 4), tool_calls=tool_calls)
    except RecursaError as e:
        text, status, err = "", "error", f"{type(e).__name__}: {e}"
        tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=0, error=err)
    finally:
        if owned:
            await client.aclose()
    tracer.emit("final", parent=run_ev, depth=0, answer=text, status=status,
                ready=status == "final", limit=None, error=err)
    tracer.emit("run", id=run_ev, phase="end", depth=0, status=status, turns=1,
                elapsed_s=round(time.monotonic() - t0, 4), tokens=ledger.tokens, subcalls=0)
    tracer.close()
    u = ledger.by_role.get("root")
    ro.answer, ro.status, ro.turns, ro.error, ro.tool_calls = text, status, 1, err, tool_calls
    if u:
        ro.root_input_tokens, ro.root_output_tokens = u.usage.input_tokens, u.usage.output_tokens
    return run_id, path


async def run_rollouts(env: Env | str, variants: list[str], n: int, *,
                       model: str | ModelClient, concurrency: int = 4, seed0: int = 0,
                       on_done: Any = None, **kwargs: Any) -> list[Rollout]:
    """n rollouts per variant (seeds seed0 .. seed0+n-1, the same instances for every variant),
    at most `concurrency` at a time, interleaved so a cut-short ablation stays balanced."""
    for v in variants:
        check_variant(v)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(variant: str, seed: int) -> Rollout:
        async with sem:
            ro = await run_rollout(env, variant, seed, model=model, **kwargs)
        if on_done:
            on_done(ro)
        return ro

    jobs = [one(v, seed0 + i) for i in range(n) for v in variants]
    return list(await asyncio.gather(*jobs))


def write_results(rollouts: list[Rollout], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rollouts:
            f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")


def read_results(path: str | Path) -> list[Rollout]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(Rollout(**json.loads(line)))
    return out
