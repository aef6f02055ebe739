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
    the runtime runs with a known bound: recursa.core.planner).
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

    def __init__(self, model: str | ModelClient | None = None,
                 sub_model: str | ModelClient | None = None, *,
                 base_url: str | None = None, api_key: str | None = None,
                 sub_base_url: str | None = None, sub_api_key: str | None = None,
                 models: dict[str, str | ModelClient] | None = None,
                 sandbox: str | Callable[[], Sandbox] = "local",
                 sandbox_options: dict[str, Any] | None = None,
                 budget: Budget | None = None, max_output_chars: int = 8192,
                 concurrency: int = 32, trace_dir: str | Path | None = None,
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
                 cache_nondeterministic: bool = False,
                 prices: Mapping[str, Any] | None = None, preflight: bool = True,
                 strategy: str = "auto", example: bool = True, sources: bool = False,
                 route: str = "rlm", route_threshold: int | None = None,
                 mcp_servers: str | os.PathLike[str] | Mapping[str, Any] | None = None,
                 **limits: Any):
        unknown = set(limits) - _BUDGET_FIELDS
        if unknown:
            raise TypeError(f"RLM() got unknown option(s): {', '.join(sorted(unknown))}")
        from recursa.models import resolve_model  # aliases and the default model
        if model is None or isinstance(model, str):
            model, _reason = resolve_model(model)
        if isinstance(sub_model, str):
            sub_model = resolve_model(sub_model)[0]
        models = {k: resolve_model(v)[0] if isinstance(v, str) else v
                  for k, v in (models or {}).items()}
        self.model = model
        self.sub_model = sub_model if sub_model is not None else model
        for spec in (self.model, self.sub_model, *(models or {}).values()):
            _check_spec(spec)
        self.base_url, self.api_key = base_url, api_key
        self.sub_base_url, self.sub_api_key = sub_base_url, sub_api_key
        self.models = dict(models or {})
        self.sandbox = sandbox
        self.sandbox_options = dict(sandbox_options or {})
        self.budget = (budget or Budget()).model_copy(update=limits)
        Budget.model_validate(self.budget.model_dump())   # re-validate the merged limits
        if max_output_chars < 256:
            raise ValueError("max_output_chars must be at least 256")
        self.max_output_chars = max_output_chars
        self.concurrency = concurrency
        self.trace_dir = Path(trace_dir) if trace_dir else None
        self.trace_path = Path(trace_path) if trace_path else None
        self.on_event = on_event
        self.sinks = list(sinks or [])
        self.tips = tips
        self.system_prompt = system_prompt
        self.model_options = dict(model_options or {})
        self.sub_model_options = dict(sub_model_options or {})
        self.client_options = dict(client_options or {})
        self.prices = dict(prices or {})
        self.preflight = preflight
        # tools only sub-models may call; the root is told their names in its system prompt
        self.sub_tools: ToolSet | None = None
        if sub_tools:   # recursa.core.tools loads only for a run that has tools
            from recursa.core.tools import ToolSet
            self.sub_tools = ToolSet.of(sub_tools)
        self.tool_names: list[str] | None = self.sub_tools.names if self.sub_tools else None
        if last_turn_seconds is not None and last_turn_seconds <= 0:
            raise ValueError("last_turn_seconds must be positive")
        self.last_turn_seconds = last_turn_seconds
        # response cache (recursa.models.cache): opened now, so a bad path fails here; that
        # module (and sqlite3, ~2 ms of start-up) loads only when a cache is asked for
        self.cache: ResponseCache | None = None
        if cache is not None and cache is not False:
            from recursa.models.cache import open_cache
            self.cache = open_cache(cache)
        self.cache_nondeterministic = cache_nondeterministic
        from recursa.core.strategy import check_strategy
        self.strategy = check_strategy(strategy)
        self.example = bool(example)
        self.sources = bool(sources)
        from recursa.core.route import check_route, check_threshold
        self.route = check_route(route)
        self.route_threshold = check_threshold(route_threshold)
        # shown under the query in the root's first message (a session's earlier Q&A)
        self.preface: str | None = None
        # MCP servers (recursa.core.mcp_tools): checked now, started with each run
        self.mcp_servers: list[ServerConfig] = []
        if mcp_servers is not None:
            from recursa.core.mcp_tools import load_servers
            self.mcp_servers = load_servers(mcp_servers)

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
                    McpHub(self.mcp_servers, ledger=ledger, tracer=tracer))
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


def _check_spec(spec: Any) -> None:
    """Fail at construction, not mid-run, on a spec no provider serves."""
    if isinstance(spec, str):
        from recursa.models import provider_for_spec
        provider_for_spec(spec)


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
