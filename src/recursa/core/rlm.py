"""The public RLM class: configuration, one async core, a thin sync wrapper."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recursa.base.types import Event, ModelClient, Result, Sandbox, TraceSink, context_window
from recursa.core.budget import Budget, Ledger
from recursa.core.config import (
    ModelsConfig,
    RLMConfig,
    SandboxConfig,
    Setting,
    StrategyConfig,
    TracingConfig,
)
from recursa.core.deadline import Allowance, Deadline, default_reserve
from recursa.core.loop import RunEnv, run_loop
from recursa.core.output import OutputSpec

# loading the notebook module also gives Result its Jupyter view (recursa.base.types.html_view),
# for Results of this process's runs and of runs elsewhere (Ray batch workers) alike
from recursa.obs.notebook import auto_sinks
from recursa.obs.trace import CallbackSink, JsonlSink, Tracer, new_id

if TYPE_CHECKING:
    from recursa.core.mcp_tools import ServerConfig
    from recursa.core.route import Route
    from recursa.core.session import Session
    from recursa.core.tools import Tool, ToolSet
    from recursa.models.cache import ResponseCache

_BUDGET_FIELDS = set(Budget.model_fields)


@dataclass
class RunScope:
    """What a caller puts around one run instead of changing the RLM (a session's question):
    the top-level run's sandbox (children still get fresh ones), the trace file, one more
    event hook, the preface under the query, and the parent ledger and time allowance whose
    limits apply too (the run's spend is counted there as it happens)."""

    sandbox: Sandbox | None = None
    trace_path: Path | None = None
    on_event: Callable[[Event], Any] | None = None
    preface: str | None = None
    ledger: Ledger | None = None
    allowance: Allowance | None = None


class RLM:
    """A Recursive Language Model.

    >>> rlm = RLM(model="openai:gpt-5", sub_model="openai:gpt-5-mini", max_cost_usd=1.0)
    >>> res = rlm.completion("Which customer complained most often?", context=huge_text)

    The settings are one value, `rlm.config` (a `recursa.core.config.RLMConfig` of five
    groups: models, sandbox, budget, tracing, strategy): `RLM(config=...)` takes one, `budget=`,
    `tracing=` and `models=` / `sandbox=` / `strategy=` take a whole group, and every keyword
    below is sugar for one group field (the table: recursa.core.config, docs/config.md). A keyword
    may fill in what a given group left unset; two different values for one field are a
    ConfigError. The flat attributes (`rlm.strategy`, `rlm.budget`, ...) read and write it.

    `model` / `sub_model` are spec strings (`openai:...`, `anthropic:...`, `local:...`, ...) or
    ModelClient objects; `base_url` / `api_key` apply to the root model and, unless
    `sub_base_url` / `sub_api_key` are given, to a sub-model of the same provider. Limits
    (`max_iterations`, `max_depth`, `max_subcalls`, `max_tokens`, `max_cost_usd`, `max_seconds`,
    `cell_timeout`, `max_consecutive_errors`) may be given one by one or as `budget=Budget(...)`,
    and overridden per call. `sub_tools`: functions (or a `recursa.core.tools.ToolSet`) that only
    sub-models may call; the REPL and the root see only the sub-model's final answer.
    `prices` ({model spec: Price | (in, out) | dict}, USD per 1M tokens) prices models without a
    built-in price; a run with `max_cost_usd` needs a price (or a provider-reported cost) for
    every model. `preflight` (default on): before the first model call, check keys, model
    files, endpoints, the sandbox and the cost limit, raising PreflightError if one fails.
    `cache`: True (the default file), a path, or a `recursa.models.cache.ResponseCache`:
    replies to requests seen before come from disk at no cost (docs/cache.md).
    `max_seconds` is a wall-clock promise: the one last-answer turn the run gets at a limit is
    reserved inside it (recursa.core.deadline). `last_turn_seconds`: that turn's time (default: a
    quarter of `max_seconds`, at most 60 s; never more than half of it), and its own timeout
    (without `max_seconds`, the only one besides the client's).
    `strategy`: "auto" (the default: plan for small root models, code for the rest;
    recursa.core.strategy), "code" (free-form code) or "plan" (the root first fills a typed plan
    the runtime runs with a known bound: recursa.core.strategies.plan).
    `example=False` leaves the worked example out of the system prompt.
    `sources=True` teaches the root to attach the passages its answer rests on
    (`FINAL(answer, sources=[...])`); sources a run's answer carries are checked against the
    context either way: `Result.sources`, `Result.sources_verified` (recursa.core.sources).
    `route`: "rlm" (the default: every run runs the REPL loop), "direct" (one plain model call
    with the context in the prompt) or "auto": direct when the prompt plus the reply reserve
    fits `route_threshold` tokens (default: half the root model's declared window, else 8,192),
    else the loop (recursa.core.route); `Result.route` says which ran. A session's questions
    always run the loop.
    `mcp_servers`: MCP servers whose allowed tools become typed functions in the REPL,
    `mcp_<server>_<tool>(...)`, called by the host (a path to a JSON file or its dict:
    `{"mcpServers": {name: {"command", "args", "env", "allow": [...]}}}`; recursa.core.mcp_tools,
    docs/tools.md). They start with each run and close when it ends.
    """

    # the flat settings, read from and written to `config` (recursa.core.config.FLAT)
    base_url: Setting[str | None] = Setting("base_url")
    api_key: Setting[str | None] = Setting("api_key")
    sub_base_url: Setting[str | None] = Setting("sub_base_url")
    sub_api_key: Setting[str | None] = Setting("sub_api_key")
    models: Setting[dict[str, str | ModelClient]] = Setting("models")
    model_options: Setting[dict[str, Any]] = Setting("model_options")
    sub_model_options: Setting[dict[str, Any]] = Setting("sub_model_options")
    client_options: Setting[dict[str, Any]] = Setting("client_options")
    prices: Setting[dict[str, Any]] = Setting("prices")
    cache_nondeterministic: Setting[bool] = Setting("cache_nondeterministic")
    concurrency: Setting[int] = Setting("concurrency")
    sandbox: Setting[str | Callable[[], Sandbox]] = Setting("sandbox")
    sandbox_options: Setting[dict[str, Any]] = Setting("sandbox_options")
    max_output_chars: Setting[int] = Setting("max_output_chars")
    trace_dir: Setting[Path | None] = Setting("trace_dir")
    trace_path: Setting[Path | None] = Setting("trace_path")
    on_event: Setting[Callable[[Event], Any] | None] = Setting("on_event")
    sinks: Setting[list[TraceSink]] = Setting("sinks")
    strategy: Setting[str] = Setting("strategy")
    route: Setting[str] = Setting("route")
    route_threshold: Setting[int | None] = Setting("route_threshold")
    tips: Setting[str | None] = Setting("tips")
    system_prompt: Setting[str | None] = Setting("system_prompt")
    example: Setting[bool] = Setting("example")
    sources: Setting[bool] = Setting("sources")
    sub_tools: Setting[ToolSet | None] = Setting("sub_tools")
    last_turn_seconds: Setting[float | None] = Setting("last_turn_seconds")
    preflight: Setting[bool] = Setting("preflight")
    # MCP servers (recursa.core.mcp_tools): checked when the RLM is made, started with each run
    mcp_servers: Setting[tuple[ServerConfig, ...]] = Setting("mcp_servers")

    def __init__(self, model: str | ModelClient | None = None,
                 sub_model: str | ModelClient | None = None, *,
                 config: RLMConfig | None = None,
                 base_url: str | None = None, api_key: str | None = None,
                 sub_base_url: str | None = None, sub_api_key: str | None = None,
                 models: dict[str, str | ModelClient] | ModelsConfig | None = None,
                 sandbox: str | Callable[[], Sandbox] | SandboxConfig | None = None,
                 sandbox_options: dict[str, Any] | None = None,
                 budget: Budget | None = None, max_output_chars: int | None = None,
                 concurrency: int | None = None, tracing: TracingConfig | None = None,
                 trace_dir: str | Path | None = None,
                 trace_path: str | Path | None = None,
                 on_event: Callable[[Event], Any] | None = None,
                 sinks: list[TraceSink] | None = None,
                 tips: str | None = None, system_prompt: str | None = None,
                 model_options: dict[str, Any] | None = None,
                 sub_model_options: dict[str, Any] | None = None,
                 client_options: dict[str, Any] | None = None,
                 sub_tools: ToolSet | Sequence[Callable[..., Any] | Tool] | None = None,
                 last_turn_seconds: float | None = None,
                 cache: bool | str | os.PathLike[str] | ResponseCache | None = None,
                 cache_nondeterministic: bool | None = None,
                 prices: Mapping[str, Any] | None = None, preflight: bool | None = None,
                 strategy: str | StrategyConfig | None = None, example: bool | None = None,
                 sources: bool | None = None,
                 route: str | None = None, route_threshold: int | None = None,
                 mcp_servers: str | os.PathLike[str] | Mapping[str, Any] | None = None,
                 **limits: Any):
        # a group object where a keyword also takes a plain value (sandbox="docker" or
        # sandbox=SandboxConfig(...)), as httpx's timeout= takes a number or a Timeout
        groups: dict[str, Any] = {"budget": budget, "tracing": tracing}
        flat: dict[str, Any] = dict(
            model=model, sub_model=sub_model, base_url=base_url, api_key=api_key,
            sub_base_url=sub_base_url, sub_api_key=sub_api_key, models=models,
            sandbox=sandbox, sandbox_options=sandbox_options,
            max_output_chars=max_output_chars, concurrency=concurrency, trace_dir=trace_dir,
            trace_path=trace_path, on_event=on_event, sinks=sinks, tips=tips,
            system_prompt=system_prompt, model_options=model_options,
            sub_model_options=sub_model_options, client_options=client_options,
            sub_tools=sub_tools, last_turn_seconds=last_turn_seconds, cache=cache,
            cache_nondeterministic=cache_nondeterministic, prices=prices, preflight=preflight,
            strategy=strategy, example=example, sources=sources, route=route,
            route_threshold=route_threshold, mcp_servers=mcp_servers)
        for name, cls in (("models", ModelsConfig), ("sandbox", SandboxConfig),
                          ("strategy", StrategyConfig)):
            if isinstance(flat[name], cls):
                groups[name] = flat.pop(name)
        unknown = set(limits) - _BUDGET_FIELDS
        if unknown:
            raise TypeError(f"RLM() got unknown option(s): {', '.join(sorted(unknown))}")
        cfg = RLMConfig.build(config, groups=groups, **flat, **limits)
        # the effective config: aliases and the default model resolved, specs checked
        self.config: RLMConfig = cfg.with_groups(models=cfg.models.resolved())
        # response cache (recursa.models.cache): opened now, so a bad path fails here; that
        # module (and sqlite3, ~2 ms of start-up) loads only when a cache is asked for
        self.cache: ResponseCache | None = None
        spec = self.config.models.cache
        if spec is not None and spec is not False:
            from recursa.models.cache import open_cache
            self.cache = open_cache(spec)
        # shown under the query in the root's first message (a session's earlier Q&A)
        self.preface: str | None = None

    # the root model, resolved; the sub-model (the root's when none was named); the limits
    @property
    def model(self) -> str | ModelClient:
        spec = self.config.models.model
        assert spec is not None     # resolved at construction
        return spec

    @model.setter
    def model(self, value: str | ModelClient) -> None:
        self.config = self.config.replace(model=value)

    @property
    def sub_model(self) -> str | ModelClient:
        return self.config.models.sub_model if self.config.models.sub_model is not None \
            else self.model

    @sub_model.setter
    def sub_model(self, value: str | ModelClient | None) -> None:
        self.config = self.config.replace(sub_model=value)

    @property
    def budget(self) -> Budget:
        return self.config.budget

    @budget.setter
    def budget(self, value: Budget) -> None:
        self.config = self.config.with_groups(budget=value)

    @property
    def tool_names(self) -> list[str] | None:
        """The sub-models' tools, named to the root in its system prompt."""
        return self.sub_tools.names if self.sub_tools else None

    # ------------------------------------------------------------ public API
    def completion(self, query: str, context: Any = None, *, output: Any = None,
                   **limits: Any) -> Result:
        """Blocking twin of `acompletion`; safe to call from inside a running event loop."""
        from recursa.base.blocking import run_blocking
        return run_blocking(self.acompletion(query, context, output=output, **limits))

    async def acompletion(self, query: str, context: Any = None, *, output: Any = None,
                          **limits: Any) -> Result:
        """Answer `query` about `context`. `output`: a pydantic model class (or a type
        pydantic's TypeAdapter takes, or a JSON schema dict, or a `recursa.core.output.OutputSpec`)
        the answer must match; `Result.parsed` then holds the validated value (see
        recursa.core.output)."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        spec = OutputSpec.of(output) if output is not None else None
        unknown = set(limits) - _BUDGET_FIELDS
        if unknown:
            raise TypeError(f"unknown limit(s): {', '.join(sorted(unknown))}")
        budget = Budget.model_validate({**self.budget.model_dump(), **limits})
        return await self.arun(query, context, budget, output=spec)

    async def arun(self, query: str, context: Any, budget: Budget, *,
                   output: OutputSpec | None = None, scope: RunScope | None = None) -> Result:
        """One run with `budget`, in `scope` (see RunScope): what `acompletion` and a
        session's questions call."""
        scope = scope or RunScope()
        run_id = new_id()
        trace_path = scope.trace_path or self._trace_file(run_id)
        sinks: list[TraceSink] = list(self.sinks)
        if trace_path:
            sinks.append(JsonlSink(trace_path, redact=self._redactor()))
        for hook in (self.on_event, scope.on_event):
            if hook is not None:
                sinks.append(CallbackSink(hook))
        sinks.extend(auto_sinks())     # a live progress line in a Jupyter kernel; none elsewhere
        tracer = Tracer(sinks, run_id)
        deadline = scope.allowance.deadline(budget.max_seconds,
                                            last_turn_seconds=self.last_turn_seconds) \
            if scope.allowance is not None else \
            Deadline(budget.max_seconds,
                     reserve=default_reserve(budget.max_seconds, self.last_turn_seconds))
        owned: list[ModelClient] = []
        servers = contextlib.AsyncExitStack()    # the run's MCP servers, closed in any case
        try:
            root = self._client(self.model, self.base_url, self.api_key, owned)
            sub = root if self.sub_model == self.model else self._client(
                self.sub_model, self.sub_base_url or self._same_provider_url(),
                self.sub_api_key or self._same_provider_key(), owned)
            extra = {name: self._client(spec, self.base_url, self.api_key, owned)
                     for name, spec in self.models.items()}
            extra.setdefault(root.name, root)
            # a session's question runs in its kept sandbox, and MCP tools are called from the
            # REPL: never routed
            routed = await self._aroute(query, context, root, output) \
                if scope.sandbox is None and not self.mcp_servers else None
            direct = routed is not None and routed.path == "direct"
            if self.preflight:     # fail before the first model call, having spent nothing
                from recursa.core.preflight import acheck, target_of_client
                await acheck([target_of_client(c) for c in (root, sub, *extra.values())],
                             max_cost_usd=budget.max_cost_usd,
                             sandbox=None if direct else self.sandbox,
                             sandbox_options=self.sandbox_options)
            ledger = Ledger(budget, deadline=deadline, parent=scope.ledger)
            if routed is not None and direct:
                from recursa.core.route import run_direct
                return await run_direct(routed, query, client=root, sub_client=sub,
                                        budget=budget, ledger=ledger, tracer=tracer,
                                        options=self.model_options, output=output,
                                        trace_path=str(trace_path) if trace_path else None)
            tools, hub = self.sub_tools, None
            if self.mcp_servers:
                from recursa.core.mcp_tools import McpHub
                hub = await servers.enter_async_context(
                    McpHub(list(self.mcp_servers), ledger=ledger, tracer=tracer))
                tools = hub.with_sub_tools(tools)
            env = RunEnv(budget=budget, ledger=ledger, tracer=tracer, root_client=root, sub_client=sub, clients=extra,
                         concurrency=self.concurrency, sub_options=self.sub_model_options,
                         tools=tools, make_sandbox=self._make_sandbox,
                         root_sandbox=scope.sandbox,
                         trace_path=str(trace_path) if trace_path else None,
                         max_output_chars=self.max_output_chars, root_options=self.model_options,
                         tips=self.tips, tool_names=tools.names if tools else None, mcp=hub,
                         system_template=self.system_prompt,
                         sub_context_chars=_context_chars(sub),
                         last_turn_seconds=self.last_turn_seconds, output=output,
                         preface=scope.preface or self.preface, example=self.example,
                         strategy=self.strategy, sources=self.sources,
                         route=routed.note() if routed is not None else None)
            res = await run_loop(env, query, context)
            res.route = "rlm"
            return res
        finally:
            await servers.aclose()
            deadline.close()
            for c in owned:
                try:
                    await c.aclose()
                except Exception:
                    pass
            tracer.close()

    def route_for(self, query: str, context: Any, *, output: Any = None,
                  root: ModelClient | None = None) -> Route:
        """The path `completion(query, context)` would take (recursa.core.route), by the
        window of `root` (default: the root model when it is a client object; a spec string
        is not built here, so its window counts as unknown)."""
        from recursa.core.route import decide
        if root is None and not isinstance(self.model, str):
            root = self.model
        spec = OutputSpec.of(output) if output is not None else None
        return decide(self.route, query, context, client=root, options=self.model_options,
                      threshold=self.route_threshold, output=spec, sources=self.sources)

    async def _aroute(self, query: str, context: Any, root: ModelClient,
                      output: OutputSpec | None) -> Route | None:
        """The run's route (None: "rlm", nothing to decide); a path or bytes is read to
        measure it off the event loop."""
        if self.route == "rlm":
            return None
        from recursa.core.route import decide
        args = (self.route, query, context)
        kw: dict[str, Any] = dict(client=root, options=self.model_options,
                                  threshold=self.route_threshold, output=output,
                                  sources=self.sources)
        if isinstance(context, str):
            return decide(*args, **kw)
        return await asyncio.to_thread(decide, *args, **kw)

    def session(self, context: Any, *, idle_timeout: float | None = None,
                trace_path: str | os.PathLike[str] | None = None,
                loop: asyncio.AbstractEventLoop | None = None, **limits: Any) -> Session:
        """Several questions about `context` in one kept sandbox (recursa.core.session): variables
        and earlier answers carry over. `limits` (max_cost_usd, max_tokens, max_subcalls,
        max_seconds) cap the questions together; `idle_timeout` (s, default 600) closes an
        unused session. Use as a context manager (`with` or `async with`) or call close().
        `loop`: live on this running event loop (async use from it only) instead of a thread
        of the session's own, e.g. to share model clients bound to a server's loop."""
        if self.mcp_servers:
            from recursa.core.mcp_tools import McpConfigError
            raise McpConfigError("MCP servers (mcp_servers) are not available in sessions yet: "
                                 "they start and stop with each run of completion()")
        from recursa.core.session import Session
        return Session(self, context, idle_timeout=idle_timeout, trace_path=trace_path,
                       loop=loop, **limits)

    async def asession(self, context: Any, **options: Any) -> Session:
        """`session(...)` with the context already loaded in its sandbox."""
        s = self.session(context, **options)
        try:
            await s.astart()
        except BaseException:
            await s.aclose()
            raise
        return s

    def batch(self, items: Any = None, **options: Any) -> Any:
        """Many runs at once: (query, context) pairs, or `query=` over `contexts=` (paths, a
        directory, a JSONL / CSV / Parquet file); results in order under one batch `budget`
        (recursa.core.batch, docs/batch.md)."""
        from recursa.core.batch.run import batch
        return batch(self, items, **options)

    async def abatch(self, items: Any = None, **options: Any) -> Any:
        """Async twin of `batch`."""
        from recursa.core.batch.run import abatch
        return await abatch(self, items, **options)

    def iter_batch(self, items: Any = None, **options: Any) -> Any:
        """`batch`, yielding each item's ItemResult as it finishes."""
        from recursa.core.batch.run import iter_batch
        return iter_batch(self, items, **options)

    def aiter_batch(self, items: Any = None, **options: Any) -> Any:
        """Async iterator twin of `iter_batch`."""
        from recursa.core.batch.run import aiter_batch
        return aiter_batch(self, items, **options)

    # ------------------------------------------------------------ helpers
    def _client(self, spec: str | ModelClient, base_url: str | None, api_key: str | None,
                owned: list[ModelClient]) -> ModelClient:
        if not isinstance(spec, str):    # a client object: it declares what it can do
            from recursa.models.declared import declared
            return self._cached(declared(spec))
        from recursa.models import make_run_client
        opts = {**self.client_options, **({"prices": self.prices} if self.prices else {})}
        client = make_run_client(spec, opts, base_url=base_url, api_key=api_key)
        owned.append(client)
        return self._cached(client)

    def _cached(self, client: ModelClient) -> ModelClient:
        """`client` behind the response cache, if this RLM has one."""
        if self.cache is None:
            return client
        from recursa.models.cache import cached
        return cached(client, self.cache, nondeterministic=self.cache_nondeterministic)

    def _provider(self, spec: Any) -> str | None:
        return spec.split(":", 1)[0] if isinstance(spec, str) else None

    def _same_provider_url(self) -> str | None:
        same = self._provider(self.sub_model) == self._provider(self.model)
        return self.base_url if same else None

    def _same_provider_key(self) -> str | None:
        same = self._provider(self.sub_model) == self._provider(self.model)
        return self.api_key if same else None

    def _make_sandbox(self) -> Sandbox:
        if callable(self.sandbox):
            return self.sandbox()
        from recursa.sandbox import make_sandbox
        return make_sandbox(self.sandbox, **self.sandbox_options)

    def _trace_file(self, run_id: str) -> Path | None:
        if self.trace_path:
            return self.trace_path
        if self.trace_dir:
            return self.trace_dir / f"run-{run_id}.jsonl"
        return None

    def _redactor(self) -> Callable[[str], str]:
        from recursa.obs.trace import Redactor
        return Redactor([k for k in (self.api_key, self.sub_api_key) if k])


def _context_chars(client: ModelClient) -> int:
    """How many characters a sub-model can read at once, from its window when it knows it."""
    window = context_window(client)
    return int(window * 3) if window else 100_000


async def acompletion(query: str, context: Any = None, *, output: Any = None,
                      **kwargs: Any) -> Result:
    """One-shot async RLM run; kwargs go to RLM()."""
    return await RLM(**kwargs).acompletion(query, context, output=output)


def completion(query: str, context: Any = None, *, output: Any = None, **kwargs: Any) -> Result:
    """One-shot blocking RLM run; kwargs go to RLM()."""
    return RLM(**kwargs).completion(query, context, output=output)
