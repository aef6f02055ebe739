"""OpenTelemetry export: a TraceSink that turns a run's events into spans.

    from recursa.obs.otel import OTelSink
    RLM(model=..., sinks=[OTelSink()])          # uses the global TracerProvider

Spans: `recursa.run` > `recursa.turn` > `recursa.cell` > `recursa.subcall` / `recursa.child`
(a child RLM has turns of its own under it), with start and end times taken from the events, so
parallel sub-calls overlap in any trace UI. Model calls (turns and sub-calls) carry the GenAI
semantic-convention attributes (`gen_ai.operation.name`, `gen_ai.request.model`,
`gen_ai.response.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`); recursa's
own figures are under `recursa.*`. Prompts, code and outputs are left out unless
`capture_content=True`: spans often travel to shared backends, the trace file does not.

Needs the `otel` extra (`pip install 'recursa[otel]'`); importing this module does not.
"""

from __future__ import annotations

import threading
from typing import Any

from recursa.base.extras import MissingExtra
from recursa.base.types import Event

_CONTENT_FIELDS = ("query", "text", "code", "output", "prompt", "response", "answer", "error",
                   "description")
_MAX_ATTR_CHARS = 8192


def _otel() -> Any:
    try:
        from opentelemetry import trace
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise MissingExtra("otel", "recursa.obs.otel", module="opentelemetry") from e
    return trace


def _ns(t: float) -> int:
    return int(t * 1e9)


class OTelSink:
    """A TraceSink that creates one span per run, child RLM, turn, cell and sub-call.

    `tracer_provider`: where spans go (default: the global provider). Point events become span
    events on their parent (the final answer's status also becomes attributes of its run).
    Spans still open at `close()` (a run that was cut short) are ended with an error status.
    """

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False,
                 tracer_name: str = "recursa"):
        trace = _otel()
        self._trace = trace
        from opentelemetry.trace import Status, StatusCode
        self._Status, self._StatusCode = Status, StatusCode
        provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer(tracer_name)
        self.capture_content = capture_content
        self._spans: dict[str, Any] = {}
        self._models: dict[str, str] = {}     # run/child span id -> its root model
        self._lock = threading.Lock()

    # ------------------------------------------------------------ TraceSink
    def emit(self, event: Event) -> None:
        with self._lock:
            if event.phase == "start":
                self._start(event)
            elif event.phase == "end":
                self._end(event)
            elif event.phase == "update":
                pass          # the end event repeats what an update carries
            else:
                self._point(event)

    def close(self) -> None:
        with self._lock:
            for span in self._spans.values():
                span.set_status(self._Status(self._StatusCode.ERROR, "run ended before this span"))
                span.end()
            self._spans.clear()

    # ------------------------------------------------------------ events
    def _start(self, ev: Event) -> None:
        d = ev.data
        parent = self._spans.get(ev.parent or "")
        ctx = self._trace.set_span_in_context(parent) if parent is not None else None
        attrs: dict[str, Any] = {"recursa.kind": ev.kind, "recursa.id": ev.id,
                                 "recursa.run_id": ev.run_id, "recursa.depth": ev.depth}
        if ev.kind in ("run", "child"):
            self._models[ev.id] = str(d.get("model") or "")
            attrs["gen_ai.request.model"] = self._models[ev.id]
            for k, v in (d.get("budget") or {}).items():
                if v is not None and isinstance(v, int | float | str | bool):
                    attrs[f"recursa.core.budget.{k}"] = v
        elif ev.kind == "turn":
            attrs["gen_ai.operation.name"] = "chat"
            attrs["gen_ai.request.model"] = self._models.get(ev.parent or "", "")
            if d.get("turn") is not None:
                attrs["recursa.turn"] = int(d["turn"])
            attrs["recursa.last_turn"] = bool(d.get("last"))
        elif ev.kind == "cell":
            attrs["recursa.cell.index"] = int(d.get("index") or 0)
        elif ev.kind == "subcall":
            attrs["gen_ai.operation.name"] = "chat"
            attrs["gen_ai.request.model"] = str(d.get("model") or "")
            if d.get("prompt_chars") is not None:
                attrs["recursa.prompt_chars"] = int(d["prompt_chars"])
        attrs.update(self._content(d))
        span = self._tracer.start_span(f"recursa.{ev.kind}", context=ctx, attributes=attrs,
                                       start_time=_ns(ev.t))
        self._spans[ev.id] = span

    def _end(self, ev: Event) -> None:
        span = self._spans.pop(ev.id, None)
        if span is None:      # an end without a start (the sink joined mid-run): make it now
            self._start(ev)
            span = self._spans.pop(ev.id)
        d = ev.data
        attrs: dict[str, Any] = {}
        usage = d.get("usage")
        if usage:
            attrs["gen_ai.usage.input_tokens"] = int(usage.get("input_tokens") or 0)
            attrs["gen_ai.usage.output_tokens"] = int(usage.get("output_tokens") or 0)
            if usage.get("cached_tokens"):
                attrs["recursa.usage.cached_tokens"] = int(usage["cached_tokens"])
        if d.get("model") and ev.kind in ("turn", "subcall"):
            attrs["gen_ai.response.model"] = str(d["model"])
        for key in ("cost_usd", "latency_s", "elapsed_s", "blocks", "turns", "subcalls",
                    "tokens", "status", "timed_out", "restarted", "ready"):
            v = d.get(key)
            if v is not None and isinstance(v, int | float | str | bool):
                attrs[f"recursa.{key}"] = v
        attrs.update(self._content(d))
        span.set_attributes(attrs)
        err = d.get("error")
        if err or d.get("status") == "error" or d.get("timed_out"):
            msg = err if isinstance(err, str) else str(d.get("status") or "error")
            span.set_status(self._Status(self._StatusCode.ERROR, msg[:500]))
        span.end(end_time=_ns(ev.t))

    def _point(self, ev: Event) -> None:
        span = self._spans.get(ev.parent or "")
        if span is None:
            return
        d = ev.data
        attrs: dict[str, Any] = {k: v for k, v in d.items()
                                 if isinstance(v, int | float | bool) or
                                 (isinstance(v, str) and k not in _CONTENT_FIELDS)}
        attrs.update(self._content(d))
        span.add_event(f"recursa.{ev.kind}", attributes=attrs, timestamp=_ns(ev.t))
        if ev.kind == "final":
            span.set_attributes({f"recursa.final.{k}": v for k, v in d.items()
                                 if k in ("status", "ready", "limit") and v is not None})

    def _content(self, d: dict[str, Any]) -> dict[str, str]:
        if not self.capture_content:
            return {}
        return {f"recursa.{k}": str(d[k])[:_MAX_ATTR_CHARS] for k in _CONTENT_FIELDS
                if d.get(k) and isinstance(d[k], str)}
