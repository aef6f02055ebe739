"""A real HTTP server on 127.0.0.1 speaking the wire formats of the hosted providers recursa's
extra clients talk to, for tests and benchmarks (stdlib only, background thread):

  POST /v1beta/models/{model}:generateContent          Gemini (google-genai SDK)
  POST /openai/deployments/{d}/chat/completions?api-version=...   Azure OpenAI
  POST /model/{model_id}/invoke                         Bedrock, Anthropic models (SigV4 signed)
  POST /v1/messages                                     Anthropic Messages API

Anthropic and Bedrock replies go through `PromptCache`, which bills cached prefixes the way the
real API does: `cache_control` breakpoints write the prefix up to them, a later request whose
prefix matches a written one (at a breakpoint or up to `lookback` blocks before it) reads it.

    with ProviderFake() as fake:
        fake.inject(429, retry_after="0.1")       # next request gets a 429
        ... client pointed at fake.url ...
        fake.requests[-1]   # {"path", "query", "headers", "body"}
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["ProviderFake", "PromptCache", "count_tokens"]


def count_tokens(text: str) -> int:
    """The fake tokenizer: ~4 characters a token (0 for empty text)."""
    return (len(text) + 3) // 4 if text else 0


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in (content or []) if isinstance(b, dict)]


class PromptCache:
    """Anthropic's prompt cache, by content blocks. A request is the list of its blocks (system
    blocks, then each message's blocks, role included in the hash). Thread-safe."""

    def __init__(self, min_tokens: int = 1024, lookback: int = 20) -> None:
        self.min_tokens = min_tokens
        self.lookback = lookback
        self._written: set[str] = set()
        self._lock = threading.Lock()

    def bill(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """(uncached input, cache read, cache write) tokens of one request."""
        blocks: list[tuple[str, dict[str, Any]]] = [("system", b)
                                                    for b in _blocks(body.get("system"))]
        for m in body.get("messages", []):
            blocks += [(m.get("role", "user"), b) for b in _blocks(m.get("content"))]
        h = hashlib.sha256()
        prefixes: list[tuple[str, int]] = []      # (hash of blocks[:i+1], tokens of them)
        total = 0
        for role, b in blocks:
            text = _text([b])
            h.update(json.dumps([role, text]).encode())
            total += count_tokens(text)
            prefixes.append((h.hexdigest(), total))
        marks = [i for i, (_, b) in enumerate(blocks) if b.get("cache_control")]
        read = 0
        with self._lock:
            for bp in marks:
                for j in range(bp, max(-1, bp - self.lookback), -1):
                    key, tokens = prefixes[j]
                    if key in self._written:
                        read = max(read, tokens)
                        break
            write = 0
            for bp in marks:
                key, tokens = prefixes[bp]
                if tokens >= self.min_tokens:
                    if key not in self._written:
                        write = max(write, tokens - read)
                    self._written.add(key)
        return total - read - write, read, write


@dataclass
class _Fault:
    status: int = 500
    retry_after: str | None = None
    empty: bool = False


_GEMINI = re.compile(r"^/v1(?:beta|alpha)?/models/([^/:]+):(generateContent|streamGenerateContent)$")
_AZURE = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")
_BEDROCK = re.compile(r"^/model/([^/]+)/invoke$")


class ProviderFake:
    """See the module docstring. `responder(prompt_text) -> str` makes the reply text (default:
    'echo: <last user text>'); `cached_tokens` is what Gemini/Azure replies report as cached."""

    def __init__(self, responder: Callable[[str], str] | None = None, *,
                 cached_tokens: int = 0, azure_model: str = "gpt-4o-mini-2024-07-18",
                 cache: PromptCache | None = None) -> None:
        self.responder = responder or (lambda last: "echo: " + last)
        self.cached_tokens = cached_tokens
        self.azure_model = azure_model
        self.cache = cache or PromptCache()
        self.requests: list[dict[str, Any]] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProviderFake:
        fake = self

        class Handler(_Handler):
            srv = fake

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def inject(self, status: int = 500, retry_after: str | None = None, *,
               empty: bool = False) -> None:
        with self._lock:
            self._faults.append(_Fault(status, retry_after, empty))

    def _record(self, entry: dict[str, Any]) -> _Fault | None:
        with self._lock:
            self.requests.append(entry)
            return self._faults.pop(0) if self._faults else None


class _Handler(BaseHTTPRequestHandler):
    srv: ProviderFake
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = urlsplit(self.path)
        body = json.loads(raw or b"{}")
        entry = {"path": parts.path, "query": parse_qs(parts.query),
                 "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
        fault = self.srv._record(entry)
        if fault is not None and not fault.empty:
            extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            msg = {429: "rate limited", 503: "overloaded"}.get(fault.status, "injected error")
            self._send(fault.status, {"error": {"code": fault.status, "message": msg,
                                                "status": "INJECTED", "type": "api_error"}},
                       extra)
            return
        empty = fault is not None and fault.empty
        if m := _GEMINI.match(parts.path):
            self._gemini(m.group(1), body, empty, stream=m.group(2) == "streamGenerateContent")
        elif m := _AZURE.match(parts.path):
            self._azure(m.group(1), entry, empty)
        elif m := _BEDROCK.match(parts.path):
            self._bedrock(m.group(1), entry, empty)
        elif parts.path == "/v1/messages":
            self._anthropic(body.get("model", ""), body, empty)
        else:
            self._send(404, {"error": {"code": 404, "message": f"no route {parts.path}"}})

    # ------------------------------------------------------------------ dialects
    def _reply(self, last_user: str, empty: bool) -> str:
        return "" if empty else self.srv.responder(last_user)

    def _gemini(self, model: str, body: dict[str, Any], empty: bool,
                stream: bool = False) -> None:
        contents = body.get("contents", [])
        users = [c for c in contents if c.get("role", "user") == "user"]
        last = _text(users[-1].get("parts")) if users else ""
        system = _text((body.get("systemInstruction") or {}).get("parts"))
        prompt = count_tokens(system + "".join(_text(c.get("parts")) for c in contents))
        text = self._reply(last, empty)
        parts = [{"text": "thinking...", "thought": True}, {"text": text}] if text else []
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": count_tokens(text),
                 "thoughtsTokenCount": 2,
                 "cachedContentTokenCount": min(self.srv.cached_tokens, prompt),
                 "totalTokenCount": prompt + count_tokens(text) + 2}
        if stream:
            self._gemini_stream(model, text, usage)
            return
        self._send(200, {
            "candidates": [{"content": {"role": "model", "parts": parts},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage,
            "modelVersion": model, "responseId": uuid.uuid4().hex[:12]})

    def _gemini_stream(self, model: str, text: str, usage: dict[str, Any]) -> None:
        """`?alt=sse`: a thought, then the text 5 characters a chunk; the last chunk has the
        finishReason and the whole call's usageMetadata."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        rid = uuid.uuid4().hex[:12]

        def send(parts: list[dict[str, Any]], last: bool = False) -> None:
            cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            obj: dict[str, Any] = {"candidates": [cand], "modelVersion": model,
                                   "responseId": rid}
            if last:
                cand["finishReason"] = "STOP"
                obj["usageMetadata"] = usage
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\r\n\r\n")

        send([{"text": "thinking...", "thought": True}])
        pieces = [text[i:i + 5] for i in range(0, len(text), 5)] or [""]
        for i, piece in enumerate(pieces):
            send([{"text": piece}], last=i == len(pieces) - 1)
        self.wfile.flush()

    def _azure(self, deployment: str, entry: dict[str, Any], empty: bool) -> None:
        if not entry["query"].get("api-version"):
            self._send(404, {"error": {"code": "404", "message": "Resource not found"}})
            return
        if not (entry["headers"].get("api-key") or entry["headers"].get("authorization")):
            self._send(401, {"error": {"code": "401", "message": "Access denied: no api-key"}})
            return
        msgs = entry["body"].get("messages", [])
        users = [m for m in msgs if m.get("role") == "user"]
        text = self._reply(_text(users[-1].get("content")) if users else "", empty)
        pt = count_tokens("".join(_text(m.get("content")) for m in msgs))
        ct = count_tokens(text)
        usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
                 "prompt_tokens_details": {"cached_tokens": min(self.srv.cached_tokens, pt)}}
        if entry["body"].get("stream"):
            self._azure_stream(text, usage, bool((entry["body"].get("stream_options") or {})
                                                 .get("include_usage")))
            return
        self._send(200, {
            "id": "chatcmpl-" + uuid.uuid4().hex[:12], "object": "chat.completion",
            "created": 0, "model": self.srv.azure_model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
                      "prompt_tokens_details": {
                          "cached_tokens": min(self.srv.cached_tokens, pt)}}})

    def _azure_stream(self, text: str, usage: dict[str, Any], include_usage: bool) -> None:
        """Azure's SSE: a first chunk with no choices (the prompt's content-filter results),
        then OpenAI's chunks, 5 characters each."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        base = {"id": "chatcmpl-" + uuid.uuid4().hex[:12], "object": "chat.completion.chunk",
                "created": 0, "model": self.srv.azure_model}

        def send(obj: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + json.dumps({**base, **obj}).encode() + b"\n\n")

        send({"model": "", "choices": [], "prompt_filter_results": [
            {"prompt_index": 0, "content_filter_results": {}}]})
        send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                           "finish_reason": None}]})
        for i in range(0, len(text), 5):
            send({"choices": [{"index": 0, "delta": {"content": text[i:i + 5]},
                               "finish_reason": None}]})
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if include_usage:
            send({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _bedrock(self, model_id: str, entry: dict[str, Any], empty: bool) -> None:
        auth = entry["headers"].get("authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 ") or "x-amz-date" not in entry["headers"]:
            self._send(403, {"message": "Missing Authentication Token"})
            return
        self._anthropic(model_id, entry["body"], empty)

    def _anthropic(self, model: str, body: dict[str, Any], empty: bool) -> None:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        text = self._reply(_text(users[-1].get("content")) if users else "", empty)
        fresh, read, write = self.srv.cache.bill(body)
        self._send(200, {
            "id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant",
            "model": model, "stop_reason": "end_turn", "stop_sequence": None,
            "content": [{"type": "text", "text": text}] if text else [],
            "usage": {"input_tokens": fresh, "output_tokens": count_tokens(text),
                      "cache_read_input_tokens": read, "cache_creation_input_tokens": write}})
