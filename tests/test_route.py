"""Routing (recursa.core.route): an input that fits goes to the root model directly, one plain
call through the run's ledger and tracer; a larger one runs the REPL loop. Scripted models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recursa.base.images import Image
from recursa.base.types import ContextError
from recursa.core.rlm import RLM
from recursa.core.route import DEFAULT_THRESHOLD, decide, threshold_for
from recursa.frontend.options import RLMOptions
from recursa.models.replay import ReplayClient
from recursa.sandbox import make_sandbox


class Boxes:
    """A sandbox factory that counts the sandboxes it made."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> Any:
        self.made += 1
        return make_sandbox("inprocess")


def run_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events (after its header line)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in lines if e.get("kind") != "header"]


def test_short_input_takes_the_direct_path(tmp_path: Path) -> None:
    model = ReplayClient(["Paris"], context_window=8192, cost_usd=0.01)
    boxes = Boxes()
    trace = tmp_path / "t.jsonl"
    res = RLM(model=model, route="auto", sandbox=boxes, trace_path=trace,
              max_cost_usd=1.0).completion("Capital of France?", "France's capital is Paris.")
    assert (res.route, res.answer, res.status, res.turns) == ("direct", "Paris", "final", 1)
    assert len(model.calls) == 1 and boxes.made == 0          # one call, no sandbox
    prompt = model.calls[0][-1]["content"]
    assert "France's capital is Paris." in prompt and "Capital of France?" in prompt
    # spend counted as for any run
    assert res.cost_usd == pytest.approx(0.01) and res.usage["root"].calls == 1
    start = run_events(trace)[0]
    assert start["kind"] == "run" and start["phase"] == "start"
    assert start["data"]["route"]["path"] == "direct"
    assert start["data"]["route"]["threshold"] == 4096      # half the declared window
    assert [e["kind"] for e in run_events(trace)][-2:] == ["final", "run"]


def test_long_input_runs_the_loop(tmp_path: Path) -> None:
    model = ReplayClient(["```repl\nFINAL(str(len(context)))\n```"], context_window=2048)
    boxes = Boxes()
    trace = tmp_path / "t.jsonl"
    context = "lorem ipsum dolor " * 1000                       # ~4,500 tokens
    res = RLM(model=model, route="auto", sandbox=boxes, trace_path=trace).completion(
        "How long is it?", context)
    assert (res.route, res.answer) == ("rlm", str(len(context)))
    assert boxes.made == 1
    route = run_events(trace)[0]["data"]["route"]
    assert route["path"] == "rlm" and "exceed the threshold of 1,024" in route["reason"]


def test_default_route_is_the_loop() -> None:
    model = ReplayClient(["```repl\nFINAL('x')\n```"], context_window=8192)
    boxes = Boxes()
    res = RLM(model=model, sandbox=boxes).completion("q?", "short")
    assert res.route == "rlm" and boxes.made == 1


def test_limits_hold_on_the_direct_path() -> None:
    model = ReplayClient(["never sent"], context_window=8192)
    res = RLM(model=model, route="auto", sandbox=Boxes(), max_tokens=5).completion(
        "Capital of France?", "France's capital is Paris.")
    assert (res.route, res.status, res.limit) == ("direct", "limit", "max_tokens")
    assert model.calls == []


def test_threshold_given_in_tokens_and_unknown_window() -> None:
    unknown = ReplayClient(["a"])
    assert threshold_for(unknown) == DEFAULT_THRESHOLD
    assert threshold_for(unknown, 100) == 100
    assert threshold_for(ReplayClient(context_window=1000), 5000) == 1000   # never past it
    text = "word " * 400                                         # ~500 tokens + 1,024 reserve
    assert decide("auto", "q?", text, client=unknown).path == "direct"
    small = decide("auto", "q?", text, client=unknown, threshold=1200)
    assert small.path == "rlm" and small.threshold == 1200
    reserve = decide("auto", "q?", text, client=unknown, options={"max_tokens": 100},
                     threshold=1200)
    assert reserve.path == "direct"                              # a smaller reply reserve fits


def test_what_cannot_be_one_prompt_runs_the_loop(tmp_path: Path) -> None:
    client = ReplayClient(context_window=8192)
    png = Image(data=b"\x89PNG", format="png", width=1, height=1)
    routed = decide("auto", "q?", {"pic": png, "note": "hi"}, client=client)
    assert routed.path == "rlm" and "images" in routed.reason
    with pytest.raises(ContextError, match="route='direct' needs a context"):
        decide("direct", "q?", {"pic": png}, client=client)
    assert decide("auto", "q?", "short", client=client, sources=True).path == "rlm"
    big = tmp_path / "big.txt"
    big.write_text("x" * 200_000)
    assert "over" in decide("auto", "q?", big, client=client).reason


def test_a_small_file_and_a_dict_go_direct(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("The meeting is on Tuesday.")
    model = ReplayClient(["Tuesday", "Bob"], context_window=8192)
    rlm = RLM(model=model, route="auto", sandbox=Boxes())
    assert rlm.completion("When is the meeting?", f).route == "direct"
    assert "The meeting is on Tuesday." in model.calls[0][-1]["content"]
    res = rlm.completion("Who?", {"a.txt": "Bob wrote it", "meta": {"n": 1}})
    assert res.route == "direct"
    prompt = model.calls[1][-1]["content"]
    assert "### a.txt\nBob wrote it" in prompt and '### meta\n{"n": 1}' in prompt


def test_typed_answer_on_the_direct_path() -> None:
    model = ReplayClient(['{"day": "Tuesday"}'], context_window=8192)
    schema = {"type": "object", "properties": {"day": {"type": "string"}},
              "required": ["day"]}
    res = RLM(model=model, route="direct", sandbox=Boxes()).completion(
        "When?", "The meeting is on Tuesday.", output=schema)
    assert res.parsed == {"day": "Tuesday"} and res.output_error is None
    assert "JSON schema" in model.calls[0][-1]["content"]


def test_route_for_says_the_path_without_running() -> None:
    rlm = RLM(model=ReplayClient(context_window=4096), route="auto")
    assert rlm.route_for("q?", "short").path == "direct"
    assert rlm.route_for("q?", "long text " * 2000).path == "rlm"


def test_sessions_are_never_routed() -> None:
    model = ReplayClient(["```repl\nFINAL('x')\n```"], context_window=8192)
    with RLM(model=model, route="auto", sandbox=Boxes()).session("short") as s:
        assert s.completion("q?").route == "rlm"


@pytest.mark.parametrize("kw, needle", [
    ({"route": "fast"}, "route must be one of rlm, direct, auto"),
    ({"route_threshold": 0}, "route_threshold must be a whole number"),
    ({"route_threshold": 0.5}, "route_threshold must be a whole number"),
])
def test_bad_values_are_clear_errors(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        RLM(model=ReplayClient(), **kw)


def test_cli_options_carry_the_route() -> None:
    import argparse
    p = argparse.ArgumentParser()
    RLMOptions.add_to(p)
    kw = RLMOptions.from_args(p.parse_args(["--route", "auto", "--route-threshold", "2000"])
                              ).rlm_kwargs()
    assert kw["route"] == "auto" and kw["route_threshold"] == 2000
    assert "route" not in RLMOptions.from_args(p.parse_args([])).rlm_kwargs()
    with pytest.raises(SystemExit):
        p.parse_args(["--route", "fast"])


def test_plain_run_says_which_path_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`recursa run --route auto` without --json: the end line on stderr names the path."""
    from recursa.cli import main
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"cycle": ["```repl\nFINAL('loop')\n```"]}))
    ctx = tmp_path / "c.txt"
    ctx.write_text("a short note\n")
    base = ["run", "What is it?", "-c", str(ctx), "--model", f"replay-file:{script}",
            "--sandbox", "inprocess"]

    def end_line(*extra: str) -> str:
        assert main([*base, *extra]) == 0
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("status ")]
        assert len(lines) == 1
        return lines[0]

    assert "  route direct" in end_line("--route", "auto")
    assert "  route rlm" in end_line("--route", "auto", "--route-threshold", "1")
    assert "route" not in end_line()                  # not routed: nothing to say
