"""What the OpenAI-compatible server and the MCP server share: limit clamping, the test-only
scripted model spec, progress lines from events, and a Result's spend summary."""

from __future__ import annotations

from typing import Any

from recursa.base.types import Event, ModelClient, Result
from recursa.core.budget import Budget
from recursa.obs.progress import MapState

LIMIT_FIELDS = tuple(Budget.model_fields)
REPLAY_FILE_PREFIX = "replay-file:"


class RequestError(ValueError):
    """A request that cannot be served as asked (bad field, limit, sub-model...)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


# ---------------------------------------------------------------- exposure
def unconfined_on_network(sandbox: object, host: str, is_loopback: bool) -> str | None:
    """Why serving `sandbox` on `host` is refused, or None. A sandbox whose kind does not
    isolate (recursa.sandbox.kinds: `isolates=False`, e.g. limits, inprocess) confines nothing
    but resources: model-written code runs as the server's user, with its files, network and
    environment. On a loopback address only that user can reach it; beyond, any client could
    run code as that user."""
    from recursa.sandbox.kinds import kind_isolates, kind_names
    if is_loopback or not isinstance(sandbox, str) or kind_isolates(sandbox) is not False:
        return None
    return (f"refusing to serve sandbox {sandbox!r} on {host}: it does not isolate "
            "model-written code (it runs as this user, with this user's files, network and "
            "keys), so every client that can reach the address could run code as you. Use an "
            f"isolating sandbox ({', '.join(kind_names(isolates=True))}), or serve on 127.0.0.1")


# ---------------------------------------------------------------- models
def load_model(spec: str | ModelClient | None) -> str | ModelClient | None:
    """A model spec as RLM() takes it, plus one spec only the servers know:

    `replay-file:PATH` (TEST-ONLY) — a scripted model read from a JSON file: either a list of
    responses used once each, in order, or `{"cycle": [...]}`, repeated forever. It exists so
    a test can drive a real `recursa serve` / `recursa mcp` *process* without a model; it
    costs nothing and answers nothing of substance.
    """
    if not isinstance(spec, str) or not spec.startswith(REPLAY_FILE_PREFIX):
        return spec
    from recursa.models.replay import load_replay_file
    return load_replay_file(spec)


# ---------------------------------------------------------------- limits
def clamp_limits(caps: Budget, requested: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """Per-request limits, each at most the server's cap (requests can only tighten).

    Returns (limits for acompletion, names of the limits that were lowered to the cap).
    """
    if not requested:
        return {}, []
    out: dict[str, Any] = {}
    clamped: list[str] = []
    cap_values = caps.model_dump()
    for name, value in requested.items():
        if name not in LIMIT_FIELDS:
            raise RequestError(f"unknown limit {name!r}; known: {', '.join(LIMIT_FIELDS)}",
                               param=f"recursa.{name}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestError(f"limit {name!r} must be a number", param=f"recursa.{name}")
        cap = cap_values[name]
        if cap is not None and value > cap:
            value = cap
            clamped.append(name)
        out[name] = value
    try:
        Budget.model_validate({**cap_values, **out})
    except ValueError as e:
        raise RequestError(f"invalid limits: {e}", param="recursa") from e
    return out, clamped


# ---------------------------------------------------------------- spend
def spend(result: Result) -> dict[str, Any]:
    """Tokens of the whole run (root, sub-calls, children) and its cost."""
    inp = sum(r.usage.input_tokens for r in result.usage.values())
    out = sum(r.usage.output_tokens for r in result.usage.values())
    cached = sum(r.usage.cached_tokens for r in result.usage.values())
    return {"input_tokens": inp, "output_tokens": out, "cached_tokens": cached,
            "total_tokens": inp + out, "cost_usd": result.cost_usd}


def summary(result: Result) -> dict[str, Any]:
    """The run's outcome and spend, for a response's `recursa` field or an MCP tool result."""
    return {"status": result.status, "ready": result.ready, "turns": result.turns,
            "subcalls": result.subcalls, "elapsed_s": result.elapsed_s,
            "limit": result.limit, "error": result.error, "run_id": result.run_id,
            **spend(result),
            "usage_by_role": {k: {"calls": v.calls, **v.usage.model_dump(),
                                  "cost_usd": v.cost_usd} for k, v in result.usage.items()}}


# ---------------------------------------------------------------- progress
class Progress:
    """Turns events into short progress lines and keeps running totals of the spend."""

    def __init__(self) -> None:
        self.tokens = 0
        self.cost_usd = 0.0
        self.turns = 0
        self.subcalls = 0
        self.written = 0          # characters of the root's current reply streamed so far
        self.mid_line = False     # the streamed text did not end with a newline

    def reasoning(self, item: dict[str, Any]) -> str:
        """An item as `reasoning_content` text: a streamed piece of the root's reply as it is,
        a progress line on a line of its own."""
        if item["phase"] == "delta":
            text = item["text"]
            if item.get("restart"):
                text = "\n[the model's reply restarted: its stream was cut]\n" + text
            self.mid_line = not text.endswith("\n")
            return text
        text = ("\n" if self.mid_line else "") + item["line"] + "\n"
        self.mid_line = False
        return text

    def _delta(self, ev: Event) -> dict[str, Any] | None:
        if ev.depth != 0:
            return None
        text, offset = str(ev.data.get("text", "")), int(ev.data.get("offset", 0))
        restart = offset == 0 and self.written > 0
        self.written = offset + len(text)
        return {"line": "", "text": text, "offset": offset, "restart": restart, "kind": ev.kind,
                "phase": "delta", "depth": 0, "turns": self.turns, "subcalls": self.subcalls,
                "tokens": self.tokens, "cost_usd": round(self.cost_usd, 6)}

    def _add(self, data: dict[str, Any]) -> None:
        u = data.get("usage") or {}
        self.tokens += int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))
        self.cost_usd += float(data.get("cost_usd") or 0.0)

    def feed(self, ev: Event, *, deltas: bool = False) -> dict[str, Any] | None:
        """A progress item `{"line", "kind", "phase", "depth", "tokens", "cost_usd", ...}`,
        or None for events not worth showing. With `deltas`, a piece of the root's reply as it
        is written is an item too, with phase 'delta', `text` and `offset` (and `restart` when
        a retried stream started the reply again)."""
        if ev.phase == "delta":
            return self._delta(ev) if deltas else None
        d = ev.data
        pad = "  " * ev.depth
        line: str | None = None
        if ev.kind == "turn" and ev.phase == "start":
            line = "final answer turn" if d.get("last") else f"turn {d.get('turn', '?')}"
            if ev.depth == 0:
                self.written = 0
            if ev.depth == 0 and not d.get("last"):
                self.turns = int(d.get("turn", self.turns + 1))
        elif ev.kind == "turn" and ev.phase == "end":
            self._add(d)
            if d.get("error"):
                line = f"model call failed: {d['error']}"
            elif "blocks" in d:
                line = f"model wrote {d['blocks']} code block(s)"
        elif ev.kind == "cell" and ev.phase == "end":
            state = "timed out" if d.get("timed_out") else "error" if d.get("error") else "ok"
            line = f"code ran in {float(d.get('elapsed_s') or 0):.2f}s ({state})"
        elif ev.kind == "subcall" and ev.phase == "end":
            self.subcalls += 1
            self._add(d)
            if d.get("error"):
                line = f"sub-call failed: {str(d['error'])[:200]}"
            else:
                u = d.get("usage") or {}
                n = int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0))
                line = f"sub-call to {d.get('model', '?')}: {n} tokens"
        elif ev.kind == "combinator" and ev.phase == "update":
            line = MapState(str(d.get("op", "map")), int(d.get("total", 0)),
                            int(d.get("done", 0)), d.get("rate_per_s"), d.get("eta_s")).line()
        elif ev.kind == "child" and ev.phase == "start":
            line = "child RLM started"
        elif ev.kind == "child" and ev.phase == "end":
            line = f"child RLM finished ({d.get('status', '?')})"
        elif ev.kind == "error":
            line = f"error: {str(d.get('message') or d)[:200]}"
        if line is None:
            return None
        return {"line": pad + line, "kind": ev.kind, "phase": ev.phase, "depth": ev.depth,
                "turns": self.turns, "subcalls": self.subcalls, "tokens": self.tokens,
                "cost_usd": round(self.cost_usd, 6)}
