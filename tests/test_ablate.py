"""Ablation reporting: confidence intervals, the table, the chart, and the CLI end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recursa.cli import main
from recursa.envs.ablate import mean_ci, summarize, svg_chart, table, write_report
from recursa.envs.rollout import Rollout, read_results, write_results


def _ro(variant: str, seed: int, reward: float, **kw: float) -> Rollout:
    return Rollout(env="oolong", variant=variant, seed=seed, instance=f"i{seed}", reward=reward,
                   status="final", **kw)  # type: ignore[arg-type]


def test_mean_ci() -> None:
    m, h = mean_ci([1.0, 0.0, 1.0, 0.0])
    assert m == 0.5 and h == pytest.approx(3.182 * math.sqrt(1 / 3) / 2)
    assert mean_ci([0.7])[0] == 0.7 and math.isnan(mean_ci([0.7])[1])
    assert math.isnan(mean_ci([])[0])
    m, h = mean_ci([1.0] * 100)
    assert m == 1.0 and h == 0.0


def test_summary_table_and_chart(tmp_path: Path) -> None:
    rs = [_ro("llm", 0, 0.0, elapsed_s=1.0, root_input_tokens=1000, root_output_tokens=10),
          _ro("llm", 1, 1.0, elapsed_s=3.0, root_input_tokens=3000, root_output_tokens=30),
          _ro("rlm", 0, 1.0, elapsed_s=10.0, root_input_tokens=200, sub_input_tokens=5000,
              sub_output_tokens=50, subcalls=4, tool_calls=2),
          _ro("rlm", 1, 1.0, elapsed_s=12.0, root_input_tokens=400, sub_input_tokens=7000,
              sub_output_tokens=70, subcalls=6)]
    stats = summarize(rs, ["rlm", "llm", "rlm_tips"])
    assert [s.variant for s in stats] == ["rlm", "llm"]     # order kept, missing skipped
    rlm, llm = stats
    assert (rlm.reward, rlm.reward_ci, rlm.subcalls, rlm.tool_calls) == (1.0, 0.0, 5.0, 1.0)
    assert (rlm.root_in, rlm.sub_in, rlm.sub_out, rlm.wall_s) == (300, 6000, 60, 11.0)
    assert llm.reward == 0.5 and llm.reward_ci == pytest.approx(12.706 * math.sqrt(0.5) / math.sqrt(2))
    md = table(stats)
    assert md.splitlines()[0].startswith("| variant | n | errors | reward (mean ± 95% CI)")
    assert "| rlm | 2 | 0 | 1.00 ± 0.00 | 300 | 0 | 6,000 | 60 | 5.0 | 1.0 | 11.0 ± 12.7 |" in md
    svg = svg_chart(stats, "t <&>")
    assert svg.startswith("<svg") and svg.count("<rect") == 1 + 4 * 2 and "t &lt;&amp;&gt;" in svg
    path = write_report(rs, tmp_path, env="oolong", command="recursa ablate ...")
    text = path.read_text()
    assert "recursa ablate ..." in text and "ablation.svg" in text and "| llm | 1 | 1.00 |" in text
    write_results(rs, tmp_path / "r.jsonl")
    assert read_results(tmp_path / "r.jsonl") == rs


def test_ablate_cli_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from recursa.envs import rollout as rollout_mod
    from recursa.models import ReplayClient

    def script(messages: list[dict[str, str]]) -> str:
        if messages[0]["content"].startswith("You answer a query"):
            return "```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"
        return "not a copy"

    real = rollout_mod.run_rollout

    async def fake(env, variant, seed, *, model, **kw):  # type: ignore[no-untyped-def]
        return await real(env, variant, seed, model=ReplayClient(script), **kw)

    monkeypatch.setattr(rollout_mod, "run_rollout", fake)
    out = tmp_path / "abl"
    args = ["ablate", "--env", "verbatim_copy", "--variants", "llm,rlm,rlm_tips", "-n", "2",
            "--length", "40", "--model", "replay:", "--sandbox", "inprocess", "--out", str(out),
            "--concurrency", "3"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| llm | 2 | 0 | 0.00 ± 0.00 |" in printed and "| rlm_tips | 2 | 0 | 1.00 ± 0.00 |" in printed
    assert (out / "report.md").exists() and (out / "ablation.svg").exists()
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and len(list((out / "traces").glob("*.jsonl"))) == 6
    assert len({r["key"] for r in rows}) == 6
    # a rerun resumes: every rollout is already in results.jsonl, the report is the same
    assert main(args) == 0
    again = capsys.readouterr()
    assert "0 run, 6 already" in again.err and again.out == printed
    assert (out / "results.jsonl").read_text().count("\n") == 6
    assert main(["ablate", "--env", "oolong", "--variants", "llm,zzz", "--model", "replay:",
                 "--out", str(out / "bad")]) == 2


def test_ablate_exits_1_and_says_why_when_rollouts_failed(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # `replay:` with no script fails every model call: each rollout is an error row
    args = ["ablate", "--env", "verbatim_copy", "--variants", "rlm", "-n", "2", "--lengths",
            "40", "--model", "replay:", "--sandbox", "inprocess", "--out", str(tmp_path / "a"),
            "--max-iterations", "2"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "2 of 2 rollouts failed" in err and "--retry-errors" in err
    assert main([*args[:-2], "--lengths", "40,80"]) == 2
    assert "ablate takes one length" in capsys.readouterr().err
