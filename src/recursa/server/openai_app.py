"""An OpenAI-compatible HTTP API in front of an RLM: `/v1/models`, `/v1/chat/completions`.

    rlm = RLMConfig.build(model="openai:gpt-5", sub_model="openai:gpt-5-mini", max_cost_usd=1.0)
    app = create_app(ServerConfig(rlm=rlm, api_key="s3cret"))
    serve(app, host="127.0.0.1", port=8000)          # or any ASGI server

The request's final user message is the query (less any document pasted into it); the pasted
document, a long system prompt, earlier turns, an optional `context` field and attached text
files become the RLM's context; a short system prompt is added to the query as instructions
(docs/server.md has the rules, the progress streaming format and the error shapes).

Built on Starlette + uvicorn rather than FastAPI: the API is two routes whose request bodies we
must parse ourselves anyway (the size limit applies *before* JSON parsing, and errors must use
OpenAI's error shape, not FastAPI's 422 validation shape), and the run needs raw ASGI control
(watching for the client's disconnect while the run goes on), so FastAPI's layer would only add
a dependency.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from recursa.base.images import Image, ImageError, from_content_part, sniff
from recursa.base.types import ContextError, Event, ModelClient, RecursaError, Result
from recursa.core.budget import Budget
from recursa.core.config import RLMConfig
from recursa.core.preflight import PreflightError
from recursa.core.rlm import RLM
from recursa.core.route import ROUTES
from recursa.core.strategy import STRATEGIES
from recursa.documents.confine import ParseCaps
from recursa.server.common import Progress, RequestError, clamp_limits, load_model, spend, summary
from recursa.server.guard import RequestGuard, RequestPolicy
from recursa.server.paste import SHORT, split_document, tagged_context
from recursa.server.sessions import SessionPool, Turn, ask, chat_turn
from recursa.server.slowclients import BODY_TIMEOUT, HEADER_TIMEOUT, guarded_h11

log = logging.getLogger("recursa.server")

MAX_JSON_DEPTH = 64           # nesting a request may have; a chat request needs about 8
QUERY_PREVIEW = 1500          # as RLM does for rlm_query without a context
ROUTE_HEADER = "x-recursa-route"   # which path ran: direct | rlm (recursa.core.route)
ANSWER_CHUNK = 1000           # characters per content delta when streaming the answer


def default_upload_caps() -> ParseCaps:
    """What parsing one attached file may use: less than a document given on the command line
    (recursa.documents.limits), since anyone who can reach the server sends these."""
    return ParseCaps(memory_mb=1024, cpu_seconds=60, seconds=120, output_mb=512)


# ---------------------------------------------------------------- configuration
@dataclass
class RunSpec:
    """What the RLM factory is told about one request."""

    sub_model: str | None                       # per-request override, already allowed
    on_event: Callable[[Event], Any] | None      # progress hook (streaming requests only)


@dataclass
class ServerConfig:
    """The server: every run's configuration plus the server's own settings.

    `rlm` (recursa.core.config.RLMConfig) configures every request's RLM: the models, the
    sandbox, the budget (the server's caps: a request may only lower them), tracing and the
    strategy, whose `route` decides which requests run the REPL loop (a request may pick
    another with `recursa.route`). Each request's RLM is `rlm` with the shared model clients,
    the request's sub-model and its progress hook put in (`default_rlm_factory`);
    `rlm_factory(config, spec) -> RLM` replaces that (tests inject a scripted model, a counting
    sandbox). The rest belongs to the server alone: `api_key` is what *clients* must present to
    this server (the upstream provider's key is `rlm.models.api_key`, else its usual variable),
    then the address, the pools and the request caps.
    """

    rlm: RLMConfig = field(default_factory=RLMConfig)
    api_key: str | None = None
    max_runs: int = 4                            # runs at once; more get 429
    max_request_bytes: int = 16 * 1024 * 1024
    served_model: str = "recursa"
    allowed_sub_models: list[str] = field(default_factory=list)
    keepalive_s: float = 15.0
    progress: Literal["reasoning", "field", "none"] = "reasoning"
    rlm_factory: Callable[[ServerConfig, RunSpec], RLM] | None = None
    # sessions: a conversation whose earlier turns come back continues in the same sandbox
    # (server/sessions.py); at most `sessions` idle ones (0: off), each closed after
    # `session_ttl_s` unused. A request routed direct skips them.
    sessions: int = 16
    session_ttl_s: float = 600.0
    # who may send requests (server/guard.py): the address the server is bound to decides
    # which Host headers are its own; more names with `allow_hosts`, browser origins with
    # `allow_origins` ("*": any, for either)
    host: str = "127.0.0.1"
    allow_hosts: list[str] = field(default_factory=list)
    allow_origins: list[str] = field(default_factory=list)
    # Attached files are parsed by the confined document parser (recursa.documents.confine),
    # off the event loop, with `upload_caps`; at most `upload_parsers` at once (others wait)
    upload_caps: ParseCaps = field(default_factory=default_upload_caps)
    upload_parsers: int = 2
    parsing: threading.BoundedSemaphore = field(init=False, repr=False)
    # Model clients by spec, built once and shared by every request's RLM, so requests reuse
    # the keep-alive (and TLS) connections to the upstream instead of opening their own.
    shared_clients: dict[str, ModelClient] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.rlm, RLMConfig):
            raise TypeError(f"ServerConfig.rlm must be an RLMConfig (RLMConfig.build(model=..., "
                            f"...)), not {type(self.rlm).__name__}")
        if self.upload_parsers < 1:
            raise ValueError("upload_parsers must be 1 or more")
        self.parsing = threading.BoundedSemaphore(self.upload_parsers)

    def caps(self) -> Budget:
        return self.rlm.budget

    def client(self, spec: str | ModelClient | None, *, root: bool = False
               ) -> str | ModelClient | None:
        """The shared client for a model spec (built on first use), with the endpoint, key,
        options and prices RLM itself would give it: the sub-model gets the root's endpoint
        and key only when it is of the root's provider."""
        if not isinstance(spec, str):
            return spec
        if spec not in self.shared_clients:
            from recursa.models import make_run_client
            m = self.rlm.models
            provider = spec.split(":", 1)[0]
            same = root or (isinstance(m.model, str) and m.model.split(":", 1)[0] == provider)
            base_url = m.base_url if root else (m.sub_base_url or (m.base_url if same else None))
            key = m.api_key if same else None
            if not root and m.sub_api_key:
                key = m.sub_api_key
            options = {**m.client_options, **({"prices": m.prices} if m.prices else {})}
            self.shared_clients[spec] = make_run_client(
                spec, options, base_url=base_url,
                api_key=None if key is None else key.get_secret_value())
        return self.shared_clients[spec]

    async def aclose_clients(self) -> None:
        clients, self.shared_clients = list(self.shared_clients.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                await c.aclose()


def run_config(config: ServerConfig, spec: RunSpec) -> RLMConfig:
    """The configuration of one request's RLM: the server's, with its shared model clients,
    the request's sub-model (if it picked one) and its progress hook."""
    models = config.rlm.models
    sub = spec.sub_model or models.sub_model
    hook = {} if spec.on_event is None else {"on_event": spec.on_event}
    return config.rlm.replace(model=config.client(models.model, root=True),
                              sub_model=None if sub is None else config.client(sub), **hook)


def default_rlm_factory(config: ServerConfig, spec: RunSpec) -> RLM:
    return RLM(config=run_config(config, spec))


# ---------------------------------------------------------------- errors
def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """OpenAI's error shape, so official clients raise their usual typed errors."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


class _TooLarge(Exception):
    pass


_TOO_DEEP = object()


def _depth_over(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests deeper than `limit` (iterative: no recursion to run out of,
    here or later, where the run copies and hashes the request's parts)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes `limit` bytes (before any parsing)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    buf = bytearray()
    async for chunk in request.stream():   # also catches chunked bodies without a length
        buf += chunk
        if len(buf) > limit:
            raise _TooLarge
    return bytes(buf)


# ---------------------------------------------------------------- request -> run
@dataclass
class ChatRun:
    query: str
    context: Any
    stream: bool
    include_usage: bool
    limits: dict[str, Any]
    clamped: list[str]
    sub_model: str | None
    model_name: str
    output: Any = None                       # an OutputSpec from `response_format`, or None
    turn: Turn | None = None                 # what sessions make of it (server/sessions.py)
    session: dict[str, Any] | None = None    # the session it ran in: id, question, reused
    strategy: str | None = None              # `recursa.strategy`: code | plan | auto
    sources: bool = False                    # `recursa.sources`: ask for the answer's sources
    route: str | None = None                 # `recursa.route`: rlm | direct | auto


def _image_of_part(part: dict[str, Any]) -> tuple[str, Image]:
    """An `image_url` part with a data URL; an http(s) URL is refused (no network here)."""
    try:
        return from_content_part(part)
    except ImageError as e:
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        remote = isinstance(url, str) and not url.startswith("data:")
        raise RequestError(str(e), param="messages",
                           code="image_url_not_supported" if remote else "invalid_image") from e


def _text_of_file(part: dict[str, Any], config: ServerConfig) -> tuple[str, Any]:
    """(filename, text) of an attached file given inline as base64 `file_data` (an image file:
    (filename, Image)). A document is parsed by the confined parser with the server's upload
    caps (parse_chat runs off the event loop)."""
    f = part.get("file")
    if not isinstance(f, dict):
        f = {}
    data = f.get("file_data")
    name = str(f.get("filename") or "file")
    if not isinstance(data, str):
        raise RequestError("attached files must carry their contents inline as `file_data` "
                           "(uploaded `file_id`s are not supported)", param="messages")
    if data.startswith("data:"):
        _, _, data = data.partition(",")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestError(f"file {name!r}: file_data is not valid base64", param="messages") from e
    if sniff(raw[:16]):
        try:
            return name, Image.from_bytes(raw, name=name)
        except ImageError as e:
            raise RequestError(str(e), param="messages", code="invalid_image") from e
    from recursa.documents import DocumentError, confine
    try:   # PDF, Office, EPUB, HTML, CSV, ... -> a Document; an archive -> {member: value}
        with config.parsing:
            return name, confine.load_bytes(raw, name, caps=config.upload_caps)[0]
    except (DocumentError, ImageError) as e:
        raise RequestError(f"file {name!r}: {e}".replace(f": {name}: ", ": "),
                           param="messages", code="invalid_file") from e


def _split_content(content: Any, config: ServerConfig
                   ) -> tuple[list[str], list[tuple[str, Any]]]:
    """A message's text parts and its attached files."""
    if content is None:
        return [], []
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        raise RequestError("message content must be a string or a list of parts",
                           param="messages")
    texts: list[str] = []
    files: list[tuple[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text") or ""))
        elif kind == "file":
            files.append(_text_of_file(part, config))
        elif kind == "image_url":
            files.append(_image_of_part(part))
        else:
            raise RequestError(f"unsupported content part type {kind!r} (text, image_url and "
                               "file only)", param="messages")
    return texts, files


def parse_chat(body: Any, config: ServerConfig) -> ChatRun:
    """Validate a chat-completions request and turn it into a query, a context and limits."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or \
            not all(isinstance(m, dict) for m in messages):
        raise RequestError("`messages` must be a non-empty list of message objects",
                           param="messages")
    if body.get("n") not in (None, 1):
        raise RequestError("only n=1 is supported", param="n")
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        raise RequestError("no user message: the final user message is the query",
                           param="messages")
    texts, files = _split_content(messages[last].get("content"), config)
    # A document pasted into the question's message is context, not query (paste.py has the
    # shapes chat clients use).
    query, document = split_document(texts)
    if not query:
        raise RequestError("the final user message has no text to use as the query",
                           param="messages")
    documents = [document] if document else []
    new_context = bool(document or files)     # the question brings context: a new session

    # A short system prompt is an instruction for the answer and goes with the query; a long one
    # is a document (`llm -s "$(cat report.txt)" "question"`). Other turns are a transcript.
    instructions: list[str] = []
    lines: list[str] = []
    for i, m in enumerate(messages):
        if i == last:
            continue
        parts_i, more = _split_content(m.get("content"), config)
        files.extend(more)
        text = "\n".join(parts_i)
        if not text.strip():
            continue
        role = m.get("role", "user")
        if role in ("system", "developer"):
            _, tagged = tagged_context(text)
            if tagged is None and len(text) <= SHORT:
                instructions.append(text.strip())
            else:
                documents.append(tagged or text)
            continue
        lines.append(f"[{role}]\n{text}")
    parts: dict[str, Any] = {}
    if "context" in body and body["context"] is not None:
        given = body["context"]
        if not isinstance(given, str | list | dict):
            raise RequestError("`context` must be a string, a list or an object", param="context")
        if len(given) == 0:
            raise RequestError("`context` is empty: there is nothing to answer the query over",
                               param="context")
        parts["context"] = given
    if documents:
        parts["document"] = "\n\n".join(documents)
    if lines:
        parts["conversation"] = "\n\n".join(lines)
    if files:
        names: dict[str, Any] = {}
        for name, text in files:
            key, n = name, 1
            while key in names:   # two attachments with one name keep both
                n += 1
                key = f"{name} ({n})" if isinstance(text, str) else name.replace(".", f"-{n}.")
            names[key] = text
        # images (image_url parts, image files) are `images`, the rest `files`
        split = {k: {n: v for n, v in names.items() if isinstance(v, Image) is (k == "images")}
                 for k in ("files", "images")}
        parts.update({k: v for k, v in split.items() if v})
    if not parts:
        # Nothing but the question: like rlm_query without a context, the message itself is the
        # context, so a chat client pasting a huge document still gets an RLM over it. The
        # query shows both ends, where a question usually is.
        context: Any = query
        if len(query) > QUERY_PREVIEW:
            half = QUERY_PREVIEW // 2
            query = f"{query[:half]}\n...\n{query[-half:]}\n(The full request is the REPL " \
                "variable `context`.)"
    elif len(parts) == 1:
        context = next(iter(parts.values()))
    else:
        context = parts
    if instructions:
        query += "\n\nInstructions from the chat's system prompt:\n" + "\n".join(instructions)

    rec = body.get("recursa") or {}
    if not isinstance(rec, dict):
        raise RequestError("`recursa` must be an object", param="recursa")
    rec = dict(rec)
    sub_model = rec.pop("sub_model", None)
    if isinstance(sub_model, str) and ":" not in sub_model:   # an alias of the server's user
        from recursa.models import resolve_model
        sub_model = resolve_model(sub_model)[0]
    if sub_model is not None:
        allowed = set(config.allowed_sub_models)
        for spec in (config.rlm.models.sub_model, config.rlm.models.model):
            if isinstance(spec, str):
                allowed.add(spec)
        if not isinstance(sub_model, str) or sub_model not in allowed:
            raise RequestError(f"sub_model {sub_model!r} is not allowed on this server; allowed: "
                               f"{', '.join(sorted(allowed)) or '(none)'}",
                               param="recursa.sub_model", code="sub_model_not_allowed")
    strategy = rec.pop("strategy", None)
    if strategy is not None and strategy not in STRATEGIES:
        raise RequestError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}",
                           param="recursa.strategy")
    route = rec.pop("route", None)
    if route is not None and route not in ROUTES:
        raise RequestError(f"route must be one of {', '.join(ROUTES)}, not {route!r}",
                           param="recursa.route")
    want_sources = rec.pop("sources", False)
    if not isinstance(want_sources, bool):
        raise RequestError("sources must be true or false", param="recursa.sources")
    limits, clamped = clamp_limits(config.caps(), rec)
    output = _output_spec(body.get("response_format"))
    opts = body.get("stream_options") or {}
    # a session goes on only with what shaped it: the sub-model, the caller's `user`, `context`
    turn = chat_turn(messages, last, new_context=new_context,
                     scope=[sub_model, body.get("user"), body.get("context")])
    return ChatRun(query=query, context=context, stream=bool(body.get("stream")),
                   include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
                   limits=limits, clamped=clamped, sub_model=sub_model,
                   model_name=str(body.get("model") or config.served_model), output=output,
                   turn=turn, strategy=strategy, sources=want_sources, route=route)


def _output_spec(fmt: Any) -> Any:
    """`response_format`: json_schema -> the answer must match it; json_object -> any object."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    from recursa.core.output import OutputSpec
    if kind == "json_object":
        return OutputSpec.of({"type": "object"})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be a JSON schema object",
                               param="response_format")
        try:
            return OutputSpec.of(schema)
        except ValueError as e:
            raise RequestError(f"response_format: {e}", param="response_format") from None
    raise RequestError("response_format.type must be text, json_object or json_schema",
                       param="response_format")


def answer_content(result: Result, run: ChatRun) -> str:
    """The reply's text: the validated JSON for a typed request, else the answer (a typed
    request whose answer never validated keeps the answer; `recursa.output_error` says why)."""
    if run.output is not None and result.parsed is not None:
        return json.dumps(result.parsed, ensure_ascii=False)
    return result.answer


# ---------------------------------------------------------------- responses
def openai_usage(result: Result) -> dict[str, Any]:
    s = spend(result)
    return {"prompt_tokens": s["input_tokens"], "completion_tokens": s["output_tokens"],
            "total_tokens": s["total_tokens"],
            "prompt_tokens_details": {"cached_tokens": s["cached_tokens"]},
            "cost": s["cost_usd"]}   # the field OpenRouter uses; None when a price is unknown


def finish_reason(result: Result) -> str:
    return "length" if result.status == "limit" else "stop"


def _recursa_field(result: Result, run: ChatRun) -> dict[str, Any]:
    out = {**summary(result), "route": result.route, "limits": run.limits,
           "clamped": run.clamped}
    if run.output is not None:
        out["output_error"] = result.output_error
    if run.session is not None:
        out["session"] = run.session
    if result.sources or run.sources:   # the passages the answer rests on, checked
        out["sources"] = [s.model_dump(mode="json", exclude_none=True) for s in result.sources]
        out["sources_verified"] = result.sources_verified
    return out


_DONE, _GONE = object(), object()


class RunResponse:
    """Runs one RLM as an ASGI response: a JSON body, or SSE chunks when streaming.

    It owns the run from start to end: the client's disconnect cancels the run task (whose own
    cleanup closes the sandbox and the model clients), and the concurrency slot is released
    whatever happens, including a client gone before the first byte.
    """

    def __init__(self, config: ServerConfig, run: ChatRun, release: Callable[[], None],
                 pool: SessionPool | None = None):
        self.config = config
        self.run = run
        self.release = release
        self.pool = pool if run.turn is not None else None
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.route = "rlm"      # the path the run takes (X-Recursa-Route), known before it runs

    def _chunk(self, delta: dict[str, Any] | None, finish: str | None = None,
               **extra: Any) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta,
                                             "finish_reason": finish, "logprobs": None}]
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.run.model_name, "choices": choices, **extra}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        task: asyncio.Task[Result] | None = None
        watcher: asyncio.Task[None] | None = None

        def on_event(ev: Event) -> None:   # may be called from a worker thread
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    queue.put_nowait(_GONE)
                    return

        try:
            factory = self.config.rlm_factory or default_rlm_factory
            progress = on_event if self.run.stream and self.config.progress != "none" else None
            try:   # in a session, the progress hook is this request's, not the RLM's
                rlm = factory(self.config, RunSpec(
                    sub_model=self.run.sub_model,
                    on_event=None if self.pool is not None else progress))
                if self.run.strategy is not None:
                    rlm.strategy = self.run.strategy
                if self.run.sources:
                    rlm.sources = True
                if self.run.route is not None:
                    rlm.route = self.run.route
                if rlm.route != "rlm":   # decided here too: a direct request needs no session
                    routed = await asyncio.to_thread(rlm.route_for, self.run.query,
                                                     self.run.context, output=self.run.output)
                    self.route = routed.path
                    if routed.path == "direct" and self.pool is not None:
                        self.pool, rlm.on_event = None, progress
            except PreflightError as e:    # e.g. a cost cap on a model with no price
                await error_response(400, str(e), code="preflight_failed")(scope, receive, send)
                return
            except ContextError as e:
                await error_response(400, str(e), param="context")(scope, receive, send)
                return
            except (RecursaError, ValueError, TypeError, OSError) as e:
                log.exception("could not build the RLM for %s", self.id)
                await error_response(500, f"cannot start the run: {e}", type_="server_error")(
                    scope, receive, send)
                return
            task = asyncio.create_task(
                self._in_session(rlm, progress) if self.pool is not None else
                rlm.acompletion(self.run.query, self.run.context, output=self.run.output,
                                **self.run.limits))
            task.add_done_callback(lambda _t: queue.put_nowait(_DONE))
            watcher = asyncio.create_task(watch())
            if self.run.stream:
                await self._stream(queue, task, send)
            else:
                await self._plain(queue, task, scope, send)
        finally:
            if watcher is not None:
                watcher.cancel()
            if task is not None and not task.done():
                task.cancel()     # the run's own finally blocks close its sandbox and clients
                log.info("run %s cancelled: the client went away", self.id)
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task
            self.release()

    async def _in_session(self, rlm: RLM, progress: Callable[[Event], Any] | None) -> Result:
        """The question in the session its conversation continues, or in a new one."""
        pool, turn = self.pool, self.run.turn
        assert pool is not None and turn is not None
        loop = asyncio.get_running_loop()   # where the shared model clients live
        res, self.run.session = await ask(
            pool, turn, lambda: rlm.session(self.run.context, idle_timeout=pool.ttl_s, loop=loop),
            self.run.query, output=self.run.output, on_event=progress, limits=self.run.limits)
        return res

    async def _outcome(self, task: asyncio.Task[Result]) -> Result | Response:
        try:
            return task.result()
        except ContextError as e:
            return error_response(400, str(e), param="context")
        except PreflightError as e:    # a request the server cannot run as asked: nothing spent
            return error_response(400, str(e), code="preflight_failed")
        except (RecursaError, ValueError, TypeError) as e:
            return error_response(500, f"{type(e).__name__}: {e}", type_="server_error")
        except Exception as e:  # noqa: BLE001 - a failed run is reported, never a crash
            log.exception("run %s failed", self.id)
            return error_response(500, f"{type(e).__name__}: {e}", type_="server_error")
        except asyncio.CancelledError:   # cancelled from within (not by this client leaving)
            log.error("run %s was cancelled by the server", self.id)
            return error_response(500, "the run was cancelled by the server",
                                  type_="server_error")

    def _failed(self, res: Result) -> Response | None:
        if res.status == "error" and not res.answer:
            return error_response(502, f"the RLM run failed: {res.error}", type_="server_error",
                                  code="rlm_error")
        return None

    async def _plain(self, queue: asyncio.Queue[Any], task: asyncio.Task[Result],
                     scope: Scope, send: Send) -> None:
        while True:
            item = await queue.get()
            if item is _GONE:
                return
            if item is _DONE:
                break
        out = await self._outcome(task)
        if isinstance(out, Result):
            out = self._failed(out) or JSONResponse({
                "id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.run.model_name,
                "choices": [{"index": 0, "finish_reason": finish_reason(out), "logprobs": None,
                             "message": {"role": "assistant",
                                         "content": answer_content(out, self.run),
                                         "refusal": None}}],
                "usage": openai_usage(out), "recursa": _recursa_field(out, self.run)},
                headers={ROUTE_HEADER: out.route or self.route})
        # The watcher task owns `receive`; a JSON response never reads it.
        await out(scope, _never_receive, send)

    async def _stream(self, queue: asyncio.Queue[Any], task: asyncio.Task[Result],
                      send: Send) -> None:
        async def emit(obj: dict[str, Any] | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(),
                        "more_body": True})

        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
            (ROUTE_HEADER.encode(), self.route.encode())]})
        await emit(self._chunk({"role": "assistant", "content": ""}))
        progress = Progress()
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), self.config.keepalive_s)
            except TimeoutError:
                # An SSE comment keeps idle proxies from closing a long run's connection.
                await send({"type": "http.response.body", "body": b": keep-alive\n\n",
                            "more_body": True})
                continue
            if item is _GONE:
                return
            if item is _DONE:
                break
            p = progress.feed(item, deltas=True)   # deltas: the root's reply as it is written
            if p is None:
                continue
            if self.config.progress == "reasoning":
                await emit(self._chunk({"reasoning_content": progress.reasoning(p)},
                                       recursa_progress=p))
            else:
                await emit(self._chunk({}, recursa_progress=p))
        out = await self._outcome(task)
        if isinstance(out, Result):
            failed = self._failed(out)
        else:
            failed = out
        if failed is not None:
            # Mid-stream errors travel as an `error` event, which the official clients raise.
            await emit(json.loads(bytes(failed.body)))
        else:
            assert isinstance(out, Result)
            content = answer_content(out, self.run)
            for i in range(0, len(content), ANSWER_CHUNK):
                await emit(self._chunk({"content": content[i:i + ANSWER_CHUNK]}))
            await emit(self._chunk({}, finish_reason(out),
                                   recursa=_recursa_field(out, self.run)))
            if self.run.include_usage:
                await emit(self._chunk(None, usage=openai_usage(out)))
        await emit("[DONE]")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _never_receive() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


# ---------------------------------------------------------------- the app
class _Slots:
    """A non-blocking counter of runs in flight: full means 429 now, not a queue."""

    def __init__(self, size: int):
        self.size = size
        self.used = 0

    def try_acquire(self) -> Callable[[], None] | None:
        if self.used >= self.size:
            return None
        self.used += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.used -= 1
        return release


def create_app(config: ServerConfig) -> Starlette:
    """The ASGI app. `config.rlm`'s model may name a scripted model (`replay-file:...`,
    test-only)."""
    given = config.rlm.models
    loaded = {k: load_model(getattr(given, k)) for k in ("model", "sub_model")}
    if any(v is not getattr(given, k) for k, v in loaded.items()):
        config.rlm = config.rlm.replace(**loaded)
    caps = config.caps()
    slots = _Slots(config.max_runs)
    if config.sessions < 0:
        raise ValueError("sessions must be 0 (off) or more")
    pool = SessionPool(config.sessions, config.session_ttl_s) if config.sessions else None

    def authorized(request: Request) -> bool:
        if not config.api_key:
            return True
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                  config.api_key.encode())

    def unauthorized() -> Response:
        return error_response(401, "Incorrect API key provided: present this server's key as "
                              "`Authorization: Bearer <key>`", code="invalid_api_key",
                              headers={"www-authenticate": "Bearer"})

    def guarded(fn: Callable[[Request], Awaitable[Response | RunResponse]]
                ) -> Callable[[Request], Awaitable[Any]]:
        async def endpoint(request: Request) -> Any:
            if not authorized(request):
                return unauthorized()
            return await fn(request)
        return endpoint

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": config.served_model, "object": "model", "created": 0, "owned_by": "recursa"}]})

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name != config.served_model:
            return error_response(404, f"The model {name!r} does not exist",
                                  code="model_not_found", param="model")
        return JSONResponse({"id": name, "object": "model", "created": 0, "owned_by": "recursa"})

    async def prepare(request: Request) -> ChatRun | Response:
        try:
            raw = await _read_body(request, config.max_request_bytes)
        except _TooLarge:
            return error_response(413, f"request body exceeds this server's limit of "
                                  f"{config.max_request_bytes:,} bytes", code="request_too_large")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error_response(400, f"the request body is not valid JSON: {e}")
        except RecursionError:   # the parser's own stack ran out: '[' * 100000
            body = _TOO_DEEP
        if body is _TOO_DEEP or _depth_over(body, MAX_JSON_DEPTH):
            return error_response(400, f"the request body is nested more than "
                                  f"{MAX_JSON_DEPTH} levels deep", code="json_too_deep")
        try:   # off the event loop: attached files are parsed here (by a confined process)
            return await asyncio.to_thread(parse_chat, body, config)
        except RequestError as e:
            return error_response(400, str(e), param=e.param, code=e.code)

    async def chat(request: Request) -> Response | RunResponse:
        release = slots.try_acquire()
        if release is None:
            return error_response(
                429, f"this recursa server is running its maximum of {config.max_runs} "
                "concurrent requests; retry shortly", type_="rate_limit_error",
                code="concurrency_limit", headers={"retry-after": "1"})
        try:
            run = await prepare(request)
        except BaseException:
            release()
            raise
        if isinstance(run, Response):
            release()
            return run
        # it releases the slot when the run ends
        return RunResponse(config, run, release, pool)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "running": slots.used, "max_runs": slots.size,
                             "sessions": len(pool) if pool is not None else 0})

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette's own 404 / 405 are plain text; OpenAI clients expect their error shape.
        assert isinstance(exc, HTTPException)
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return error_response(404, f"unknown route {where}; this server serves GET "
                                  "/v1/models, GET /v1/models/{model}, POST /v1/chat/completions "
                                  "and GET /health", code="unknown_url")
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            return error_response(405, f"method not allowed: {where} (allowed: {allow})",
                                  code="method_not_allowed", headers=exc.headers)
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        if pool is not None:
            await pool.aclose_all()
        await config.aclose_clients()

    # Outermost: refuse other hosts, foreign origins and non-JSON bodies before any route
    # (guard.py); then CORS headers for the origins the user allowed.
    policy = RequestPolicy.for_bind(config.host, config.allow_hosts, config.allow_origins)
    middleware = [Middleware(RequestGuard, policy=policy)]
    if config.allow_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=sorted(policy.origins), allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"], max_age=600))
    app = Starlette(lifespan=lifespan, exception_handlers={HTTPException: http_error},
                    middleware=middleware, routes=[
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models/{name:path}", guarded(model), methods=["GET"]),
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ])
    app.state.config = config
    app.state.caps = caps
    app.state.slots = slots
    app.state.sessions = pool
    return app


def serve(app: Starlette, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info", loop: str = "auto", *,
          header_timeout: float = HEADER_TIMEOUT, body_timeout: float = BODY_TIMEOUT) -> None:
    """Run the app under uvicorn until interrupted; `loop` is uvicorn's choice of event loop
    ("auto": uvloop when installed, else asyncio). A client whose request headers take over
    `header_timeout` s, or its body over `body_timeout` s, is dropped (server/slowclients.py)."""
    import uvicorn
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                loop=loop, http=guarded_h11(header_timeout, body_timeout))
