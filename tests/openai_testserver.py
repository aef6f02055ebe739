"""A real HTTP server speaking the OpenAI chat-completions protocol (and Anthropic's Messages API),
for tests and benchmarks. Stdlib only; runs in a background thread on 127.0.0.1, ephemeral port.

    from openai_testserver import OpenAITestServer, Fault

    with OpenAITestServer(responder=lambda req: "hello", latency=0.05) as srv:
        client = OpenAIClient("test-model", base_url=srv.base_url)      # .../v1
        srv.inject(Fault.status(429, retry_after="0.2"), Fault.status(500))
        ...
        assert srv.request_count == 3

Endpoints: POST /v1/chat/completions (also `stream: true` -> SSE chunks, with a usage chunk when
`stream_options.include_usage`), POST /v1/messages (Anthropic; base URL `srv.anthropic_base_url`;
also `stream: true` -> its SSE events), GET /v1/models and Ollama's GET /api/tags (the `listed`
names, else `model`). Streams send `stream_chunk_chars`
characters per chunk, `stream_chunk_delay` seconds apart (`pace_plain=True`: a reply that does
not stream waits as long before it is sent).

Responder: `(request_json) -> str | Fault`, called from the server's handler threads (possibly
concurrently: guard shared state). The default echoes the last user message.
Faults apply to the next requests in FIFO order (`inject`), or a responder may return one.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Fault", "OpenAITestServer", "echo_responder"]


@dataclass(frozen=True)
class Fault:
    """One injected failure.

    kind: 'status' (HTTP `code`, optional `retry_after` header value and `body`),
          'hang' (wait `seconds` before answering normally; use with a client timeout),
          'drop' (close the connection without any response),
          'empty' (a valid completion whose content is ""), 'null' (content null),
          'no_choices' (choices: []), 'malformed' (200 with a body that is not JSON),
          'cut' (a stream that stops after `chars` characters of text and closes the connection
          without its final chunk; a request that does not stream is dropped).
    """

    kind: str
    code: int = 500                 # HTTP status for kind 'status'
    retry_after: str | None = None
    seconds: float = 0.0
    body: str | None = None
    chars: int = 0                  # for kind 'cut'

    @classmethod
    def status(cls, code: int, retry_after: str | float | None = None,
               body: str | None = None) -> Fault:
        ra = None if retry_after is None else str(retry_after)
        return cls("status", code=code, retry_after=ra, body=body)

    @classmethod
    def hang(cls, seconds: float = 30.0) -> Fault:
        return cls("hang", seconds=seconds)

    @classmethod
    def drop(cls) -> Fault:
        return cls("drop")

    @classmethod
    def empty(cls) -> Fault:
        return cls("empty")

    @classmethod
    def null(cls) -> Fault:
        return cls("null")

    @classmethod
    def no_choices(cls) -> Fault:
        return cls("no_choices")

    @classmethod
    def malformed(cls) -> Fault:
        return cls("malformed")

    @classmethod
    def cut(cls, chars: int = 10) -> Fault:
        return cls("cut", chars=chars)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def echo_responder(request: dict[str, Any]) -> str:
    """Default responder: 'echo: <last user message>'."""
    for m in reversed(request.get("messages", [])):
        if m.get("role") == "user":
            return "echo: " + _text_of(m.get("content"))
    return "echo: "


def count_tokens(text: str) -> int:
    """The server's pretend tokenizer: ~4 characters per token, at least 1."""
    return max(1, len(text) // 4)


class OpenAITestServer:
    """See the module docstring. Thread-safe counters: `request_count`, `requests` (bodies)."""

    def __init__(self, responder: Callable[[dict[str, Any]], Any] | None = None, *,
                 latency: float = 0.0, model: str | None = None, cached_tokens: int = 0,
                 stream_chunk_chars: int = 8, stream_chunk_delay: float = 0.0,
                 pace_plain: bool = False, reported_cost: float | None = None,
                 listed: list[str] | None = None) -> None:
        self.responder = responder or echo_responder
        self.listed = list(listed or [])   # what the model lists name (default: `model`)
        self.latency = latency
        self.model = model              # None: echo the requested model name
        self.cached_tokens = cached_tokens
        self.reported_cost = reported_cost    # USD in usage.cost of each reply, as OpenRouter
        self.stream_chunk_chars = stream_chunk_chars
        self.stream_chunk_delay = stream_chunk_delay
        self.pace_plain = pace_plain    # a reply that does not stream takes as long as one that does
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> OpenAITestServer:
        server = self

        class Handler(_Handler):
            srv = server

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="openai-testserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers that hang
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAITestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ API
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """For OpenAI-style clients (the SDK appends /chat/completions)."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """For the Anthropic SDK (it appends /v1/messages)."""
        return self.url

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each is consumed by one upcoming request, in order."""
        with self._lock:
            self._faults.extend(faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.headers.clear()
            self._faults.clear()

    # ------------------------------------------------------------ internals
    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> Fault | None:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            return self._faults.pop(0) if self._faults else None

    def _wait(self, seconds: float) -> bool:
        """Sleep, but wake when the server stops. True if the server is stopping."""
        if seconds <= 0:
            return self._stopping.is_set()
        return self._stopping.wait(seconds)


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) drops SYNs under a burst of concurrent clients, and the
    # kernel's 1 s SYN retransmit then shows up as latency.
    request_queue_size = 512
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    srv: OpenAITestServer
    protocol_version = "HTTP/1.1"  # keep-alive, so latency numbers reflect the server, not TCP

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without NODELAY, Nagle + delayed ACK
        # add ~40 ms to every response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet in tests

    # ---------------------------------------------------------- helpers
    def _send_json(self, status: int, obj: Any, extra_headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self._send_bytes(status, data, "application/json", extra_headers)

    def _send_bytes(self, status: int, data: bytes, ctype: str,
                    extra_headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        names = self.srv.listed or [self.srv.model or "test-model"]
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send_json(200, {"object": "list", "data": [
                {"id": n, "object": "model", "owned_by": "test"} for n in names]})
        elif self.path.rstrip("/") == "/api/tags":      # Ollama's own list of its models
            self._send_json(200, {"models": [
                {"name": n, "model": n, "size": 1, "digest": "0" * 64,
                 "modified_at": "2025-01-01T00:00:00Z"} for n in names]})
        elif self.path in ("/health", "/"):
            self._send_json(200, {"ok": True})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send_json(400, {"error": {"message": "request body is not JSON"}})
            return
        path = self.path.split("?")[0].rstrip("/")
        if path in ("/v1/chat/completions", "/chat/completions"):
            api = "openai"
        elif path in ("/v1/messages", "/messages"):
            api = "anthropic"
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._streaming = bool(body.get("stream"))
        fault = self.srv._record(body, headers)
        if self.srv._wait(self.srv.latency):
            return self._drop()
        self._message = None      # handlers live as long as a keep-alive connection
        if fault is None:
            try:
                out = self.srv.responder(body)
            except Exception as e:  # a broken responder is a 500, visible to the test
                out = Fault.status(500, body=f"responder raised {e!r}")
            if isinstance(out, Fault):
                fault = out
                text = ""
            elif isinstance(out, dict):   # a whole assistant message, e.g. with tool_calls
                self._message = {"role": "assistant", **out}
                text = str(out.get("content") or "")
            else:
                text = str(out)
        else:
            text = ""
        if fault is not None:
            if self._apply_fault(fault, api):
                return
            if fault.kind in ("hang", "cut") and not text:  # answer (a cut: in part)
                out = self.srv.responder(body)
                text = "" if isinstance(out, Fault) else str(out)
            elif fault.kind == "empty":
                text = ""
        if fault is not None and fault.kind in ("null", "no_choices"):
            content: str | None = None
        else:
            content = text
        cut = fault.chars if fault is not None and fault.kind == "cut" else None
        if api == "anthropic" and body.get("stream"):
            self._anthropic_stream(body, content or "", cut)
        elif api == "anthropic":
            self._anthropic_reply(body, content, fault)
        elif body.get("stream"):
            self._stream_reply(body, content or "", cut)
        else:
            if self.srv.pace_plain and content:   # the model writes at the same rate
                chunks = -(-len(content) // max(1, self.srv.stream_chunk_chars))
                if self.srv._wait(chunks * self.srv.stream_chunk_delay):
                    return self._drop()
            self._openai_reply(body, content, fault)

    def _apply_fault(self, fault: Fault, api: str) -> bool:
        """Send the fault's response. True if the request is fully handled."""
        if fault.kind == "status":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            if fault.body is not None:
                msg = fault.body
            else:
                msg = {429: "rate limited", 500: "internal error", 503: "overloaded"}.get(
                    fault.code, "injected error")
            if api == "anthropic":
                err: dict[str, Any] = {"type": "error",
                                       "error": {"type": "api_error", "message": msg}}
            else:
                err = {"error": {"message": msg, "type": "injected", "code": fault.code}}
            self._send_json(fault.code, err, headers)
            return True
        if fault.kind == "drop" or (fault.kind == "cut" and not self._streaming):
            self._drop()
            return True
        if fault.kind == "malformed":
            self._send_bytes(200, b'{"id": "x", "choices": [ this is not json', "application/json")
            return True
        if fault.kind == "hang":
            if self.srv._wait(fault.seconds):
                self._drop()
                return True
            return False
        return False  # empty / null / no_choices: shaped by the reply builders

    def _usage(self, body: dict[str, Any], text: str) -> tuple[int, int]:
        prompt = "".join(_text_of(m.get("content")) for m in body.get("messages", []))
        if isinstance(body.get("system"), str):
            prompt += body["system"]
        return count_tokens(prompt), (count_tokens(text) if text else 0)

    def _openai_reply(self, body: dict[str, Any], content: str | None, fault: Fault | None) -> None:
        model = self.srv.model or body.get("model", "test-model")
        pt, ct = self._usage(body, content or "")
        message = getattr(self, "_message", None) or {"role": "assistant", "content": content}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        choices = [] if (fault and fault.kind == "no_choices") else [{
            "index": 0, "finish_reason": finish, "logprobs": None, "message": message}]
        usage: dict[str, Any] = {"prompt_tokens": pt, "completion_tokens": ct,
                                 "total_tokens": pt + ct}
        if self.srv.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": min(self.srv.cached_tokens, pt)}
        if self.srv.reported_cost is not None:
            usage["cost"] = self.srv.reported_cost
        self._send_json(200, {"id": "chatcmpl-" + uuid.uuid4().hex[:12],
                              "object": "chat.completion", "created": int(time.time()),
                              "model": model, "choices": choices, "usage": usage})

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # body ends when the connection closes
        self.end_headers()
        self.close_connection = True

    def _pieces(self, text: str, cut: int | None) -> Any:
        """The text in chunks, paced; stops early at a cut (the caller then closes). Chunk k
        leaves k+1 delays after the start, whatever each wait overslept: a fixed rate."""
        n = max(1, self.srv.stream_chunk_chars)
        end = len(text) if cut is None else min(cut, len(text))
        t0 = time.monotonic()
        for k, i in enumerate(range(0, end, n)):
            due = t0 + (k + 1) * self.srv.stream_chunk_delay
            if self.srv._wait(due - time.monotonic()):
                return
            yield text[i:min(i + n, end)]

    def _stream_reply(self, body: dict[str, Any], text: str, cut: int | None = None) -> None:
        model = self.srv.model or body.get("model", "test-model")
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        created = int(time.time())
        self._start_sse()

        def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None,
                  choices: bool = True) -> None:
            obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                                   "created": created, "model": model,
                                   "choices": [{"index": 0, "delta": delta,
                                                "finish_reason": finish}] if choices else []}
            if usage is not None:
                obj["usage"] = usage
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        try:
            chunk({"role": "assistant", "content": ""})
            for piece in self._pieces(text, cut):
                chunk({"content": piece})
            if cut is not None or self.srv._stopping.is_set():
                return
            chunk({}, finish="stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                pt, ct = self._usage(body, text)
                usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
                if self.srv.cached_tokens:
                    usage["prompt_tokens_details"] = {
                        "cached_tokens": min(self.srv.cached_tokens, pt)}
                if self.srv.reported_cost is not None:
                    usage["cost"] = self.srv.reported_cost
                chunk({}, usage=usage, choices=False)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-stream

    def _anthropic_reply(self, body: dict[str, Any], content: str | None,
                         fault: Fault | None) -> None:
        model = self.srv.model or body.get("model", "test-model")
        pt, ct = self._usage(body, content or "")
        blocks = [] if (content is None or (fault and fault.kind == "no_choices")) else [
            {"type": "text", "text": content}]
        cached = min(self.srv.cached_tokens, pt)
        self._send_json(200, {
            "id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant",
            "model": model, "content": blocks, "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": pt - cached, "output_tokens": ct,
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}})

    def _anthropic_stream(self, body: dict[str, Any], text: str, cut: int | None) -> None:
        """The Messages API's SSE events: message_start (input usage), text deltas,
        message_delta (stop reason, output tokens), message_stop."""
        model = self.srv.model or body.get("model", "test-model")
        pt, ct = self._usage(body, text)
        cached = min(self.srv.cached_tokens, pt)
        self._start_sse()

        def event(name: str, data: dict[str, Any]) -> None:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        try:
            event("message_start", {"type": "message_start", "message": {
                "id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": pt - cached, "output_tokens": 1,
                          "cache_read_input_tokens": cached,
                          "cache_creation_input_tokens": 0}}})
            event("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}})
            for piece in self._pieces(text, cut):
                event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": piece}})
            if cut is not None or self.srv._stopping.is_set():
                return
            event("content_block_stop", {"type": "content_block_stop", "index": 0})
            event("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                    "usage": {"output_tokens": ct}})
            event("message_stop", {"type": "message_stop"})
        except (BrokenPipeError, ConnectionResetError):
            pass
