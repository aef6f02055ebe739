"""Typed data and the Protocols at recursa's seams (models, sandboxes, trace sinks).

Every other module codes against these names; keep them small and stable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, Field, computed_field, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant", "content": str}


# ---------------------------------------------------------------- errors
class RecursaError(Exception):
    """Base class of every error recursa raises on purpose."""


class ModelError(RecursaError):
    """A model call failed. `retryable` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


class BudgetExceeded(RecursaError):
    """A call would overshoot a limit of the run's Budget. `limit` names which one."""

    def __init__(self, limit: str, message: str | None = None):
        super().__init__(message or f"budget limit reached: {limit}")
        self.limit = limit


class SandboxError(RecursaError):
    """The sandbox could not be started or died in a way it could not recover from."""


class ContextError(RecursaError, ValueError):
    """The context given to a run cannot be used (empty, unreadable, wrong type)."""


# ---------------------------------------------------------------- models
class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
        )


class Timing(BaseModel):
    """How long a server says it spent on a reply (llama.cpp's `timings`): reading the prompt
    (`prompt_tokens` not taken from its cache, in `prompt_s`) and writing the reply. The
    machine's own speed, which `recursa.core.pace` uses to say how long a plan will take."""

    prompt_tokens: int = 0
    prompt_s: float = 0.0
    output_tokens: int = 0
    output_s: float = 0.0


class Completion(BaseModel):
    """One model response. `cost_usd` is None when the model has no known price."""

    text: str
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None
    model: str = ""
    latency_s: float = 0.0
    cached: bool = False                # replayed from the response cache: no model was called
    # the first reply token's likeliest alternatives (token -> log-probability), when the call
    # asked for them (`top_logprobs=k`) and the server gives them (llama.cpp, OpenAI)
    first_logprobs: dict[str, float] | None = None
    timing: Timing | None = None        # the server's own timings, where it gives them
    raw: Any = Field(default=None, exclude=True, repr=False)


class Pricing(NamedTuple):
    """How a client's calls are priced: declared by the client, priced by one owner
    (`recursa.models.pricing`: `estimate` before a call, `charge` after it, `status` for
    preflight). Nothing declared means "no known price": a cost limit then refuses to start.

    `model`: the name the price table knows the model by (with `overrides`, the prices given to
    this client, winning); `per_call`: a flat USD per call whatever its size (0.0: free);
    `estimate`: the client's own worst case `(input_tokens, output_tokens) -> USD | None`;
    `reported`: the provider reports what each call cost (`Completion.cost_usd`), so a run can
    keep a cost limit without a table price; `cache_writes`: prompt caching may bill input at
    the cache-write rate, which a worst case must assume."""

    model: str | None = None
    overrides: Mapping[str, Any] | None = None
    per_call: float | None = None
    estimate: Callable[[int, int], float | None] | None = None
    reported: bool = False
    cache_writes: bool = False


class Capabilities(NamedTuple):
    """What a model client can do, declared by the client (`ModelClient.capabilities`), so
    recursa reads a declaration instead of probing the client for methods and attributes.

    `context_window`: tokens it reads at once (None: unknown; recursa assumes a large window).
    `max_output_tokens`: its reply cap when a call sets none. `stop`: it takes `stop=[...]`,
    strings that end its reply where they appear (recursa then ends a root turn at made-up
    REPL output instead of paying for it). `streaming`: it has
    `astream(messages, on_delta, **options)` (see recursa.models.streaming). `tools`: it takes
    OpenAI-style `tools=[...]` and returns the calls in `Completion.raw` (else tools go by the
    text protocol of recursa.core.tools). `images`: it takes image parts in messages. `structured`:
    how a reply is constrained to a JSON schema ("json_schema": llama.cpp's option;
    "response_format": OpenAI's), None: not at all. `pricing`: see Pricing. `identity`: what
    names the model behind the client for the response cache (never a key); empty: its name.

    Pricing and Capabilities are NamedTuples, not dataclasses: a dataclass generates its
    methods when its module is imported, ~10x the cost (they are on every run's import path);
    change one with `caps._replace(streaming=False)`."""

    context_window: int | None = None
    max_output_tokens: int | None = None
    stop: bool = False
    streaming: bool = False
    tools: bool = False
    images: bool = False
    structured: Literal["json_schema", "response_format"] | None = None
    pricing: Pricing = Pricing()
    identity: Mapping[str, Any] = MappingProxyType({})


def model_identity(name: str, model: str = "", base_url: str | None = None,
                   defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The cache identity recursa's own clients declare (response-cache keys depend on it:
    keep its shape)."""
    return {"name": name, "model": model, "base_url": base_url, "defaults": dict(defaults or {})}


@runtime_checkable
class ModelClient(Protocol):
    """One model behind one protocol family. `name` is the spec string, e.g. 'openai:gpt-5-mini'.

    `complete` raises ModelError (after its own retries) and never returns empty text.
    Options understood by every client: max_tokens, temperature, stop, timeout.
    `capabilities` declares the rest (window, streaming, tools, images, prices, cache
    identity); a client that declares `streaming` is a StreamingModelClient too.
    """

    name: str

    @property
    def capabilities(self) -> Capabilities: ...

    async def complete(self, messages: list[Message], **options: Any) -> Completion: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class StreamingModelClient(ModelClient, Protocol):
    """A client declaring `capabilities.streaming`: `astream` returns what `complete` would and
    sends the reply's text to `on_delta(piece, offset)` as it arrives."""

    async def astream(self, messages: list[Message], on_delta: Callable[[str, int], None],
                      **options: Any) -> Completion: ...


def context_window(client: ModelClient) -> int | None:
    """A client's window in tokens when it declares one, else None."""
    return client.capabilities.context_window


def _empty_list() -> list[Any]:
    """`default_factory` for list fields. Not `list` itself: pydantic reads a factory's
    signature, and `inspect` parses the one of a builtin with tokenize, whose pattern takes
    ~1.5 ms to compile, in every process that imports this module."""
    return []


# ---------------------------------------------------------------- sandbox
class ContextPayload(BaseModel):
    """The context as the sandbox loads it: one file on the host, read once by the worker.

    kind 'text': the file is UTF-8 text and `context` is a str.
    kind 'json': the file is JSON and `context` is the decoded list / dict.
    """

    path: str
    kind: Literal["text", "json"]
    sha256: str
    size_bytes: int
    # functions the REPL gets beside its helpers, each answered by the host (a `host_function`
    # call; recursa/sandbox/protocol.py): a run's MCP tools (recursa.core.mcp_tools)
    functions: list[dict[str, Any]] = Field(default_factory=list)


class Cell(BaseModel):
    """What one `run(code)` produced."""

    stdout: str = ""
    stderr: str = ""
    value: str | None = None            # repr of a trailing expression, if any
    error: str | None = None            # traceback text (or a sandbox message) if the cell failed
    elapsed_s: float = 0.0
    stdout_chars: int = 0               # total characters printed, before any cap
    stderr_chars: int = 0
    answer: dict[str, Any] = Field(default_factory=lambda: {"content": "", "ready": False})
    final: str | None = None            # set by FINAL(...) / FINAL_VAR(...) / answer["ready"]=True
    variables: list[str] = Field(default_factory=_empty_list)  # user names alive after the cell
    timed_out: bool = False
    restarted: bool = False             # the worker was restarted during/after this cell
    lost_variables: list[str] = Field(default_factory=_empty_list)


# A call from sandboxed code back to the host. kind is one of:
#   "llm"       args {"prompt": str|list[Message], "model": str|None, "opts": dict} -> str
#   "llm_batch" args {"prompts": list[...], "model": str|None, "opts": dict}       -> list[str]
#   "rlm"       args {"prompt": str, "context": Any|None, "opts": dict}             -> str
#   "rlm_batch" args {"prompts": list[str], "contexts": list|None, "opts": dict}    -> list[str]
# The handler returns JSON-serialisable data. A failed sub-call is an error *string*
# in its slot ("Error: ..."), never an exception that fails a whole batch.
CallHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]


@runtime_checkable
class Sandbox(Protocol):
    """A persistent Python REPL holding `context`, isolated from the host as far as it says."""

    isolation: str  # human-readable: e.g. "bubblewrap (no network, private fs)" or "none (in-process)"

    async def start(self, payload: ContextPayload, handler: CallHandler) -> None: ...

    async def run(self, code: str, *, timeout: float, max_output_chars: int) -> Cell: ...

    async def close(self) -> None: ...


# ---------------------------------------------------------------- events
EventKind = Literal["run", "turn", "cell", "subcall", "child", "final", "error", "tool",
                    "combinator", "plan"]


class Event(BaseModel):
    """One thing worth seeing. `phase` is 'start' or 'end' for spans, 'point' for instants,
    'update' for data added to a span that is still open (e.g. a turn's usage, written as soon as
    the model answered, so a host killed while the turn's cells run still leaves its spend), and
    'delta' for a piece of a turn's reply as the model writes it (live sinks only, never a trace
    file: see recursa.obs.streaming)."""

    kind: EventKind
    id: str
    parent: str | None = None
    run_id: str = ""
    phase: Literal["start", "end", "point", "update", "delta"] = "point"
    t: float = 0.0                      # unix time
    depth: int = 0
    data: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class TraceSink(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- result
Status = Literal["final", "extracted", "limit", "error"]


class RoleUsage(BaseModel):
    calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = 0.0        # None once any call had an unknown price


# How `Result.answer` was obtained:
#   final            the model committed it (FINAL(...), answer["ready"] = True, a prose commit)
#   answer_variable  the draft in the REPL's answer["content"] when the run stopped (kept by the
#                    model's KEEP in the last-answer turn, or the last-answer turn gave nothing)
#   extraction_turn  the reply of the last-answer turn at a limit, cleaned to its answer text
#   none             nothing: `answer` is ""
AnswerSource = Literal["final", "answer_variable", "extraction_turn", "none"]


@pydantic_dataclass(frozen=True, slots=True)
class Location:
    """Where a span of a context's text lies: one type for `recursa.documents.locate` and the
    answer's sources (`recursa.core.sources.locate`), also `recursa.documents.Location`.

    `file`: the document's name or its path inside a folder/archive (None for a plain text
    context); `unit`: "page", "slide", "sheet", "section", "chapter" or "table" (None when the span
    is outside any part, or the text has no parts); `number` (1-based) and `name` of that unit;
    `line`: 1-based line in the unit (else in the whole text) where the span starts, `end_line`
    the line it ends on when that is another; `start`/`end`: character offsets in the unit's text
    (else the whole text); `doc_start`/`doc_end`: offsets in the whole text of the document;
    `item`: the keys and indexes that reach that text from `context` (empty for one text)."""

    file: str | None = None
    unit: str | None = None
    number: int | None = None
    name: str | None = None
    line: int = 1
    start: int = 0
    end: int = 0
    doc_start: int = 0
    doc_end: int = 0
    end_line: int | None = None
    item: tuple[str | int, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        """A short human address: `report.pdf, page 2, line 3`, `notes/a.txt, lines 3-4`,
        `context[2], line 1`."""
        parts = []
        if self.file is not None:
            parts.append(self.file)
        elif self.item:
            parts.append("context" + "".join(f"[{k!r}]" for k in self.item))
        if self.unit:
            parts.append(self._unit())
        parts.append(f"line {self.line}" if self.end_line in (None, self.line)
                     else f"lines {self.line}-{self.end_line}")
        return ", ".join(parts)

    def _unit(self) -> str:
        return f"{self.unit} {self.number}" + (f" ({self.name})" if self.name else "")

    def __str__(self) -> str:
        bits = [self.file] if self.file else []
        if self.unit:
            bits.append(self._unit())
        bits.append(f"line {self.line}")
        bits.append(f"chars {self.start}-{self.end}")
        return ", ".join(bits)


# How a source was found in the context: the quote as it stands (exact), the same words with
# other spacing, case or quote marks (normalized), or a close match (fuzzy, rapidfuzz)
SourceMatch = Literal["exact", "normalized", "fuzzy"]


class Source(BaseModel):
    """A passage an answer rests on, as the model quoted it and as recursa found it (or not)."""

    quote: str                          # what the model gave (cut to QUOTE_KEEP characters)
    found: bool = False
    match: SourceMatch | None = None
    score: float = 0.0                  # 100 for exact / normalized; rapidfuzz's for fuzzy
    text: str | None = None             # the passage as the context has it
    location: Location | None = None
    before: str = ""                    # a little of the text around the passage, for display
    after: str = ""
    note: str | None = None             # why it was not found, or how it was narrowed


class Result(BaseModel):
    answer: str
    status: Status
    ready: bool = False                 # the model itself confirmed the answer
    answer_source: AnswerSource | None = None   # None: filled in from status and answer
    # typed answers (`output=`): the validated object (a model instance, or the decoded JSON
    # for a JSON schema), or None with `output_error` saying why the answer did not validate
    parsed: Any = None
    output_error: str | None = None
    usage: dict[str, RoleUsage] = Field(default_factory=dict)          # by role: root/sub/child
    usage_by_model: dict[str, RoleUsage] = Field(default_factory=dict)
    cost_usd: float | None = 0.0
    turns: int = 0
    subcalls: int = 0
    cache_hits: int = 0                 # model calls answered by the response cache
    elapsed_s: float = 0.0
    trace_path: str | None = None
    error: str | None = None
    limit: str | None = None            # which limit ended the run, if one did
    # the answer rests on part of the work only: "26 of 48 records judged" (a map cut by
    # `limit`); None when the work the answer rests on was done in full
    partial: str | None = None
    run_id: str = ""
    # the passages the answer rests on, checked against the context (recursa.core.sources);
    # sources_verified: None when the answer gave none, True when every one was found, False
    # when one or more was not (a flag, never passed silently)
    sources: list[Source] = Field(default_factory=_empty_list)
    sources_verified: bool | None = None
    # which path ran (RLM's `route`, recursa.core.route): "direct" (one plain model call) or
    # "rlm" (the REPL loop); None for a run RLM did not route (the bench's plain methods)
    route: Literal["direct", "rlm"] | None = None

    @model_validator(mode="after")
    def _source(self) -> Result:
        if self.answer_source is None:
            self.answer_source = ("final" if self.status == "final" and self.answer else
                                  "extraction_turn" if self.answer else "none")
        return self

    def __str__(self) -> str:
        return self.answer

    def _repr_html_(self) -> str | None:   # Jupyter: answer, status, spend and the viewer inline
        return None if html_view is None else html_view(self)


# Jupyter's HTML view of a Result is drawn in recursa.obs.notebook, a layer above this module:
# that module puts its renderer here when it loads (recursa.core.rlm loads it), so this module
# imports nothing above it. None: IPython shows the plain repr.
html_view: Callable[[Result], str] | None = None
