"""A fake of hosted model wires behind `httpx.MockTransport` (httpx's public seam), for the
provider conformance kit (recursa.testing.conformance). It needs no pytest.

Requests are routed to the first `Wire` whose `match` claims them: a fake's own `wires=`
first, then recursa's, by path:

    .../chat/completions                                  OpenAI chat completions (Azure too)
    .../v1/messages, /model/{id}/invoke                   Anthropic's Messages API (Bedrock)
    .../models/{m}:generateContent | :streamGenerateContent   Gemini

so a provider that speaks one of these needs nothing here, and one with a wire of its own
passes a `Wire` subclass that writes it. Every reply is `text` (the pieces of `PIECES`) with
the counts of `USAGE`: 11 input tokens, 3 of them read from the provider's cache, and 7 output
tokens, written the way each wire writes them. `script(...)` sets what the next requests get
instead, in order:

    Step.status_of(429, retry_after="0.05")    an error status in the wire's error shape
    Step.empty()                               a complete reply with no text
    Step.cut(2)                                a stream that stops after 2 pieces (a reply
                                               that does not stream: the body ends mid-JSON)
    Step.bad_usage("many")                     the input-token count replaced by this value
    Step.hang()                                no answer at all (until cancelled)
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import httpx

httpx2: Any
try:   # the fork of httpx recent SDKs use: the `anthropic` SDK's `http_client=` must be one
    import httpx2
except ImportError:
    httpx2 = None

__all__ = ["PIECES", "USAGE", "ChatWire", "GeminiWire", "MessagesWire", "Step", "Wire",
           "WireFake", "sse"]

PIECES = ("The answer ", "is forty", "-two.")
USAGE = (11, 7, 3)                  # input (cached included), output, cached


class Step(NamedTuple):
    """What one request gets instead of the usual reply (see the module docstring)."""

    kind: str
    status: int = 0
    retry_after: str | None = None
    pieces: int = 0
    value: Any = None

    @classmethod
    def status_of(cls, status: int, retry_after: str | None = None) -> Step:
        return cls("status", status=status, retry_after=retry_after)

    @classmethod
    def empty(cls) -> Step:
        return cls("empty")

    @classmethod
    def cut(cls, pieces: int = 2) -> Step:
        return cls("cut", pieces=pieces)

    @classmethod
    def bad_usage(cls, value: Any = "many") -> Step:
        return cls("bad_usage", value=value)

    @classmethod
    def hang(cls) -> Step:
        return cls("hang")


# ------------------------------------------------------------------ the wires
class Wire:
    """One wire format as the fake writes it; a subclass per format. The fake asks each wire's
    `match` in turn, and the first that returns a Wire serves the request.

    `match(request, body)`: this wire, built for one request (`body` is its JSON, `{}` when it
    has none or is not JSON), if the wire serves it (by path, usually); else None. `stream`:
    whether the reply streams (`events`) or is one body (`reply`); `content_type` is a
    streamed reply's. `error(status, message)`: the body of an error status. `usage(n)`: the
    usage object of USAGE's counts, the input count replaced by `n` (a malformed value when the
    kit tests one: write it as it comes). `reply(pieces, usage)`: a whole reply's JSON body.
    `events(pieces, usage, cut=)`: a streamed reply's chunks; with `cut`, the pieces only,
    without what ends a complete reply."""

    content_type = "text/event-stream"

    def __init__(self, model: str, *, stream: bool) -> None:
        self.model = model
        self.stream = stream

    @classmethod
    def match(cls, request: Any, body: Any) -> Wire | None:
        return None

    def error(self, status: int, message: str) -> Any:
        return {"error": {"message": message, "type": "error", "code": status}}

    def usage(self, input_tokens: Any) -> Any:
        raise NotImplementedError

    def reply(self, pieces: tuple[str, ...], usage: Any) -> Any:
        raise NotImplementedError

    def events(self, pieces: tuple[str, ...], usage: Any, *, cut: bool) -> list[bytes]:
        raise NotImplementedError(f"{type(self).__name__} does not stream")


def sse(obj: Any, event: str | None = None) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(obj) + "\n\n").encode()


class ChatWire(Wire):
    """OpenAI's chat completions (and every server that copies it)."""

    @classmethod
    def match(cls, request: Any, body: Any) -> Wire | None:
        if request.url.path.endswith("/chat/completions"):
            return cls(body.get("model", ""), stream=bool(body.get("stream")))
        return None

    def usage(self, input_tokens: Any) -> dict[str, Any]:
        _, out, cached = USAGE
        return {"prompt_tokens": input_tokens, "completion_tokens": out,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def reply(self, pieces: tuple[str, ...], usage: Any) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                "model": self.model, "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(pieces)}}]}

    def events(self, pieces: tuple[str, ...], usage: Any, *, cut: bool) -> list[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                        "model": self.model, "choices": [
                            {"index": 0, "delta": delta, "finish_reason": finish}]})

        out = [chunk({"role": "assistant", "content": p}) for p in pieces]
        if cut:
            return out
        return [*out, chunk({}, "stop"),
                sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                     "model": self.model, "choices": [], "usage": usage}),
                b"data: [DONE]\n\n"]


_BEDROCK = re.compile(r"/model/([^/]+)/invoke$")


class MessagesWire(Wire):
    """Anthropic's Messages API, and Bedrock's invoke of it (which never streams here)."""

    @classmethod
    def match(cls, request: Any, body: Any) -> Wire | None:
        path = request.url.path
        if m := _BEDROCK.search(path):
            return cls(m.group(1), stream=False)
        if path.endswith("/v1/messages"):
            return cls(body.get("model", ""), stream=bool(body.get("stream")))
        return None

    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}

    def usage(self, input_tokens: Any) -> dict[str, Any]:
        _, out, cached = USAGE
        fresh = input_tokens - cached if isinstance(input_tokens, int) else input_tokens
        return {"input_tokens": fresh, "output_tokens": out, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0}

    def reply(self, pieces: tuple[str, ...], usage: Any) -> dict[str, Any]:
        text = "".join(pieces)
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": text}] if text else [],
                "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}

    def events(self, pieces: tuple[str, ...], usage: Any, *, cut: bool) -> list[bytes]:
        start: dict[str, Any] = {
            "id": "msg_1", "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1}}
        out = [sse({"type": "message_start", "message": start}, "message_start"),
               sse({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}, "content_block_start")]
        out += [sse({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": p}}, "content_block_delta")
                for p in pieces]
        if cut:
            return out
        return [*out, sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                sse({"type": "message_delta", "usage": {"output_tokens": usage["output_tokens"]},
                     "delta": {"stop_reason": "end_turn", "stop_sequence": None}},
                    "message_delta"),
                sse({"type": "message_stop"}, "message_stop")]


_GEMINI = re.compile(r"/models/([^/:]+):(generateContent|streamGenerateContent)$")


class GeminiWire(Wire):
    """Gemini's generateContent (thought parts and thinking tokens included)."""

    @classmethod
    def match(cls, request: Any, body: Any) -> Wire | None:
        if m := _GEMINI.search(request.url.path):
            return cls(m.group(1), stream=m.group(2) == "streamGenerateContent")
        return None

    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"code": status, "message": message, "status": "UNAVAILABLE"}}

    def usage(self, input_tokens: Any) -> dict[str, Any]:
        _, out, cached = USAGE
        return {"promptTokenCount": input_tokens, "candidatesTokenCount": out - 2,
                "thoughtsTokenCount": 2, "cachedContentTokenCount": cached}

    def _chunk(self, parts: list[dict[str, Any]], finish: bool,
               usage: dict[str, Any] | None) -> dict[str, Any]:
        cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            cand["finishReason"] = "STOP"
        return {"candidates": [cand], "modelVersion": self.model,
                **({"usageMetadata": usage} if usage else {})}

    def reply(self, pieces: tuple[str, ...], usage: Any) -> dict[str, Any]:
        text = "".join(pieces)
        parts = [{"text": "thinking...", "thought": True}] + ([{"text": text}] if text else [])
        return self._chunk(parts, True, usage)

    def events(self, pieces: tuple[str, ...], usage: Any, *, cut: bool) -> list[bytes]:
        out = [sse(self._chunk([{"text": "thinking...", "thought": True}], False, None))]
        out += [sse(self._chunk([{"text": p}], False, None)) for p in pieces]
        return out if cut else [*out, sse(self._chunk([], True, usage))]


BUILTIN_WIRES: tuple[type[Wire], ...] = (GeminiWire, MessagesWire, ChatWire)


# ------------------------------------------------------------------ the fake
class WireFake:
    """See the module docstring. `requests` holds every request seen; `served` the Wire that
    answered each request a wire matched."""

    def __init__(self, pieces: tuple[str, ...] = PIECES, *,
                 wires: Sequence[type[Wire]] = ()) -> None:
        self.pieces = pieces
        self.wires = (*wires, *BUILTIN_WIRES)
        self.requests: list[Any] = []     # httpx (or httpx2) Requests
        self.served: list[Wire] = []
        self._script: list[Step] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def script(self, *steps: Step) -> None:
        self._script.extend(steps)

    def http_clients(self) -> Iterator[Any]:
        """An AsyncClient over this fake, of each flavour in turn: httpx's, then httpx2's."""
        for mod in (httpx, httpx2):
            if mod is not None:
                yield mod.AsyncClient(transport=mod.MockTransport(self.handle))

    async def handle(self, request: Any) -> Any:
        """An httpx (or httpx2) Request in, a Response of the same flavour out."""
        self.requests.append(request)
        mod = httpx2 if httpx2 is not None and isinstance(request, httpx2.Request) else httpx
        step = self._script.pop(0) if self._script else Step("ok")
        if step.kind == "hang":
            await asyncio.Event().wait()
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            body = {}
        wire = next((w for cls in self.wires
                     if (w := cls.match(request, body if isinstance(body, dict) else {}))
                     is not None), None)
        if wire is None:
            return mod.Response(404, json={"error": {"message": (
                f"no fake wire serves {request.url.path}: pass a Wire that matches it")}})
        self.served.append(wire)
        if step.kind == "status":
            headers = {"retry-after": step.retry_after} if step.retry_after else {}
            return mod.Response(step.status, headers=headers,
                                json=wire.error(step.status, "slow down"))
        pieces = () if step.kind == "empty" else self.pieces
        usage = wire.usage(step.value if step.kind == "bad_usage" else USAGE[0])
        if not wire.stream:
            content = json.dumps(wire.reply(pieces, usage)).encode()
            if step.kind == "cut":
                content = content[:len(content) // 2]
            return mod.Response(200, content=content,
                                headers={"content-type": "application/json"})
        events = wire.events(pieces[:step.pieces] if step.kind == "cut" else pieces, usage,
                             cut=step.kind == "cut")
        return mod.Response(200, content=b"".join(events),
                            headers={"content-type": wire.content_type})
