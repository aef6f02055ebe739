"""SFT export: the rebuilt root conversation is exactly what the root model saw; filtering,
tip stripping, sub-call examples, de-duplication; and traces from real local-model runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recursa.cli import main
from recursa.envs import get_env, run_rollout
from recursa.envs.sft import export_sft, root_messages
from recursa.models import ReplayClient
from recursa.obs.trace import load

REAL_TRACES = Path(__file__).resolve().parents[1] / "docs" / "ablation"

ROOT_SCRIPT = ["```repl\nprint(len(context))\n```",
               "no code this time",
               "```repl\nx = llm_query('copy this: ' + context[:20])\nprint(x)\n```\n"
               "```repl\nprint('two')\n```",
               "```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"]


async def _run(tmp_path: Path, variant: str = "rlm_tips", script: list[str] | None = None,
               seed: int = 0) -> tuple[ReplayClient, str]:
    root = ReplayClient(list(script or ROOT_SCRIPT))
    sub = ReplayClient(["sub says hi"] * 5)
    ro = await run_rollout(get_env("verbatim_copy"), variant, seed, model=root, sub_model=sub,
                           length_tokens=40, trace_dir=tmp_path, sandbox="inprocess")
    assert ro.trace_path
    return root, ro.trace_path


async def test_root_conversation_is_rebuilt_exactly(tmp_path: Path) -> None:
    root, path = await _run(tmp_path)
    msgs = root_messages(load(path))
    assert msgs is not None
    seen = root.calls[-1] + [{"role": "assistant", "content": ROOT_SCRIPT[-1]}]
    assert msgs == seen


async def test_export_filters_strips_and_dedups(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    await _run(traces)
    await _run(traces)                                  # identical run: a duplicate
    await _run(traces, script=["```repl\nFINAL('nope')\n```"])   # reward 0
    out = tmp_path / "data.jsonl"
    st = export_sft([traces], out, min_reward=1.0, strip=True, subcalls=True, meta=True)
    assert (st.runs, st.kept_runs, st.low_reward, st.unscored) == (3, 2, 1, 0)
    assert (st.root_examples, st.sub_examples, st.duplicates) == (1, 1, 2)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    root_row = next(r for r in rows if r["meta"]["kind"] == "root")
    assert root_row["meta"]["reward"] == 1.0 and root_row["meta"]["variant"] == "rlm_tips"
    system = root_row["messages"][0]["content"]
    assert "<tips>" not in system and "The text to copy" not in system
    sub_row = next(r for r in rows if r["meta"]["kind"] == "sub")
    assert sub_row["messages"][1] == {"role": "assistant", "content": "sub says hi"}
    # without --strip-tips the tips stay; without --meta only "messages"
    st = export_sft([traces], out, min_reward=0.0, strip=False)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert st.kept_runs == 3 and all(set(r) == {"messages"} for r in rows)
    assert any("<tips>" in r["messages"][0]["content"] for r in rows)


async def test_llm_and_unscored_runs(tmp_path: Path) -> None:
    inst = get_env("verbatim_copy").instance(0, 40)
    ro = await run_rollout("verbatim_copy", "llm", 0, model=ReplayClient([str(inst.gold)]),
                           length_tokens=40, trace_dir=tmp_path)
    assert ro.reward == 1.0
    from recursa import RLM
    RLM(model=ReplayClient(["```repl\nFINAL('x')\n```"]), sandbox="inprocess",
        trace_dir=tmp_path).completion("q", context="c")          # no reward recorded
    out = tmp_path / "d.jsonl"
    st = export_sft([tmp_path], out, min_reward=1.0)
    assert (st.kept_runs, st.unscored) == (1, 1)
    [row] = [json.loads(x) for x in out.read_text().splitlines()]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][2]["content"] == str(inst.gold)
    st = export_sft([tmp_path], out, min_reward=1.0, include_unscored=True)
    assert st.kept_runs == 2


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export-sft", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "t").mkdir()
    assert main(["export-sft", str(tmp_path / "t"), "--out", str(tmp_path / "o.jsonl"),
                 "--min-reward", "0.5", "--strip-tips", "--subcalls"]) == 0
    assert (tmp_path / "o.jsonl").read_text() == ""


def _real_trace_dirs() -> list[Path]:
    return sorted(p for p in REAL_TRACES.glob("*/traces") if any(p.glob("*.jsonl")))


@pytest.mark.skipif(not _real_trace_dirs(), reason="no committed ablation traces")
def test_export_on_real_local_model_traces(tmp_path: Path) -> None:
    out = tmp_path / "real.jsonl"
    st = export_sft(_real_trace_dirs(), out, min_reward=0.0, strip=True, subcalls=True,
                    meta=True)
    assert st.runs >= 3 and st.unscored == 0 and st.root_examples >= 1
    for line in out.read_text().splitlines():
        row = json.loads(line)
        msgs = row["messages"]
        assert msgs[-1]["role"] == "assistant" and msgs[-1]["content"]
        assert all("<tips>" not in m["content"] for m in msgs)
        if row["meta"]["kind"] == "root":
            roles = [m["role"] for m in msgs]
            assert roles[:2] == ["system", "user"]
            if roles[-3:] == ["user", "user", "assistant"]:
                # before the loop merged them, the last-turn request followed the last feedback
                # as a second user message: the export keeps what was really sent
                roles = roles[:-2] + ["assistant"]
            assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False))
    high = export_sft(_real_trace_dirs(), tmp_path / "hi.jsonl", min_reward=1.0)
    assert high.kept_runs + high.low_reward + high.unusable == st.runs


def test_export_of_a_compacted_run_keeps_every_reply(tmp_path: Path) -> None:
    from recursa import RLM
    script = [f"```repl\nprint(context[{i * 900}:{(i + 1) * 900}])\n```" for i in range(8)]
    script.append("```repl\nFINAL('done')\n```")
    root = ReplayClient(list(script))
    root.context_window = 3000          # like a local model's client: the loop must compact
    RLM(model=root, sub_model=ReplayClient(["s"]), sandbox="inprocess",
        trace_dir=tmp_path / "t").completion("q", context="x" * 20_000)
    run = load(next((tmp_path / "t").glob("*.jsonl")))
    compactions = sum("compaction" in p.data for n in run.walk() for p in n.points)
    assert compactions >= 2
    assert root_messages(run) == root.calls[-1] + [{"role": "assistant", "content": script[-1]}]
    out = tmp_path / "d.jsonl"
    st = export_sft([tmp_path / "t"], out, min_reward=0.0, include_unscored=True)
    assert st.root_examples == compactions + 1
    rows = [json.loads(x)["messages"] for x in out.read_text().splitlines()]
    assert {m["content"] for r in rows for m in r if m["role"] == "assistant"} == set(script)
