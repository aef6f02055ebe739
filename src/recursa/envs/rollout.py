"""Run rollouts of an environment variant, score them, and record the reward in the trace.

The reward goes into the run's own trace file as one more event: a point event of kind `run`
with `data.reward` (the trace format's event kinds are fixed, so no new kind is invented), no
parent (the reader attaches parentless points to the run), written after the run has ended.
`recursa export-sft` filters on it; `reward_of(path)` reads it back.

Many rollouts go through the same executor seam as `recursa.bench`: `make_rollout_specs`
turns (env, variants, n, options) into plain dicts, `run_rollout_spec(spec) -> row` is a
top-level, picklable function of one of them (it builds the env and the model clients from the
spec's strings), and an executor maps specs to rows, handing each to an `on_row` in the driver.
`LocalRolloutExecutor` runs `concurrency` rollouts on one event loop in this process;
`recursa.core.batch.executors.RayExecutor(fn=run_rollout_spec, on_error=failed_rollout)` runs one
Ray task per rollout. Given a results file, a run appends one row per rollout (fsync per row)
and skips the keys already in it, so an interrupted ablation resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from recursa.base.privatefiles import open_private
from recursa.base.types import Event, ModelClient, RecursaError, Status
from recursa.core.batch.executors import AsyncioExecutor
from recursa.core.config import RLMConfig
from recursa.core.dispatch import Node
from recursa.core.plainrun import PlainRun
from recursa.core.tools import ToolSet, run_tool_loop
from recursa.envs.base import ENVS, Env, check_variant, get_env
from recursa.obs.trace import new_id


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
    key: str = ""           # env|variant|seed|length|model: what a resumed ablation skips

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Rollout:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})


def record_reward(trace_path: str | Path, run_id: str, reward: float, **info: Any) -> None:
    """Append the reward of a finished run to its trace (see the module docstring)."""
    ev = Event(kind="run", id=new_id(), parent=None, run_id=run_id, phase="point",
               t=time.time(), depth=0, data={"reward": float(reward), **info})
    with open_private(trace_path, "a") as f:
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
                      sandbox: str = "local", rlm_options: dict[str, Any] | None = None,
                      **limits: Any) -> Rollout:
    """One scored rollout. Never raises for a model or run failure: it becomes `error`.
    `rlm_options`: `recursa.frontend.options.RLMOptions.to_dict()` for endpoints, keys (by variable
    name), prices and the like (its model, sandbox, limits and reply options are not used)."""
    base = _base_config(rlm_options)
    extra = base.kwargs() if base is not None else {}
    env = get_env(env) if isinstance(env, str) else env
    check_variant(variant)
    inst = env.instance(seed, length_tokens)
    ro = Rollout(env=env.name, variant=variant, seed=seed, instance=inst.id)
    t0 = time.monotonic()
    try:
        if variant == "llm":
            run_id, trace = await _llm_rollout(env, inst, ro, model=model,
                                               trace_dir=trace_dir, options=root_options,
                                               extra=extra)
        else:
            run_id, trace = await _rlm_rollout(env, inst, ro, variant, model=model,
                                               sub_model=sub_model, trace_dir=trace_dir,
                                               root_options=root_options,
                                               sub_options=sub_options, sandbox=sandbox,
                                               base=base, **limits)
    except RecursaError as e:
        ro.error, ro.status, run_id, trace = f"{type(e).__name__}: {e}", "error", "", None
    ro.elapsed_s = round(time.monotonic() - t0, 3)
    ro.reward = env.reward(ro.answer, inst) if ro.answer else 0.0
    ro.trace_path = str(trace) if trace else None
    if trace and run_id:
        record_reward(trace, run_id, ro.reward, env=env.name, variant=variant, seed=seed,
                      instance=inst.id, gold=str(inst.gold)[:200])
    return ro


def _base_config(rlm_options: dict[str, Any] | None) -> RLMConfig | None:
    """The RLM settings the shared options give besides models, sandbox, limits and replies
    (which are the rollout's own)."""
    if not rlm_options:
        return None
    from recursa.core.budget import Budget
    from recursa.frontend.options import RLMOptions
    return RLMOptions.from_dict(rlm_options).config().replace(
        model=None, sub_model=None, sandbox=None, model_options=None, sub_model_options=None,
        **dict.fromkeys(Budget.model_fields))


async def _rlm_rollout(env: Env, inst: Any, ro: Rollout, variant: str, *,
                       model: str | ModelClient, sub_model: str | ModelClient | None,
                       trace_dir: str | Path | None, root_options: dict[str, Any] | None,
                       sub_options: dict[str, Any] | None, sandbox: str,
                       base: RLMConfig | None = None, **limits: Any) -> tuple[str, Path | None]:
    from recursa.core.rlm import RLM
    tools = env.tools(inst)
    # the shared options' settings with the rollout's own models, sandbox, tools and limits
    rlm = RLM(config=RLMConfig.build(
        base, model=model, sub_model=sub_model, sandbox=sandbox, tips=env.tips_for(variant),
        sub_tools=tools or None, trace_dir=trace_dir, model_options=root_options,
        sub_model_options=sub_options, **limits))
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
                       trace_dir: str | Path | None, options: dict[str, Any] | None,
                       extra: dict[str, Any] | None = None) -> tuple[str, Path | None]:
    """The plain-LLM variant: one answer (with the tools, for a tool environment), traced in
    the same format as an RLM run so reports and SFT export treat every variant alike."""
    from recursa.models import make_client
    owned = isinstance(model, str)
    client = make_client(model, **_make_client_kwargs(model, extra or {})) \
        if isinstance(model, str) else model
    run_id = new_id()
    path = Path(trace_dir) / f"run-{run_id}.jsonl" if trace_dir else None
    messages = env.llm_messages(inst)
    run = PlainRun(client, inst.query, trace_path=str(path) if path else None, run_id=run_id,
                   options=options, variant="llm")
    run.rec.note(system=messages[0]["content"], first_user=messages[1]["content"])
    status: Status = "final"
    err, tool_calls = None, 0
    try:
        tools = env.tools(inst)
        if tools:      # the tool loop makes the turn's calls itself
            turn = run.turn()
            try:
                loop = await run_tool_loop(run.dispatcher, client, messages, ToolSet.of(tools),
                                           node=Node(depth=0, parent=turn.id, role="root"),
                                           parent=turn.id, role="root", options=options,
                                           first_is_subcall=False)
            except RecursaError as e:
                turn.fail(f"{type(e).__name__}: {e}")
                raise
            text, tool_calls = loop.completion.text, loop.tool_calls
            run.turns += 1
            turn.end(loop.completion, tool_calls=tool_calls)
        else:
            text = await run.ask(messages, step="answer")
    except RecursaError as e:
        text, status, err = "", "error", f"{type(e).__name__}: {e}"
    finally:
        if owned:
            await client.aclose()
    run.turns = 1
    run.finish(text, status, error=err, totals=dict(tokens=run.ledger.tokens, subcalls=0))
    u = run.ledger.by_role.get("root")
    ro.answer, ro.status, ro.turns, ro.error, ro.tool_calls = text, status, 1, err, tool_calls
    if u:
        ro.root_input_tokens, ro.root_output_tokens = u.usage.input_tokens, u.usage.output_tokens
    return run_id, path


def _make_client_kwargs(spec: str, extra: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {k: extra[k] for k in ("api_key", "prices") if extra.get(k)}
    if extra.get("base_url") and spec.split(":", 1)[0] in ("openai", "vllm", "openrouter"):
        kw["base_url"] = extra["base_url"]
    return {**kw, **(extra.get("client_options") or {})}


# ---------------------------------------------------------------- many rollouts
OnRow = Callable[[dict[str, Any]], None]
_SPEC_FIELDS = ("sub_model", "length_tokens", "trace_dir", "root_options", "sub_options",
                "sandbox", "rlm_options")


def _model_name(model: Any) -> str:
    return model if isinstance(model, str) else str(getattr(model, "name", None) or model)


def rollout_key(env: str, variant: str, seed: int, length_tokens: int, model: str) -> str:
    return f"{env}|{variant}|{seed}|{length_tokens}|{model}"


def make_rollout_specs(env: Env | str, variants: list[str], n: int, *,
                       model: str | ModelClient, seed0: int = 0,
                       responder: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """n rollouts per variant (seeds seed0 .. seed0+n-1, the same instances for every variant),
    interleaved so a cut-short ablation stays balanced. `kwargs` are `run_rollout`'s (limits
    included). With string model specs the specs are JSON-serialisable (what a Ray task needs);
    live clients work with the local executor only. `responder` ("module:attr", a callable
    `(messages) -> str`) scripts a `replay:` model in every process that runs a spec."""
    env = get_env(env) if isinstance(env, str) else env
    for v in variants:
        check_variant(v)
    opts = {k: kwargs.pop(k) for k in _SPEC_FIELDS if k in kwargs}
    if opts.get("trace_dir") is not None:
        opts["trace_dir"] = str(opts["trace_dir"])
    length = opts.get("length_tokens") or env.default_length
    # a registered env travels by name; a custom Env object only to the local executor
    env_ref: Env | str = env.name if ENVS.get(env.name) is env else env
    specs = []
    for i in range(n):
        for v in variants:
            seed = seed0 + i
            specs.append({"key": rollout_key(env.name, v, seed, length, _model_name(model)),
                          "env": env_ref, "variant": v, "seed": seed, "model": model,
                          "responder": responder, **opts, "limits": dict(kwargs)})
    return specs


def _import_attr(path: str) -> Any:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


async def arun_rollout_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """One rollout of a spec from `make_rollout_specs`; always returns a row (a dict)."""
    model = spec["model"]
    if spec.get("responder") and isinstance(model, str) and model.startswith("replay:"):
        from recursa.models import ReplayClient
        model = ReplayClient(_import_attr(spec["responder"]), name=model)
    kwargs = {k: spec[k] for k in _SPEC_FIELDS if spec.get(k) is not None}
    ro = await run_rollout(spec["env"], spec["variant"], spec["seed"], model=model,
                           **kwargs, **spec.get("limits", {}))
    ro.key = spec["key"]
    return ro.to_dict()


def run_rollout_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Blocking, picklable entry point: what a Ray task calls."""
    return asyncio.run(arun_rollout_spec(spec))


def failed_rollout(spec: dict[str, Any], error: str) -> dict[str, Any]:
    """The row of a rollout whose task died outside `run_rollout_spec` (a worker crash, a lost
    node): status `error`, reward 0, redone by a run with retry_errors."""
    env = spec["env"] if isinstance(spec["env"], str) else spec["env"].name
    return Rollout(env=env, variant=spec["variant"], seed=spec["seed"], instance="",
                   status="error", error=error, key=spec["key"]).to_dict()


class RolloutExecutor(Protocol):
    """Runs specs, calling `on_row(row)` in the calling process as each one finishes."""

    def run(self, specs: list[dict[str, Any]], on_row: OnRow) -> None: ...


class LocalRolloutExecutor(AsyncioExecutor):
    """`concurrency` rollouts at a time on one event loop in this process (the executor the
    bench and `recursa batch` use, running rollout specs)."""

    def __init__(self, concurrency: int = 4):
        super().__init__(max(1, concurrency), afn=arun_rollout_spec)


class _Run:
    """The driver's side of a run: which specs are left, and the rows as they arrive."""

    def __init__(self, specs: list[dict[str, Any]], results_path: str | Path | None,
                 retry_errors: bool, on_done: Callable[[Rollout], Any] | None):
        from recursa.core.batch.rowfile import ResultsFile
        self.specs = specs
        self.file = ResultsFile(results_path) if results_path is not None else None
        self.rows: dict[str, dict[str, Any]] = dict(self.file.rows) if self.file else {}
        done = {k for k, r in self.rows.items()
                if not (retry_errors and r.get("status") == "error")}
        self.todo = [s for s in specs if s["key"] not in done]
        self.skipped = len(specs) - len(self.todo)
        self.on_done = on_done

    def record(self, row: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.append(row)     # durable before anything else looks at it
        self.rows[row["key"]] = row
        if self.on_done:
            self.on_done(Rollout.from_dict(row))

    def rollouts(self) -> list[Rollout]:
        """The rows of this run's specs (earlier runs' included), in spec order."""
        return [Rollout.from_dict(self.rows[s["key"]]) for s in self.specs
                if s["key"] in self.rows]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def run_ablation(env: Env | str, variants: list[str], n: int, *, model: str | ModelClient,
                 executor: RolloutExecutor | None = None, concurrency: int = 4,
                 seed0: int = 0, results_path: str | Path | None = None,
                 retry_errors: bool = False, on_done: Callable[[Rollout], Any] | None = None,
                 **kwargs: Any) -> list[Rollout]:
    """Blocking twin of `run_rollouts` (what `recursa ablate` calls): Ctrl-C reaches the
    executor, which stops what is left; finished rows are already in `results_path`."""
    specs = make_rollout_specs(env, variants, n, model=model, seed0=seed0, **kwargs)
    run = _Run(specs, results_path, retry_errors, on_done)
    try:
        if run.todo:
            (executor or LocalRolloutExecutor(concurrency)).run(run.todo, run.record)
    finally:
        run.close()
    return run.rollouts()


async def run_rollouts(env: Env | str, variants: list[str], n: int, *,
                       model: str | ModelClient, concurrency: int = 4, seed0: int = 0,
                       on_done: Any = None, executor: RolloutExecutor | None = None,
                       results_path: str | Path | None = None, retry_errors: bool = False,
                       **kwargs: Any) -> list[Rollout]:
    """n rollouts per variant (seeds seed0 .. seed0+n-1, the same instances for every variant),
    interleaved so a cut-short ablation stays balanced. executor None: at most `concurrency`
    at a time on this event loop; else e.g. `RayExecutor(fn=run_rollout_spec,
    on_error=failed_rollout)` (run in a thread). With `results_path`, one row per rollout is
    appended there and keys already in it are skipped (`retry_errors`: redo error rows)."""
    specs = make_rollout_specs(env, variants, n, model=model, seed0=seed0, **kwargs)
    run = _Run(specs, results_path, retry_errors, on_done)
    try:
        if run.todo:
            if executor is None or isinstance(executor, LocalRolloutExecutor):
                await (executor or LocalRolloutExecutor(concurrency)).arun(run.todo, run.record)
            else:
                await asyncio.to_thread(executor.run, run.todo, run.record)
    finally:
        run.close()
    return run.rollouts()


def write_results(rollouts: list[Rollout], path: str | Path) -> None:
    with open_private(path, "w") as f:      # answers and rewards: owner-only, as traces
        for r in rollouts:
            f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")


def read_results(path: str | Path) -> list[Rollout]:
    """The rollouts of a results file: a torn or unreadable line is skipped, and of rows with
    the same key (a retried rollout) the last wins, in the place of the first."""
    out: list[Rollout] = []
    index: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict):
                continue
            ro = Rollout.from_dict(row)
            if ro.key and ro.key in index:
                out[index[ro.key]] = ro
                continue
            if ro.key:
                index[ro.key] = len(out)
            out.append(ro)
    return out
