"""The host <-> worker wire protocol.

One bidirectional byte stream (a subprocess's stdin/stdout locally; the stdio of a remote
process for Docker / Modal). Each message is a *frame*: a 4-byte big-endian unsigned length
followed by that many bytes of UTF-8 JSON encoding one object with a ``type`` key.

host -> worker
  init       {context_path: str|null, kind: "text"|"json", functions?: [spec, ...]}
             Load the context once into the REPL as ``context``, and define the host
             functions (``Repl.define_functions``: name, params, doc), each of which sends a
             ``host_function`` call {name, arguments}. Answered by ``ready``
             {load_s, python, pid, protocol} or ``init_error`` {error}. A worker started
             with ``--late-context`` (pre-started before its context was known) accepts
             nothing before ``init``: it opens ``context_path``, then drops its uid; any other
             first message gets ``init_error`` and the worker exits.
  exec       {id: str, code: str, max_output_chars: int}
             Run one cell in the persistent globals. Answered by ``done`` (below). The host
             sends at most one ``exec`` at a time.
  result     {id: str, value: any} | {id: str, error: str}
             The answer to a worker ``call``; ``error`` makes the call raise in user code.
             (Handler failures are sent as a *value* "Error: ..." instead, see CallHandler.)
  interrupt  {id: str}   Raise KeyboardInterrupt in cell ``id`` if it is still running.
  ping       {id}        Answered by ``pong`` {id}.
  shutdown   {}          Exit cleanly.

worker -> host
  call       {id: str, kind: "llm"|"llm_batch"|"rlm"|"rlm_batch"|"host_function"|..., args: {...}}
             Sent from any thread of user code; that thread blocks until the ``result`` with
             the same id. Several calls may be outstanding at once; results may come in any
             order.
  done       {id, stdout, stderr, value, error, elapsed_s, stdout_chars, stderr_chars,
              answer: {content, ready}, final, variables}  -- the fields of ``Cell``.
  protocol_error {error}   The worker could not understand a message.

The worker never writes anything else to the stream: at startup it moves the protocol to
private file descriptors and points fds 0 and 1 at /dev/null, so user code writing to them (or
subprocesses it starts) cannot corrupt the framing. fd 2 is left to the host for crash
diagnostics.

Frames from the worker are untrusted input all the same: user code runs in that process and can
find the private descriptors. `FrameLimits` bounds each frame by its type before it is parsed
(a call's arguments, a done's fields, anything else small) and after (the done's fields in
characters, the number of JSON values); the host (session.py) reads only while it waits for an
answer and drops frames it did not ask for.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER_PATH = Path(__file__).with_name("worker.py")   # the program at the other end
HEADER = struct.Struct(">I")
MAX_FRAME = 512 * 1024 * 1024  # a worker sending more than this is treated as broken


class ProtocolError(Exception):
    """A frame outside the protocol: the worker broke it (its run ends)."""


class MalformedFrame(ProtocolError):
    """The byte stream did not hold a decodable frame. Treated like a crash (the worker is
    restarted): a damaged stream may come from a remote transport, not only from user code."""


def encode(msg: dict[str, Any]) -> bytes:
    """One frame for `msg`. Values JSON cannot encode are sent as their repr."""
    data = json.dumps(msg, default=_fallback, ensure_ascii=False).encode("utf-8")
    return HEADER.pack(len(data)) + data


def decode_length(header: bytes) -> int:
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise MalformedFrame(f"frame of {n} bytes exceeds the {MAX_FRAME} byte limit")
    return n


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedFrame(f"invalid frame body: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise MalformedFrame("frame is not an object with a 'type'")
    return msg


# ------------------------------------------------------------------ limits on worker frames
MiB = 1024 * 1024
CALL_PREFIX = b'{"type": "call"'   # how the worker's own encoder starts every call frame


@dataclass(frozen=True)
class FrameLimits:
    """What the host accepts from a worker. An honest worker stays inside these (its output is
    capped at `max_output_chars`, see worker.Capture); a frame outside them means user code is
    writing to the protocol, and the worker is killed.

    call_bytes: one call frame (its arguments: prompts, images). 16 MiB is several times the
    largest model context; the worker is told nothing of it, a bigger batch breaks the run.
    answer_chars: `answer["content"]` (and `final`) of a done; the only unbounded done field.
    small_bytes: every other frame (ready, init_error, pong, protocol_error).
    values: JSON values in one frame (strings, numbers, containers): a frame of 16 MiB of `{}`
    parses to ~400 MB of dicts, so the count is checked before parsing.
    in_flight_bytes: frames of one run held at once (outstanding calls' arguments); above it
    the host stops reading until calls finish, so the worker's writes block.
    variables: names kept from a done's `variables` (the rest are dropped; they feed prompts).
    unrequested_frames / unrequested_bytes: frames dropped in one cell (a `done` for no cell,
    a `pong` for no `ping`) before the worker counts as flooding the protocol.
    parse_inline_bytes: frames above this are parsed in a thread, not on the event loop."""

    call_bytes: int = 16 * MiB
    answer_chars: int = 1_000_000
    small_bytes: int = 64 * 1024
    values: int = 250_000
    in_flight_bytes: int = 64 * MiB
    variables: int = 1000
    variable_chars: int = 200
    unrequested_frames: int = 256
    unrequested_bytes: int = 4 * MiB
    parse_inline_bytes: int = 256 * 1024

    @staticmethod
    def text_chars(max_output_chars: int) -> int:
        """The longest stdout/stderr/value/error an honest worker sends for this cap: value is
        a repr of up to `max_output_chars` characters, each up to 4 (\\xNN), plus a note."""
        return 4 * max(int(max_output_chars), 2000) + 1024

    def done_bytes(self, max_output_chars: int) -> int:
        """Bytes of the largest honest done frame: four capped texts and the answer twice, at
        up to 6 bytes a character in JSON (\\u0001), the variable names, the small fields."""
        texts = 4 * self.text_chars(max_output_chars) + 2 * self.answer_chars
        return 6 * texts + 4 * MiB + self.small_bytes

    def frame_bytes(self, max_output_chars: int | None) -> int:
        """The largest frame accepted while waiting for a cell (None: while starting)."""
        if max_output_chars is None:
            return self.small_bytes
        return max(self.call_bytes, self.done_bytes(max_output_chars))


LIMITS = FrameLimits()
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def quick_count(data: bytes) -> int:
    """The separators in `data` that `count_values` counts (add up over chunks)."""
    return data.count(b",") + data.count(b":")


def count_values(body: bytes, limit: int, quick: int | None = None) -> int:
    """An upper bound of the JSON values in `body`, exact enough to stay under `limit` for
    honest frames: every value but the first of a container follows a ',' or a ':' (nesting
    is bounded by the parser's recursion limit). Commas in long prose strings inflate the
    quick count; then the strings are cut out and the structure counted again."""
    total = quick_count(body) if quick is None else quick
    if 2 * total + 2048 <= limit:
        return 2 * total + 2048
    inside = _separators_in_strings(body, max_strings=limit)
    if inside is None:   # many strings: cut them all out at once
        return 2 * quick_count(_STRING.sub(b'""', body)) + 2048
    return 2 * (total - inside) + 2048


def _separators_in_strings(body: bytes, max_strings: int) -> int | None:
    """The ',' and ':' inside the JSON strings of `body`, found string by string (a frame of
    empty objects has almost none, so this is far cheaper than a regex over all of it); None
    if there are more than `max_strings` strings or a long run of backslashes."""
    inside = pos = strings = 0
    while (start := body.find(b'"', pos)) >= 0:
        strings += 1
        if strings > max_strings:
            return None
        end = start + 1
        while True:
            end = body.find(b'"', end)
            if end < 0:   # unterminated: the parser refuses it
                return inside
            run = len(body[max(start + 1, end - 64):end]) - len(
                body[max(start + 1, end - 64):end].rstrip(b"\\"))
            if run == 64:
                return None
            if run % 2 == 0:   # not escaped: the string ends here
                break
            end += 1
        inside += body.count(b",", start, end) + body.count(b":", start, end)
        pos = end + 1
    return inside


def check_frame(body: bytes, msg: dict[str, Any], limits: FrameLimits,
                max_output_chars: int | None) -> None:
    """Raise ProtocolError if a parsed frame is larger than its type allows."""
    n = len(body)
    kind = msg["type"]
    if kind == "call":
        if n > limits.call_bytes:
            raise ProtocolError(f"a call frame of {n} bytes exceeds the {limits.call_bytes} "
                                f"byte limit")
        if not isinstance(msg.get("id"), str) or len(msg["id"]) > 64 \
                or not isinstance(msg.get("kind"), str) or not isinstance(msg.get("args"), dict):
            raise ProtocolError("a call frame without a string id, a kind and an args object")
    elif kind == "done" and max_output_chars is not None:
        if n > limits.done_bytes(max_output_chars):
            raise ProtocolError(f"a done frame of {n} bytes exceeds the "
                                f"{limits.done_bytes(max_output_chars)} byte limit")
    elif n > limits.small_bytes:
        raise ProtocolError(f"a {kind!r} frame of {n} bytes exceeds the {limits.small_bytes} "
                            f"byte limit")


def check_done(msg: dict[str, Any], limits: FrameLimits, max_output_chars: int) -> None:
    """Raise ProtocolError if a done's fields are beyond what an honest worker sends."""
    cap = limits.text_chars(max_output_chars)
    for key in ("stdout", "stderr", "value", "error"):
        v = msg.get(key)
        if v is not None and (not isinstance(v, str) or len(v) > cap):
            raise ProtocolError(f"the done frame's {key} is not a string of at most {cap} "
                                f"characters")
    for key in ("stdout", "stderr"):
        total, shown = msg.get(f"{key}_chars", 0), msg.get(key) or ""
        if not isinstance(total, int) or total < len(shown):
            raise ProtocolError(f"the done frame's {key}_chars ({total!r}) is less than the "
                                f"{key} it carries")
    ans = msg.get("answer")
    content = ans.get("content") if isinstance(ans, dict) else None
    for v in (content, msg.get("final")):
        if isinstance(v, str) and len(v) > limits.answer_chars:
            raise ProtocolError(f"the done frame's answer is longer than "
                                f"{limits.answer_chars} characters")
    names = msg.get("variables")
    if names is not None and not isinstance(names, list):
        raise ProtocolError("the done frame's variables are not a list")


def _fallback(obj: Any) -> Any:
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    if isinstance(obj, bytes | bytearray):
        return obj.decode("utf-8", errors="replace")
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    return repr(obj)
