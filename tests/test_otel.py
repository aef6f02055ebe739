"""OTelSink: a run becomes spans with parent/child links and GenAI usage attributes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from recursa.core.rlm import RLM  # noqa: E402
from recursa.demos.synthetic import demo_run  # noqa: E402
from recursa.models.replay import ReplayClient  # noqa: E402
from recursa.obs.otel import OTelSink  # noqa: E402
from recursa.obs.trace import Tracer, load  # noqa: E402


@pytest.fixture
def exporter():
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    return provider, exp


def _run_demo(provider, tmp_path: Path, **kw):
    """The scripted demo run (llm_batch of 8 + a child RLM), with an OTelSink attached."""
    return demo_run(tmp_path / "t.jsonl", context_size=20_000, sinks=[OTelSink(provider, **kw)])


def test_spans_tree_and_usage(exporter, tmp_path: Path):
    provider, exp = exporter
    res = _run_demo(provider, tmp_path)
    spans = exp.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    names = [s.name for s in spans]
    assert names.count("recursa.run") == 1 and names.count("recursa.child") == 1
    assert names.count("recursa.subcall") == res.subcalls == 9
    assert names.count("recursa.turn") == res.turns + 2      # + the child's two turns
    trace_ids = {s.context.trace_id for s in spans}
    assert len(trace_ids) == 1                                 # one trace for the whole tree

    def parent(s):
        return by_id[s.parent.span_id] if s.parent else None

    run = next(s for s in spans if s.name == "recursa.run")
    assert run.parent is None
    assert all(parent(s).name == "recursa.run" for s in spans
               if s.name == "recursa.turn" and s.attributes["recursa.depth"] == 0)
    assert all(parent(s).name == "recursa.cell" for s in spans if s.name == "recursa.subcall")
    child = next(s for s in spans if s.name == "recursa.child")
    assert parent(child).name == "recursa.cell" and parent(parent(child)).name == "recursa.turn"
    assert any(parent(s) is child for s in spans if s.name == "recursa.turn")

    sub = next(s for s in spans if s.name == "recursa.subcall")
    a = sub.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "replay:small"
    assert a["gen_ai.response.model"] == "small-model"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert "recursa.prompt" not in a                  # no content unless asked for
    # usage on the spans adds up to the Result's
    tin = sum(s.attributes.get("gen_ai.usage.input_tokens", 0) for s in spans)
    assert tin == sum(u.usage.input_tokens for u in res.usage.values())
    assert run.attributes["recursa.final.status"] == "final"
    assert run.attributes["recursa.status"] == "final"
    assert [e.name for e in run.events][-1] == "recursa.final"
    # times come from the events: the batch's sub-calls overlap
    subs = [s for s in spans if s.name == "recursa.subcall" and parent(s) is parent(sub)]
    assert max(s.start_time for s in subs) < min(s.end_time for s in subs)
    assert run.start_time <= min(s.start_time for s in spans)
    # the same run, read back from its trace, has the same shape
    assert load(tmp_path / "t.jsonl").totals.subcalls == names.count("recursa.subcall")


def test_capture_content(exporter, tmp_path: Path):
    provider, exp = exporter
    _run_demo(provider, tmp_path, capture_content=True)
    cell = next(s for s in exp.get_finished_spans() if s.name == "recursa.cell")
    assert "print(len(context))" in cell.attributes["recursa.code"]


def test_errors_and_unfinished_spans(exporter):
    provider, exp = exporter
    sink = OTelSink(provider)
    tr = Tracer([sink], run_id="r")
    run = tr.emit("run", phase="start", model="m")
    turn = tr.emit("turn", phase="start", parent=run, turn=1)
    cell = tr.emit("cell", phase="start", parent=turn, index=0, code="x")
    s = tr.emit("subcall", phase="start", parent=cell, model="m")
    tr.emit("subcall", id=s, phase="end", parent=cell, error="Error: boom")
    tr.close()                                    # killed: run, turn and cell never ended
    spans = {sp.name: sp for sp in exp.get_finished_spans()}
    assert spans["recursa.subcall"].status.status_code == StatusCode.ERROR
    assert "boom" in spans["recursa.subcall"].status.description
    assert {"recursa.run", "recursa.turn", "recursa.cell"} <= set(spans)
    assert spans["recursa.run"].status.status_code == StatusCode.ERROR


def test_sink_alongside_jsonl(exporter, tmp_path: Path):
    provider, exp = exporter
    client = ReplayClient(["```repl\nFINAL('ok')\n```"])
    res = RLM(model=client, sandbox="inprocess", sinks=[OTelSink(provider)],
              trace_path=tmp_path / "t.jsonl").completion("q", context="abc")
    assert res.answer == "ok"
    assert {s.name for s in exp.get_finished_spans()} == {"recursa.run", "recursa.turn",
                                                          "recursa.cell"}
    assert load(tmp_path / "t.jsonl").totals.turns == 1
