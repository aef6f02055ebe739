"""The methods the bench compares, each one `async (config, instance, trace_path) -> Result`.

- `rlm`          recursa's RLM (depth 1 by default; `rlm-d0` has no sub-calls at all, `rlm-d2`
                 lets `rlm_query` open children one level deeper, and so on);
- `direct`       the whole input in one prompt. An input beyond the model's window is a recorded
                 failure (status `error`, limit `context_window`), never silently cut;
                 `direct-trunc` keeps the head and tail that fit instead;
- `compaction`   read the input in windows, keep a running summary, answer from the summary;
- `codeact-bm25` a code-acting agent on recursa's own loop and sandbox that never gets the input:
                 its REPL has `search(query, k)` over BM25-indexed passages, plus `llm_query` /
                 `llm_batch` sub-calls.

All of them use the same model clients, one Budget/Ledger per run, the same JSONL trace format,
and return a `recursa.base.types.Result`, so the runner treats them alike.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from recursa.base.types import (
    BudgetExceeded,
    CallHandler,
    Cell,
    ContextPayload,
    ModelClient,
    ModelError,
    Result,
    Sandbox,
    context_window,
)
from recursa.core.budget import Budget
from recursa.core.config import (
    ModelsConfig,
    RLMConfig,
    SandboxConfig,
    StrategyConfig,
    TracingConfig,
)
from recursa.core.plainrun import PlainRun
from recursa.core.retrieval import BM25Index

from .tasks.base import CHARS_PER_TOKEN, Instance

METHODS = ("rlm", "direct", "compaction", "codeact-bm25")
DEFAULT_ANSWER_TOKENS = 512       # output cap for direct / compaction answers


class MethodConfig(BaseModel):
    """Everything a method needs besides the instance. JSON-serialisable, so a run spec can be
    shipped to another process (or a Ray task) as a plain dict."""

    method: str = "rlm"                   # base name, one of METHODS
    depth: int = Field(1, ge=0)           # rlm only
    truncate: bool = False                # direct only
    model: str
    sub_model: str | None = None
    base_url: str | None = None
    sub_base_url: str | None = None
    api_key_env: str | None = None        # variables holding the keys (read where the run runs)
    sub_api_key_env: str | None = None
    prices: dict[str, tuple[float, float]] = Field(default_factory=dict)  # USD per 1M in/out
    sandbox: str = "local"
    limits: dict[str, Any] = Field(default_factory=dict)       # Budget fields
    max_output_chars: int = 8192
    subcall_concurrency: int = 8
    client_options: dict[str, Any] = Field(default_factory=dict)   # e.g. {"n_ctx": 16384}
    model_options: dict[str, Any] = Field(default_factory=dict)    # e.g. {"temperature": 0}
    window_tokens: int | None = None      # the root model's window; default: the client's own
    chunk_tokens: int = 2000              # compaction window
    passage_tokens: int = 200             # codeact-bm25 passage size
    tips: str | None = None
    cache: bool | str | None = None       # response cache: True (default file) or a path
    worked_example: bool = True           # rlm / codeact-bm25: False cuts it (the ablation)
    strategy: Literal["code", "plan", "auto"] = "code"   # rlm only (recursa.core.strategies.plan)

    @model_validator(mode="before")
    @classmethod
    def _strategy_of_label(cls, data: Any) -> Any:   # method "rlm-plan": rlm in plan mode
        if isinstance(data, dict) and str(data.get("method", "")).startswith("rlm-"):
            data = {**data, "method": "rlm", "strategy": data["method"].split("-", 1)[1]}
        return data

    @field_validator("cache", mode="before")
    @classmethod
    def _path_str(cls, v: Any) -> Any:    # a Path becomes its string: specs stay plain JSON
        return os.fspath(v) if isinstance(v, os.PathLike) else v

    @property
    def label(self) -> str:
        return method_label(self.method, self.depth, self.truncate, self.strategy,
                            self.worked_example)

    def rlm_config(self, root: ModelClient, sub: ModelClient,
                   trace_path: str | None) -> RLMConfig:
        """The RLM settings the REPL methods (rlm, codeact-bm25) share, with this run's
        clients; each method sets its depth, prompt and sandbox on top."""
        return RLMConfig(
            models=ModelsConfig(model=root, sub_model=sub, concurrency=self.subcall_concurrency,
                                model_options=dict(self.model_options),
                                sub_model_options=dict(self.model_options)),
            sandbox=SandboxConfig(kind=self.sandbox, max_output_chars=self.max_output_chars),
            budget=Budget(**self.limits), tracing=TracingConfig(trace_path=trace_path),
            strategy=StrategyConfig(tips=self.tips))


NO_EXAMPLE = "-noex"


def method_label(method: str, depth: int = 1, truncate: bool = False,
                 strategy: str = "code", worked_example: bool = True) -> str:
    """The name a method run is filed under: rlm, rlm-d0, rlm-d2, rlm-plan, rlm-d2-auto,
    direct, direct-trunc, ...; `-noex` when the system prompt's worked example was cut
    (rlm-noex, rlm-plan-noex, codeact-bm25-noex)."""
    suffix = "" if worked_example else NO_EXAMPLE
    if method == "rlm" and (depth != 1 or strategy != "code"):
        return "rlm" + (f"-d{depth}" if depth != 1 else "") + \
            (f"-{strategy}" if strategy != "code" else "") + suffix
    if method == "direct" and truncate:
        return "direct-trunc"
    return method + suffix


def split_worked_example(label: str) -> tuple[str, bool]:
    """'rlm-noex' -> ('rlm', False); 'rlm' -> ('rlm', True). Only the methods whose prompt has
    a worked example take the suffix."""
    label = label.strip()
    if label.endswith(NO_EXAMPLE):
        base = label[:-len(NO_EXAMPLE)]
        if base == "codeact-bm25" or re.fullmatch(r"rlm(-d\d+)?(-plan|-auto)?", base):
            return base, False
        raise ValueError(f"{label!r}: only rlm and codeact-bm25 have a worked example to cut")
    return label, True


def without_worked_example(system: str) -> str:
    """A system prompt with its worked example (from "Example of a whole run" to the tips)
    cut out: the with / without ablation the held-out protocol asks for on dev."""
    start = system.find("Example of a whole run")
    end = system.rfind("{tips}")
    if start < 0 or end < start:
        return system
    return system[:start] + system[end:]


def parse_method(label: str, depth: int = 1, truncate: bool = False) -> tuple[str, int, bool]:
    """Inverse of method_label; a bare `rlm` / `direct` takes the given depth / truncate."""
    label = label.strip()
    m = re.fullmatch(r"rlm(?:-d(\d+))?-(plan|auto)", label)
    if m:   # MethodConfig(method="rlm-plan") is rlm with strategy="plan"
        return f"rlm-{m.group(2)}", int(m.group(1)) if m.group(1) else depth, False
    m = re.fullmatch(r"rlm-d(\d+)", label)
    if m:
        return "rlm", int(m.group(1)), False
    if label == "direct-trunc":
        return "direct", 1, True
    from .baselines import BASELINES
    if label in BASELINES:
        return label, 1, False
    if label not in METHODS:
        raise ValueError(f"unknown method {label!r}; known: {', '.join(METHODS)}, rlm-dN, "
                         "rlm-plan, rlm-auto, rlm-dN-plan, direct-trunc, and the baselines "
                         f"{', '.join(BASELINES)}")
    return label, depth if label == "rlm" else 1, truncate if label == "direct" else False


# ---------------------------------------------------------------- shared helpers
def context_text(context: Any) -> str:
    """One string for methods that read text: documents of a list or dict get a header each."""
    if isinstance(context, str):
        return context
    if isinstance(context, dict):
        return "\n\n".join(f"### {k}\n{v}" for k, v in context.items())
    if isinstance(context, list):
        return "\n\n".join(f"### Document {i}\n{x}" for i, x in enumerate(context))
    return str(context)


def split_chunks(text: str, chunk_chars: int) -> list[str]:
    """Cut text into pieces of at most ~chunk_chars, preferring a paragraph, line or word end."""
    out: list[str] = []
    i = 0
    while i < len(text):
        end = min(len(text), i + chunk_chars)
        if end < len(text):
            window = text[i:end]
            for sep in ("\n\n", "\n", ". ", " "):
                cut = window.rfind(sep)
                if cut > chunk_chars // 2:
                    end = i + cut + len(sep)
                    break
        out.append(text[i:end])
        i = end
    return out


def _make_clients(cfg: MethodConfig) -> tuple[ModelClient, ModelClient]:
    from recursa.models import make_client, provider_for_spec, resolve_model
    from recursa.models.cache import cached

    def build(spec: str, base_url: str | None, key_env: str | None) -> ModelClient:
        spec = resolve_model(spec)[0]
        # client options (n_ctx, ...) are for in-process clients; endpoints get base_url only
        opts = dict(cfg.client_options) if spec.startswith(("local:", "replay:")) else {}
        if spec.startswith("replay:") and isinstance(opts.get("responder"), str):
            opts["responses"] = _import_attr(opts.pop("responder"))
        if base_url and provider_for_spec(spec)[0].endpoint:
            opts["base_url"] = base_url
        if key_env and os.environ.get(key_env):
            opts["api_key"] = os.environ[key_env]
        return cached(make_client(spec, prices=cfg.prices or None, **opts), cfg.cache)

    root = build(cfg.model, cfg.base_url, cfg.api_key_env)
    if not cfg.sub_model or cfg.sub_model == cfg.model:
        return root, root
    same = cfg.sub_model.split(":", 1)[0] == cfg.model.split(":", 1)[0]   # a key stays with
    return root, build(cfg.sub_model, cfg.sub_base_url or cfg.base_url,   # its provider
                       cfg.sub_api_key_env or (cfg.api_key_env if same else None))


def _import_attr(path: str) -> Any:
    """`package.module:attr` -> the object; how a scripted model is named in a JSON run spec."""
    import importlib
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


def model_window(client: ModelClient, override: int | None = None) -> int | None:
    """The root model's window in tokens, when known (a local model's n_ctx, or an override)."""
    return override or context_window(client)


def _plain(cfg: MethodConfig, client: ModelClient, query: str,
           trace_path: str | None) -> PlainRun:
    """The run of a method that calls the model directly (direct, compaction)."""
    return PlainRun(client, query, budget=Budget.model_validate(cfg.limits),
                    trace_path=trace_path,
                    options={"max_tokens": DEFAULT_ANSWER_TOKENS, **cfg.model_options},
                    method=cfg.label)


# ---------------------------------------------------------------- direct
DIRECT_PROMPT = "{context}\n\n---\n\nAnswer the question about the text above.\n{query}"


async def run_direct(cfg: MethodConfig, inst: Instance, trace_path: str | None) -> Result:
    root, sub = _make_clients(cfg)
    run = _plain(cfg, root, inst.query, trace_path)
    try:
        text = context_text(inst.context)
        out_tokens = int(run.options.get("max_tokens") or DEFAULT_ANSWER_TOKENS)
        window = model_window(root, cfg.window_tokens)
        prompt = DIRECT_PROMPT.format(context=text, query=inst.query)
        need = len(prompt) // CHARS_PER_TOKEN + out_tokens
        if window and need > window:
            if not cfg.truncate:
                return run.finish("", "error", limit="context_window",
                                  error=f"input of ~{need:,} tokens (with the answer) exceeds "
                                        f"the model's window of {window:,} tokens")
            # keep the head and the tail (a needle or a question is as likely at either end);
            # 0.8: chars/4 underestimates tokens for digits and code, leave a margin
            keep = max(0, int((window - out_tokens) * 0.8) * CHARS_PER_TOKEN
                       - len(prompt) + len(text))
            cut = len(text) - keep
            text = (text[:keep // 2] + f"\n[... {cut:,} characters cut to fit the window ...]\n"
                    + text[len(text) - keep // 2:])
            prompt = DIRECT_PROMPT.format(context=text, query=inst.query)
        try:
            answer = await run.ask(prompt, step="answer", max_tokens=out_tokens)
        except BudgetExceeded as e:
            return run.finish("", "limit", limit=e.limit)
        except ModelError as e:
            limit = "context_window" if "too long" in str(e) or "context" in str(e).lower() \
                else None
            return run.finish("", "error", error=f"ModelError: {e}", limit=limit)
        return run.finish(answer, "final")
    finally:
        await _close(root, sub)


# ---------------------------------------------------------------- compaction
COMPACT_PROMPT = """You are reading a long text in {n} parts; you cannot see the other parts. \
Later you must answer this question using only your notes:
{query}

Your notes so far:
{notes}

Part {i} of {n}:
<<<
{chunk}
>>>

Write the updated notes: keep every fact from the old notes and from this part that may help \
answer the question (exact numbers, names, labels, counts so far); drop everything else. \
Reply with the notes only, at most {words} words."""

COMPACT_ANSWER = """You read a long text in parts and kept these notes:
{notes}

Using the notes, answer the question.
{query}"""


async def run_compaction(cfg: MethodConfig, inst: Instance, trace_path: str | None) -> Result:
    root, sub = _make_clients(cfg)
    run = _plain(cfg, root, inst.query, trace_path)
    notes = "(none yet)"
    try:
        chunks = split_chunks(context_text(inst.context), cfg.chunk_tokens * CHARS_PER_TOKEN)
        limit: str | None = None
        try:
            for i, chunk in enumerate(chunks, 1):
                notes = await run.ask(COMPACT_PROMPT.format(
                    n=len(chunks), query=inst.query, notes=notes, i=i, chunk=chunk, words=250),
                    step=f"summarise {i}/{len(chunks)}", max_tokens=400)
        except BudgetExceeded as e:
            limit = e.limit     # answer from the notes so far, as an RLM does at a limit
        except ModelError as e:
            return run.finish("", "error", error=f"ModelError: {e}")
        try:
            answer = await run.ask(COMPACT_ANSWER.format(notes=notes, query=inst.query),
                                   step="answer", force=limit is not None)
        except (ModelError, BudgetExceeded) as e:
            return run.finish("", "error", error=f"{type(e).__name__}: {e}", limit=limit)
        return run.finish(answer, "limit" if limit else "final", limit=limit,
                          source="extraction_turn" if limit else "final")
    finally:
        await _close(root, sub)


# ---------------------------------------------------------------- rlm
# At depth 0 the paper's "RLM without sub-calls": the REPL holds the input but no model calls.
NO_SUBCALL_SYSTEM = """You answer a query about a context that is too large to read at once. The \
context is NOT in this conversation: it is stored in the variable `context` inside a persistent \
Python REPL. You work by writing Python code; you see only what your code prints.

Write code in ```repl blocks. They run in order and you then see their output (cut to \
{max_output_chars} characters per turn, so print summaries, not whole documents). Variables \
persist between turns.

Available in the REPL:
- `context`: the data ({context_type}).
- `answer`: a dict {{"content": "", "ready": False}}. Put your answer in answer["content"] and set \
answer["ready"] = True when it is final; or call FINAL(text).
There are no language-model calls in this REPL: use Python (slicing, regex, string methods, \
counting) to find the answer.
{tips}"""


async def run_rlm(cfg: MethodConfig, inst: Instance, trace_path: str | None) -> Result:
    from recursa.core.rlm import RLM
    root, sub = _make_clients(cfg)
    limits: dict[str, Any] = {"max_depth": cfg.depth}
    system = None
    if cfg.depth == 0:
        limits["max_subcalls"] = 0   # enforce "no sub-calls", not just ask for it
        system = NO_SUBCALL_SYSTEM
    try:
        rlm = RLM(config=cfg.rlm_config(root, sub, trace_path).replace(
            **limits, system_prompt=system, strategy=cfg.strategy, example=cfg.worked_example,
            # a lookup in a document is answered with the passage it rests on, checked
            sources=inst.meta.get("question_type") == "lookup"))
        return await rlm.acompletion(inst.query, inst.context)
    finally:
        await _close(root, sub)


# ---------------------------------------------------------------- codeact + BM25
CODEACT_SYSTEM = """You answer a query about a large text that you cannot see. It is NOT in this \
conversation and NOT in the REPL: you can only search it. You work by writing Python code in a \
persistent REPL; you see only what your code prints.

Write code in ```repl blocks. They run in order and you then see their output (cut to \
{max_output_chars} characters per turn). Variables persist between turns.

Available in the REPL:
- `search(query: str, k: int = 5) -> list[dict]`: BM25 keyword search over passages of the \
text; each hit is {{"id": int, "score": float, "text": str}}, best first.
- `llm_query(prompt: str) -> str`: ask a language model one question (it can read about \
{sub_chars} characters). Put the passages it must read into the prompt.
- `llm_batch(prompts: list[str]) -> list[str]`: many llm_query calls in parallel.
- `answer`: a dict {{"content": "", "ready": False}}. Put your answer in answer["content"] and set \
answer["ready"] = True when it is final; or call FINAL(text).
How to work: search with the query's key words, print the hits, read them (yourself or with \
llm_query), then commit the answer. Every number or name in your answer must come from output \
you have seen: never guess.

Example of a whole run (another task). Query: "In which city was the Ada meeting held?"
Turn 1:
```repl
hits = search("Ada meeting city", k=5)
for h in hits:
    print(h["id"], round(h["score"], 2), h["text"][:200])
```
Output: five passages; two of them mention Ada.
Turn 2:
```repl
# the text first, then the query itself
found = llm_batch([h["text"] + "\\n\\nIn which city was the Ada meeting held? Answer from \
the text above, or reply 'none'." for h in hits])
print(found)
```
Output: ['Lyon', 'none', 'none', 'Lyon', 'none']
Turn 3:
```repl
FINAL("Lyon")
```
{tips}"""

# Defines `search` in the REPL on top of its host-call channel (the same one llm_query uses),
# so the hits come from the host-side index and the input never enters the sandbox.
_SEARCH_SETUP = '''
def search(query, k=5):
    """BM25 search over the passages of the input; returns [{"id", "score", "text"}]."""
    return llm_query.__self__._call("search", {"query": str(query), "k": int(k)})
'''

NOTE_CONTEXT = ("The input is not loaded in this REPL. Use search(query, k) to retrieve "
                "passages of it ({n} passages, about {tokens:,} tokens in all).")


class SearchSandbox:
    """Wraps a sandbox: answers the REPL's `search` calls from a host-side index and defines
    `search` in the REPL at start (and again after a restart)."""

    def __init__(self, inner: Sandbox, index: BM25Index):
        self.inner = inner
        self.index = index
        self.isolation = inner.isolation
        self.searches = 0

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None:
        async def handle(kind: str, args: dict[str, Any]) -> Any:
            if kind == "search":
                self.searches += 1
                return self.index.search(str(args.get("query", "")), int(args.get("k", 5)))
            return await handler(kind, args)
        await self.inner.start(payload, handle)
        await self._setup()

    async def _setup(self) -> None:
        cell = await self.inner.run(_SEARCH_SETUP, timeout=30, max_output_chars=1000)
        if cell.error:
            raise RuntimeError(f"could not define search() in the sandbox: {cell.error}")

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell:
        cell = await self.inner.run(code, timeout=timeout, max_output_chars=max_output_chars)
        if cell.restarted:
            await self._setup()
        return cell

    async def close(self) -> None:
        await self.inner.close()


async def run_codeact_bm25(cfg: MethodConfig, inst: Instance, trace_path: str | None) -> Result:
    from recursa.core.rlm import RLM
    from recursa.sandbox import make_sandbox
    text = context_text(inst.context)
    passages = split_chunks(text, cfg.passage_tokens * CHARS_PER_TOKEN)
    index = BM25Index(passages)
    root, sub = _make_clients(cfg)
    try:
        rlm = RLM(config=cfg.rlm_config(root, sub, trace_path).replace(
            max_depth=0,     # sub-calls are plain model calls
            sandbox=lambda: SearchSandbox(make_sandbox(cfg.sandbox), index),
            system_prompt=CODEACT_SYSTEM if cfg.worked_example
            else without_worked_example(CODEACT_SYSTEM)))
        note = NOTE_CONTEXT.format(n=len(passages), tokens=len(text) // CHARS_PER_TOKEN)
        return await rlm.acompletion(inst.query, note)
    finally:
        await _close(root, sub)


# ---------------------------------------------------------------- dispatch by name
async def run_method(cfg: MethodConfig, inst: Instance, trace_path: str | None,
                     seed: int | None = None) -> Result:
    from .baselines import BASELINES, run_baseline
    if cfg.method in BASELINES:     # no model: `seed` keeps the constant off this instance
        return await run_baseline(cfg.method, inst, seed)
    fn = {"rlm": run_rlm, "direct": run_direct, "compaction": run_compaction,
          "codeact-bm25": run_codeact_bm25}.get(cfg.method)
    if fn is None:
        raise ValueError(f"unknown method {cfg.method!r}; known: {', '.join(METHODS)}")
    return await fn(cfg, inst, trace_path)


async def _close(*clients: ModelClient) -> None:
    seen: set[int] = set()
    for c in clients:
        if id(c) in seen:
            continue
        seen.add(id(c))
        try:
            await c.aclose()
        except Exception:
            pass
