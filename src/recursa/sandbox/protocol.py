"""The host <-> worker wire protocol.

One bidirectional byte stream (a subprocess's stdin/stdout locally; the stdio of a remote
process for Docker / Modal). Each message is a *frame*: a 4-byte big-endian unsigned length
followed by that many bytes of UTF-8 JSON encoding one object with a ``type`` key.

host -> worker
  init       {context_path: str|null, kind: "text"|"json"}
             Load the context once into the REPL as ``context``. Answered by ``ready``
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
  call       {id: str, kind: "llm"|"llm_batch"|"rlm"|"rlm_batch", args: {...}}
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
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

WORKER_PATH = Path(__file__).with_name("worker.py")   # the program at the other end
HEADER = struct.Struct(">I")
MAX_FRAME = 512 * 1024 * 1024  # a worker sending more than this is treated as broken


class ProtocolError(Exception):
    """The byte stream did not hold a valid frame."""


def encode(msg: dict[str, Any]) -> bytes:
    """One frame for `msg`. Values JSON cannot encode are sent as their repr."""
    data = json.dumps(msg, default=_fallback, ensure_ascii=False).encode("utf-8")
    return HEADER.pack(len(data)) + data


def decode_length(header: bytes) -> int:
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds the {MAX_FRAME} byte limit")
    return n


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"invalid frame body: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("frame is not an object with a 'type'")
    return msg


def _fallback(obj: Any) -> Any:
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    if isinstance(obj, bytes | bytearray):
        return obj.decode("utf-8", errors="replace")
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    return repr(obj)
