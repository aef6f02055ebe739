"""`rlms` 0.1.3 (the reference RLM library, `from rlm import RLM`) on recursa's engine.

    from recursa.compat.rlms import RLM          # was: from rlm import RLM
    rlm = RLM(backend="openai", backend_kwargs={"model_name": "gpt-5-mini"}, max_iterations=10)
    out = rlm.completion(long_text, root_prompt="Which customer complained most often?")
    print(out.response, out.usage_summary.to_dict(), out.execution_time)

The constructor takes rlms's arguments and `completion(prompt, root_prompt=None)` returns its
`RLMChatCompletion`; limits raise its exceptions (with `partial_answer`). The run itself is a
recursa run: recursa's prompts, loop, budget ledger and sandbox (`environment="local"` is
recursa's isolated local sandbox, not an exec in your process). What has no recursa equivalent
is refused at construction with a message naming the closest one (`UnsupportedOption`); the
option-by-option table is docs/migrating-from-rlms.md. Extra recursa options (a trace file, the
sandbox, prices, ...: RLM's keywords, or whole groups of recursa.core.config) go in
`recursa_options`, which override the mapped ones.

This module never imports `rlm`: rlms loads `.env` files into the environment when imported,
and the shapes below are recursa's own definitions of the same fields.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recursa.base.types import Event, RecursaError, Result

__all__ = [
    "RLM", "RLMChatCompletion", "UsageSummary", "ModelUsageSummary", "RLMIteration",
    "CodeBlock", "REPLResult", "RLMMetadata", "UnsupportedOption", "BudgetExceededError",
    "TimeoutExceededError", "TokenLimitExceededError", "ErrorThresholdExceededError",
    "CancellationError", "RunFailedError",
]

# rlms backend -> recursa provider prefix (docs/providers.md)
_BACKENDS = {"openai": "openai", "vllm": "vllm", "openrouter": "openrouter", "vercel": "openai",
             "anthropic": "anthropic", "gemini": "gemini", "azure_openai": "azure"}
_VERCEL_URL = "https://ai-gateway.vercel.sh/v1"
# rlms environment -> recursa sandbox. rlms's "local" and "ipython" exec the model's code in
# your process; recursa's "local" runs it in an isolated worker (bubblewrap).
_ENVIRONMENTS = {"local": "local", "ipython": "local", "docker": "docker", "modal": "modal",
                 "e2b": "e2b", "daytona": "daytona"}
# backend_kwargs recursa's clients take as client options (the rest is refused)
_CLIENT_KWARGS = {"timeout", "max_retries", "default_headers", "azure_endpoint", "api_version"}
DEFAULT_QUERY = ("Respond to the prompt stored in `context`: it holds the request and the "
                 "material the request is about.")


# ------------------------------------------------------------------ result shapes (rlms's)
@dataclass
class ModelUsageSummary:
    total_calls: int
    total_input_tokens: int
    total_output_tokens: int
    total_cost: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"total_calls": self.total_calls,
                               "total_input_tokens": self.total_input_tokens,
                               "total_output_tokens": self.total_output_tokens}
        if self.total_cost is not None:
            out["total_cost"] = self.total_cost
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelUsageSummary:
        return cls(data.get("total_calls", 0), data.get("total_input_tokens", 0),
                   data.get("total_output_tokens", 0), data.get("total_cost"))


@dataclass
class UsageSummary:
    model_usage_summaries: dict[str, ModelUsageSummary]

    @property
    def total_cost(self) -> float | None:
        costs = [s.total_cost for s in self.model_usage_summaries.values()
                 if s.total_cost is not None]
        return sum(costs) if costs else None

    @property
    def total_input_tokens(self) -> int:
        return sum(s.total_input_tokens for s in self.model_usage_summaries.values())

    @property
    def total_output_tokens(self) -> int:
        return sum(s.total_output_tokens for s in self.model_usage_summaries.values())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model_usage_summaries": {
            m: s.to_dict() for m, s in self.model_usage_summaries.items()}}
        if self.total_cost is not None:
            out["total_cost"] = self.total_cost
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageSummary:
        return cls({m: ModelUsageSummary.from_dict(s)
                    for m, s in (data.get("model_usage_summaries") or {}).items()})


@dataclass
class RLMChatCompletion:
    """What `completion` returns: the answer in `response`, the spend, the wall time.
    `result` (not in rlms) is recursa's full Result: status, turns, trace path."""

    root_model: str
    prompt: Any
    response: str
    usage_summary: UsageSummary
    execution_time: float
    metadata: dict[str, Any] | None = None
    error: str | None = None
    result: Result | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root_model": self.root_model, "prompt": self.prompt,
                               "response": self.response,
                               "usage_summary": self.usage_summary.to_dict(),
                               "execution_time": self.execution_time}
        if self.metadata is not None:
            out["metadata"] = self.metadata
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RLMChatCompletion:
        return cls(root_model=data.get("root_model", ""), prompt=data.get("prompt"),
                   response=data.get("response", ""),
                   usage_summary=UsageSummary.from_dict(data.get("usage_summary") or {}),
                   execution_time=data.get("execution_time", 0.0),
                   metadata=data.get("metadata"), error=data.get("error"))


@dataclass
class REPLResult:
    stdout: str
    stderr: str
    locals: dict[str, Any] = field(default_factory=dict)   # recursa's sandbox keeps them there
    execution_time: float | None = None
    rlm_calls: list[RLMChatCompletion] = field(default_factory=list)
    final_answer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"stdout": self.stdout, "stderr": self.stderr, "locals": dict(self.locals),
                "execution_time": self.execution_time,
                "rlm_calls": [c.to_dict() for c in self.rlm_calls],
                "final_answer": self.final_answer}


@dataclass
class CodeBlock:
    code: str
    result: REPLResult

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "result": self.result.to_dict()}


@dataclass
class RLMIteration:
    prompt: Any
    response: str
    code_blocks: list[CodeBlock]
    final_answer: str | None = None
    iteration_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "response": self.response,
                "code_blocks": [b.to_dict() for b in self.code_blocks],
                "final_answer": self.final_answer, "iteration_time": self.iteration_time}


@dataclass
class RLMMetadata:
    root_model: str
    max_depth: int
    max_iterations: int
    backend: str
    backend_kwargs: dict[str, Any]
    environment_type: str
    environment_kwargs: dict[str, Any]
    other_backends: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"root_model": self.root_model, "max_depth": self.max_depth,
                "max_iterations": self.max_iterations, "backend": self.backend,
                "backend_kwargs": {k: _plain(v) for k, v in self.backend_kwargs.items()},
                "environment_type": self.environment_type,
                "environment_kwargs": {k: _plain(v) for k, v in self.environment_kwargs.items()},
                "other_backends": self.other_backends}


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


# ------------------------------------------------------------------ errors (rlms's names)
class UnsupportedOption(RecursaError, ValueError):
    """An rlms option with no recursa equivalent; the message names the closest one."""


class _Partial(RecursaError):
    partial_answer: str | None = None
    completion: RLMChatCompletion | None = None   # the spend and recursa's Result (not in rlms)


class BudgetExceededError(_Partial):
    def __init__(self, spent: float, budget: float, message: str | None = None):
        self.spent, self.budget = spent, budget
        super().__init__(message or f"Budget exceeded: spent ${spent:.6f} of ${budget:.6f} budget")


class TimeoutExceededError(_Partial):
    def __init__(self, elapsed: float, timeout: float, partial_answer: str | None = None,
                 message: str | None = None):
        self.elapsed, self.timeout, self.partial_answer = elapsed, timeout, partial_answer
        super().__init__(message or f"Timeout exceeded: {elapsed:.1f}s of {timeout:.1f}s limit")


class TokenLimitExceededError(_Partial):
    def __init__(self, tokens_used: int, token_limit: int, partial_answer: str | None = None,
                 message: str | None = None):
        self.tokens_used, self.token_limit = tokens_used, token_limit
        self.partial_answer = partial_answer
        super().__init__(message or
                         f"Token limit exceeded: {tokens_used:,} of {token_limit:,} tokens")


class ErrorThresholdExceededError(_Partial):
    def __init__(self, error_count: int, threshold: int, last_error: str | None = None,
                 partial_answer: str | None = None, message: str | None = None):
        self.error_count, self.threshold, self.last_error = error_count, threshold, last_error
        self.partial_answer = partial_answer
        super().__init__(message or f"Error threshold exceeded: {error_count} consecutive "
                                    f"errors (limit: {threshold})")


class CancellationError(_Partial):
    def __init__(self, partial_answer: str | None = None, message: str | None = None):
        self.partial_answer = partial_answer
        super().__init__(message or "Execution cancelled by user")


class RunFailedError(_Partial):
    """The run ended in an error (recursa status `error`); rlms would raise the cause itself."""

    def __init__(self, message: str, partial_answer: str | None = None):
        self.partial_answer = partial_answer
        super().__init__(message)


# ------------------------------------------------------------------ option mapping
def _refuse(option: str, why: str) -> UnsupportedOption:
    return UnsupportedOption(f"rlms option {option}: {why} (docs/migrating-from-rlms.md)")


@dataclass
class _Model:
    spec: str
    name: str                      # rlms's model_name: the key of its usage summaries
    base_url: str | None
    api_key: str | None
    client_options: dict[str, Any]
    sampling: dict[str, Any]


def _model(backend: str, kwargs: dict[str, Any] | None, what: str) -> _Model:
    if backend == "portkey":
        raise _refuse(f"{what}='portkey'", "recursa has no Portkey client; use backend='openai' "
                      "with base_url set to Portkey's OpenAI-compatible gateway, or recursa's "
                      "litellm:PROVIDER/MODEL spec")
    if backend not in _BACKENDS:
        raise _refuse(f"{what}={backend!r}", f"unknown backend; recursa maps "
                      f"{', '.join(sorted(_BACKENDS))} (or give RLM a recursa spec: "
                      f"recursa_options={{'model': 'PREFIX:MODEL'}})")
    kw = dict(kwargs or {})
    name = kw.pop("model_name", None) or kw.pop("azure_deployment", None)
    if not name:
        raise _refuse(f"{what}_kwargs", "model_name is required (recursa names every model)")
    base_url, api_key = kw.pop("base_url", None), kw.pop("api_key", None)
    sampling = dict(kw.pop("sampling_args", None) or {})
    if backend == "vllm" and not base_url:
        raise _refuse(f"{what}='vllm'", "base_url is required (the vLLM server's /v1 URL)")
    if backend == "vercel":
        base_url = base_url or _VERCEL_URL
        api_key = api_key or os.environ.get("AI_GATEWAY_API_KEY")
    client = {k: kw.pop(k) for k in list(kw) if k in _CLIENT_KWARGS}
    if kw:
        raise _refuse(f"{what}_kwargs {sorted(kw)}", "not a recursa client option; recursa's "
                      "clients take base_url, api_key, timeout, max_retries, default_headers "
                      "(and azure_endpoint, api_version for Azure): RLM(client_options=...)")
    return _Model(f"{_BACKENDS[backend]}:{name}", str(name), base_url, api_key, client,
                  sampling)


class RLM:
    """rlms's `RLM`, run by recursa. Arguments as in rlms 0.1.3; see the module docstring."""

    def __init__(self, backend: str = "openai", backend_kwargs: dict[str, Any] | None = None,
                 environment: str = "local", environment_kwargs: dict[str, Any] | None = None,
                 depth: int = 0, max_depth: int = 1, max_iterations: int = 30,
                 max_budget: float | None = None, max_timeout: float | None = None,
                 max_tokens: int | None = None, max_errors: int | None = None,
                 custom_system_prompt: str | None = None,
                 other_backends: list[str] | None = None,
                 other_backend_kwargs: list[dict[str, Any]] | None = None,
                 logger: Any = None, verbose: bool = False, persistent: bool = False,
                 custom_tools: dict[str, Any] | None = None,
                 custom_sub_tools: dict[str, Any] | None = None,
                 compaction: bool = False, compaction_threshold_pct: float = 0.85,
                 max_concurrent_subcalls: int | None = None,
                 on_subcall_start: Callable[[int, str, str], None] | None = None,
                 on_subcall_complete: Callable[[int, str, float, str | None], None] | None = None,
                 on_iteration_start: Callable[[int, int], None] | None = None,
                 on_iteration_complete: Callable[[int, int, float], None] | None = None,
                 sampling_args: dict[str, Any] | None = None,
                 sub_sampling_args: dict[str, Any] | None = None,
                 orchestrator: bool = True, user_prologue: str | None = None,
                 recursa_options: dict[str, Any] | None = None):
        from recursa.core.config import GROUPS, RLMConfig
        from recursa.core.rlm import RLM as RecursaRLM

        if depth != 0:
            raise _refuse("depth", "rlms sets it for its own child RLMs; recursa tracks each "
                          "child's depth itself: leave it 0")
        if max_depth < 1:
            raise _refuse("max_depth=0", "an RLM that is a plain model call; call the model "
                          "directly (recursa.models.make_client(spec).complete)")
        if environment not in _ENVIRONMENTS:
            from recursa.sandbox.kinds import kind_names
            unisolated = set(kind_names(isolates=False))
            kinds = ", ".join(k + (" (not isolated)" if k in unisolated else "")
                              for k in kind_names())
            raise _refuse(f"environment={environment!r}", f"recursa's sandboxes are {kinds}: "
                          "recursa_options={'sandbox': ...}")
        if environment_kwargs:
            raise _refuse("environment_kwargs", "recursa's sandboxes take their own options: "
                          "recursa_options={'sandbox_options': {...}} (docs/remote.md)")
        if custom_tools:
            raise _refuse("custom_tools", "recursa runs the model's code in an isolated "
                          "sandbox process, where host functions cannot be injected; give "
                          "functions to the sub-models with recursa_options={'sub_tools': "
                          "[fn, ...]} (recursa.core.tools) and data through the context")
        if custom_sub_tools:
            raise _refuse("custom_sub_tools", "child RLMs get no REPL tools in recursa; "
                          "sub-models can call functions: recursa_options={'sub_tools': [...]}")
        if abs(compaction_threshold_pct - 0.85) > 1e-9:
            raise _refuse("compaction_threshold_pct", "recursa compacts the root's history "
                          "at 85% of its window, always (recursa.core.compaction.WINDOW_FILL)")
        if not orchestrator:
            raise _refuse("orchestrator=False", "rlms's other system prompt; give your own "
                          "with custom_system_prompt")
        if other_backends is not None and len(other_backends) != 1:
            raise _refuse("other_backends", "exactly one other backend (the sub-calls' model), "
                          "as in rlms; more models: recursa_options={'models': {name: spec}}")
        if logger is not None and not all(hasattr(logger, m) for m in ("log", "log_metadata")):
            raise TypeError("logger must be an rlms RLMLogger (or have its log_metadata / log / "
                            "clear_iterations / get_trajectory methods)")

        root = _model(backend, backend_kwargs, "backend")
        sub = _model(other_backends[0], (other_backend_kwargs or [{}])[0],
                     "other_backends") if other_backends else None
        options: dict[str, Any] = dict(
            model=root.spec, base_url=root.base_url, api_key=root.api_key,
            sandbox=_ENVIRONMENTS[environment], max_depth=max_depth - 1,
            max_iterations=max_iterations,
            model_options={**root.sampling, **(sampling_args or {})},
            client_options={**root.client_options, **(sub.client_options if sub else {})})
        if sub is not None:
            options.update(sub_model=sub.spec, sub_base_url=sub.base_url,
                           sub_api_key=sub.api_key)
            if (sub.base_url, sub.api_key) == (root.base_url, root.api_key):
                options["models"] = {sub.name: sub.spec}     # llm_query(p, model=name)
        sub_sampling = {**(sub.sampling if sub else {}), **(sub_sampling_args or {})}
        if sub_sampling:
            options["sub_model_options"] = sub_sampling
        for ours, theirs in (("max_cost_usd", max_budget), ("max_seconds", max_timeout),
                             ("max_tokens", max_tokens), ("max_consecutive_errors", max_errors)):
            if theirs is not None:
                options[ours] = theirs
        if custom_system_prompt:   # used as given: recursa's template fields are not filled in
            options["system_prompt"] = custom_system_prompt.replace("{", "{{").replace("}", "}}")
        if user_prologue:
            options["tips"] = user_prologue
        if max_concurrent_subcalls is not None:
            options["concurrency"] = max_concurrent_subcalls
        if verbose:
            from recursa.obs.console import ConsoleView
            options["sinks"] = [ConsoleView()]
        # recursa_options (flat keywords or whole groups) override the mapped settings
        extra = dict(recursa_options or {})
        groups = {k: extra.pop(k) for k in list(extra)
                  if k in GROUPS and isinstance(extra[k], GROUPS[k])}
        config = RLMConfig.build(**options).with_groups(**groups).replace(**extra)

        self.backend, self.backend_kwargs = backend, backend_kwargs
        self.environment_type = environment
        self.environment_kwargs: dict[str, Any] = {}
        self.depth, self.max_depth, self.max_iterations = 0, max_depth, max_iterations
        self.max_budget, self.max_timeout = max_budget, max_timeout
        self.max_tokens, self.max_errors = max_tokens, max_errors
        self.other_backends, self.other_backend_kwargs = other_backends, other_backend_kwargs
        self.persistent, self.logger, self.compaction = persistent, logger, compaction
        self.on_subcall_start, self.on_subcall_complete = on_subcall_start, on_subcall_complete
        self.on_iteration_start = on_iteration_start
        self.on_iteration_complete = on_iteration_complete
        self.root_model = root.name
        self._rlm = RecursaRLM(config=config)
        self._session: Any = None
        self._session_prompt: Any = None
        if logger is not None:
            logger.log_metadata(RLMMetadata(
                root_model=root.name, max_depth=max_depth, max_iterations=max_iterations,
                backend=backend, backend_kwargs={k: v for k, v in (backend_kwargs or {}).items()
                                                 if "key" not in k.lower()},
                environment_type=environment, environment_kwargs={},
                other_backends=other_backends))

    # ------------------------------------------------------------ rlms's API
    def completion(self, prompt: str | dict[str, Any] | list[Any],
                   root_prompt: str | None = None) -> RLMChatCompletion:
        """Answer `root_prompt` about `prompt` (the context), or respond to `prompt` itself."""
        query = root_prompt if root_prompt and root_prompt.strip() else DEFAULT_QUERY
        if self.logger is not None and hasattr(self.logger, "clear_iterations"):
            self.logger.clear_iterations()
        traj = _Trajectory(self)
        t0 = time.perf_counter()
        try:
            if self.persistent:
                res = self._ask_session(prompt, query, traj)
            else:
                rlm = copy.copy(self._rlm)
                rlm.on_event = _both(self._rlm.on_event, traj.emit)
                res = rlm.completion(query, prompt)
        except KeyboardInterrupt:
            raise CancellationError(message="Execution cancelled by user (Ctrl+C)") from None
        elapsed = time.perf_counter() - t0
        iterations = traj.iterations(res)
        metadata = None
        if self.logger is not None:
            for it in iterations:
                self.logger.log(it)
            getter = getattr(self.logger, "get_trajectory", None)
            metadata = getter() if callable(getter) else None
        out = RLMChatCompletion(root_model=self.root_model, prompt=prompt, response=res.answer,
                                usage_summary=_usage(res), execution_time=elapsed,
                                metadata=metadata, result=res)
        _raise_for_limit(res, self, out)
        return out

    def close(self) -> None:
        """End a persistent session (rlms: clean up the persistent environment)."""
        if self._session is not None:
            self._session.close()
            self._session = self._session_prompt = None

    def __enter__(self) -> RLM:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ask_session(self, prompt: Any, query: str, traj: _Trajectory) -> Result:
        if self._session is None:
            self._session = self._rlm.session(prompt)
            self._session_prompt = prompt
        elif prompt is not self._session_prompt and prompt != self._session_prompt:
            raise _refuse("persistent=True with a new prompt", "a recursa session answers "
                          "follow-up questions about one context (its variables and earlier "
                          "answers carry over): call completion() again with the same prompt "
                          "and a new root_prompt, or pass all the material as one dict/list")
        result: Result = self._session.completion(query, on_event=traj.emit)
        return result


def _both(a: Callable[[Event], Any] | None, b: Callable[[Event], Any]) -> Callable[[Event], Any]:
    if a is None:
        return b

    def call(ev: Event) -> None:
        a(ev)
        b(ev)
    return call


def _usage(res: Result) -> UsageSummary:
    """recursa's per-model usage under rlms's keys (the model name without the provider)."""
    out: dict[str, ModelUsageSummary] = {}
    for key, ru in res.usage_by_model.items():
        name = key.split(":", 1)[1] if ":" in key else key
        s = out.setdefault(name, ModelUsageSummary(0, 0, 0, 0.0))
        s.total_calls += ru.calls
        s.total_input_tokens += ru.usage.input_tokens
        s.total_output_tokens += ru.usage.output_tokens
        s.total_cost = None if ru.cost_usd is None or s.total_cost is None \
            else s.total_cost + ru.cost_usd
    return UsageSummary(out)


def _raise_for_limit(res: Result, rlm: RLM, out: RLMChatCompletion) -> None:
    """rlms raises at its limits (with the best answer so far); iterations running out is not
    one: it answers from the history, as recursa's status `extracted` does."""
    partial = res.answer or None
    err: _Partial | None = None
    tokens = out.usage_summary.total_input_tokens + out.usage_summary.total_output_tokens
    if res.limit == "max_cost_usd" and rlm.max_budget is not None:
        err = BudgetExceededError(res.cost_usd or 0.0, rlm.max_budget)
        err.partial_answer = partial
    elif res.limit == "max_tokens" and rlm.max_tokens is not None:
        err = TokenLimitExceededError(tokens, rlm.max_tokens, partial)
    elif res.limit == "max_seconds" and rlm.max_timeout is not None:
        err = TimeoutExceededError(res.elapsed_s, rlm.max_timeout, partial)
    elif res.limit == "max_consecutive_errors" and rlm.max_errors is not None:
        err = ErrorThresholdExceededError(rlm.max_errors, rlm.max_errors, res.error, partial)
    elif res.status == "error":
        err = RunFailedError(f"the run failed: {res.error}", partial)
    if err is not None:
        err.completion = out
        raise err


class _Trajectory:
    """rlms's per-iteration records and callbacks, from the run's events."""

    def __init__(self, rlm: RLM):
        self.rlm = rlm
        self.turns: dict[str, dict[str, Any]] = {}
        self.cells: dict[str, dict[str, Any]] = {}
        self.children: dict[str, tuple[float, str]] = {}

    def emit(self, ev: Event) -> None:
        d, r = ev.data, self.rlm
        if ev.kind == "turn" and ev.depth == 0 and ev.phase == "start" and "turn" in d:
            self.turns[ev.id] = {"n": d["turn"], "t": ev.t, "text": "", "cells": [],
                                 "elapsed": None}
            if r.on_iteration_start:
                _safe(r.on_iteration_start, 0, d["turn"])
        elif ev.kind == "turn" and ev.phase == "end" and ev.id in self.turns:
            turn = self.turns[ev.id]
            turn["text"], turn["elapsed"] = str(d.get("text") or ""), ev.t - turn["t"]
            if r.on_iteration_complete:
                _safe(r.on_iteration_complete, 0, turn["n"], turn["elapsed"])
        elif ev.kind == "cell" and ev.phase == "start" and ev.parent in self.turns:
            cell = {"code": str(d.get("code") or ""), "out": "", "err": None, "s": None,
                    "ready": False}
            self.cells[ev.id] = cell
            self.turns[ev.parent]["cells"].append(cell)
        elif ev.kind == "cell" and ev.phase == "end" and ev.id in self.cells:
            self.cells[ev.id].update(out=str(d.get("output") or ""), err=d.get("error"),
                                     s=d.get("elapsed_s"), ready=bool(d.get("ready")))
        elif ev.kind == "child" and ev.phase == "start":
            model = str(d.get("model") or r.root_model)
            self.children[ev.id] = (ev.t, model)
            if r.on_subcall_start:
                _safe(r.on_subcall_start, ev.depth, model, str(d.get("query") or "")[:80])
        elif ev.kind == "child" and ev.phase == "end" and ev.id in self.children:
            t, model = self.children.pop(ev.id)
            if r.on_subcall_complete:
                error = d.get("error") if d.get("status") == "error" else None
                _safe(r.on_subcall_complete, ev.depth, model, ev.t - t, error)

    def iterations(self, res: Result) -> list[RLMIteration]:
        out = []
        for turn in sorted(self.turns.values(), key=lambda t: t["n"]):
            blocks = [CodeBlock(c["code"], REPLResult(
                stdout=c["out"], stderr=c["err"] or "", execution_time=c["s"],
                final_answer=res.answer if c["ready"] else None)) for c in turn["cells"]]
            final = next((b.result.final_answer for b in blocks if b.result.final_answer), None)
            out.append(RLMIteration(prompt=None, response=turn["text"], code_blocks=blocks,
                                    final_answer=final, iteration_time=turn["elapsed"]))
        return out


def _safe(fn: Callable[..., Any], *args: Any) -> None:
    try:                    # as in rlms: a failing callback never breaks the run
        fn(*args)
    except Exception:
        pass
