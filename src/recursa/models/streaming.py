"""Streaming model calls: the `astream` method of a ModelClient that declares
`capabilities.streaming`, and the helper that falls back to `complete` for the others.

    comp = await complete_streaming(client, messages, on_delta, max_tokens=512)

`astream(messages, on_delta, **options)` returns the same Completion `complete` would (text,
usage, cost, model), and calls `on_delta(piece, offset)` with each piece of text as it arrives:
`offset` is where the piece starts in the reply. A retry that restarts a reply after some text
was delivered starts again at offset 0, so a live view knows to drop what it showed. Retries
follow the client's policy; a stream that ends without its final chunk is a retryable
ModelError naming how much text had come (`StreamCut`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from recursa.base.types import Completion, Message, ModelClient, ModelError, StreamingModelClient

OnDelta = Callable[[str, int], None]


StreamingClient = StreamingModelClient     # the old name


class StreamCut(ModelError):
    """The stream ended before the server said the reply was complete."""

    def __init__(self, where: str, chars: int, cause: str = ""):
        cause = cause.removeprefix(f"{where}: ")     # an SDK error already naming the model
        why = f": {cause}" if cause else ""
        super().__init__(f"{where}: the stream was cut after {chars:,} characters of the "
                         f"reply{why}", retryable=True)
        self.chars = chars


class Pieces:
    """One attempt's text so far; hands each new piece to `on_delta` with its offset."""

    def __init__(self, on_delta: OnDelta):
        self.on_delta = on_delta
        self.parts: list[str] = []
        self.chars = 0

    def add(self, piece: str | None) -> None:
        if not piece:
            return
        self.parts.append(piece)
        offset, self.chars = self.chars, self.chars + len(piece)
        self.on_delta(piece, offset)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def can_stream(client: ModelClient) -> bool:
    return client.capabilities.streaming


async def complete_streaming(client: ModelClient, messages: list[Message],
                             on_delta: OnDelta | None, **options: Any) -> Completion:
    """`client.astream(...)` when there is somewhere to send deltas and the client declares it
    can stream; else `client.complete(...)` (then a live view sees the reply when the turn
    ends)."""
    if on_delta is not None and can_stream(client):
        return await cast(StreamingModelClient, client).astream(messages, on_delta, **options)
    return await client.complete(messages, **options)
