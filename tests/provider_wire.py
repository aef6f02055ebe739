"""A fake of every hosted wire recursa speaks, behind `httpx.MockTransport` (httpx's public
seam), for the provider conformance suite (tests/test_provider_conformance.py). Requests are
routed by path, so a new provider that speaks one of these wires needs nothing here:

    .../chat/completions                                  OpenAI chat completions (Azure too)
    .../v1/messages, /model/{id}/invoke                   Anthropic's Messages API (Bedrock)
    .../models/{m}:generateContent | :streamGenerateContent   Gemini

Every reply is `text` with usage 11 input tokens (3 of them read from the provider's cache) and
7 output tokens, written the way each wire writes it. `script(...)` sets what the next
requests get instead, in order:

    Step.status(429, retry_after="0.05")    an error status in the wire's error shape
    Step.empty()                            a complete reply with no text
    Step.cut(2)                             a stream that stops after 2 pieces (a reply that
                                            does not stream: the body ends mid-JSON)
    Step.bad_usage("many")                  the input-token count replaced by this value
    Step.hang()                             no answer at all (until cancelled)
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx

try:   # the fork of httpx recent SDKs use: the `anthropic` SDK's `http_client=` must be one
    import httpx2
except ImportError:
    httpx2 = None

__all__ = ["PIECES", "Step", "USAGE", "WireFake"]

PIECES = ("The answer ", "is forty", "-two.")
USAGE = (11, 7, 3)                  # input (cached included), output, cached


class Step(NamedTuple):
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


_GEMINI = re.compile(r"/models/([^/:]+):(generateContent|streamGenerateContent)$")
_BEDROCK = re.compile(r"/model/([^/]+)/invoke$")


class WireFake:
    """See the module docstring. `requests` holds every request seen."""

    def __init__(self, pieces: tuple[str, ...] = PIECES) -> None:
        self.pieces = pieces
        self.requests: list[Any] = []     # httpx (or httpx2) Requests
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
        body = json.loads(request.content or b"{}")
        path = request.url.path
        if m := _GEMINI.search(path):
            wire: _Wire = _Gemini(m.group(1), stream=m.group(2) == "streamGenerateContent")
        elif m := _BEDROCK.search(path):
            wire = _Anthropic(m.group(1), stream=False)
        elif path.endswith("/v1/messages"):
            wire = _Anthropic(body.get("model", ""), stream=bool(body.get("stream")))
        elif path.endswith("/chat/completions"):
            wire = _Chat(body.get("model", ""), stream=bool(body.get("stream")))
        else:
            return mod.Response(404, json={"error": {"message": f"no route {path}"}})
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
                              headers={"content-type": "text/event-stream"})


# ------------------------------------------------------------------ the wires
class _Wire:
    def __init__(self, model: str, *, stream: bool) -> None:
        self.model = model
        self.stream = stream

    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "error", "code": status}}

    def usage(self, input_tokens: Any) -> dict[str, Any]:
        raise NotImplementedError

    def reply(self, pieces: tuple[str, ...], usage: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, pieces: tuple[str, ...], usage: dict[str, Any], *,
               cut: bool) -> list[bytes]:
        raise NotImplementedError


def _data(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(obj) + "\n\n").encode()


class _Chat(_Wire):
    def usage(self, input_tokens: Any) -> dict[str, Any]:
        _, out, cached = USAGE
        return {"prompt_tokens": input_tokens, "completion_tokens": out,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def reply(self, pieces: tuple[str, ...], usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                "model": self.model, "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(pieces)}}]}

    def events(self, pieces: tuple[str, ...], usage: dict[str, Any], *,
               cut: bool) -> list[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _data({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                          "model": self.model, "choices": [
                              {"index": 0, "delta": delta, "finish_reason": finish}]})

        out = [chunk({"role": "assistant", "content": p}) for p in pieces]
        if cut:
            return out
        return [*out, chunk({}, "stop"),
                _data({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                       "model": self.model, "choices": [], "usage": usage}),
                b"data: [DONE]\n\n"]


class _Anthropic(_Wire):
    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}

    def usage(self, input_tokens: Any) -> dict[str, Any]:
        whole, out, cached = USAGE
        fresh = input_tokens - cached if isinstance(input_tokens, int) else input_tokens
        return {"input_tokens": fresh, "output_tokens": out, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0}

    def reply(self, pieces: tuple[str, ...], usage: dict[str, Any]) -> dict[str, Any]:
        text = "".join(pieces)
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": text}] if text else [],
                "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}

    def events(self, pieces: tuple[str, ...], usage: dict[str, Any], *,
               cut: bool) -> list[bytes]:
        start = {"id": "msg_1", "type": "message", "role": "assistant", "model": self.model,
                 "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {**usage, "output_tokens": 1}}
        out = [_data({"type": "message_start", "message": start}, "message_start"),
               _data({"type": "content_block_start", "index": 0,
                      "content_block": {"type": "text", "text": ""}}, "content_block_start")]
        out += [_data({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": p}}, "content_block_delta")
                for p in pieces]
        if cut:
            return out
        return [*out, _data({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                _data({"type": "message_delta", "usage": {"output_tokens": usage["output_tokens"]},
                       "delta": {"stop_reason": "end_turn", "stop_sequence": None}},
                      "message_delta"),
                _data({"type": "message_stop"}, "message_stop")]


class _Gemini(_Wire):
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

    def reply(self, pieces: tuple[str, ...], usage: dict[str, Any]) -> dict[str, Any]:
        text = "".join(pieces)
        parts = [{"text": "thinking...", "thought": True}] + ([{"text": text}] if text else [])
        return self._chunk(parts, True, usage)

    def events(self, pieces: tuple[str, ...], usage: dict[str, Any], *,
               cut: bool) -> list[bytes]:
        out = [_data(self._chunk([{"text": "thinking...", "thought": True}], False, None))]
        out += [_data(self._chunk([{"text": p}], False, None)) for p in pieces]
        return out if cut else [*out, _data(self._chunk([], True, usage))]
