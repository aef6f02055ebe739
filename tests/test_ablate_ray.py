"""The ablation runner's executor seam: `run_rollout_spec` is a picklable spec -> row function,
and `RayExecutor(fn=run_rollout_spec)` on a local Ray instance started by the test (2 CPUs, no
dashboard) gives the same rows, resume and report as the local executor."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers_scripted import COPY
from ray_local import local_runtime_env
from recursa.cli import main
from recursa.envs.rollout import (
    LocalRolloutExecutor,
    failed_rollout,
    make_rollout_specs,
    read_results,
    run_ablation,
    run_rollout_spec,
)

# timing and file locations differ between two runs; everything else must not
VOLATILE = {"elapsed_s", "trace_path"}


def script_file(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"cycle": [COPY]}))
    return f"replay-file:{path}"


def stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def test_run_rollout_spec_round_trips_through_pickle(tmp_path: Path) -> None:
    specs = make_rollout_specs("verbatim_copy", ["llm", "rlm"], 1, model=script_file(tmp_path),
                               length_tokens=40, sandbox="inprocess", max_iterations=3,
                               trace_dir=tmp_path / "traces")
    assert json.loads(json.dumps(specs)) == specs            # plain data, nothing live
    fn = pickle.loads(pickle.dumps(run_rollout_spec))
    assert fn is run_rollout_spec                             # pickled by reference
    rows = [fn(pickle.loads(pickle.dumps(s))) for s in specs]
    assert [(r["variant"], r["reward"], r["status"]) for r in rows] == [("llm", 0.0, "final"),
                                                                          ("rlm", 1.0, "final")]
    assert [r["key"] for r in rows] == [s["key"] for s in specs]
    assert specs[1]["key"] == f"verbatim_copy|rlm|0|40|{specs[1]['model']}"
    assert pickle.loads(pickle.dumps(rows)) == rows and json.loads(json.dumps(rows)) == rows
    assert all(Path(r["trace_path"]).exists() for r in rows)
    dead = failed_rollout(specs[0], "ray task failed: boom")
    assert dead["status"] == "error" and dead["reward"] == 0.0 and dead["key"] == specs[0]["key"]


def test_local_resume_skips_done_keys_and_retries_errors(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    kw = dict(model=script_file(tmp_path), length_tokens=40, sandbox="inprocess")
    first = run_ablation("verbatim_copy", ["llm", "rlm"], 2, results_path=out, **kw)
    assert len(first) == 4 and out.read_text().count("\n") == 4
    seen: list[Any] = []
    again = run_ablation("verbatim_copy", ["llm", "rlm"], 3, results_path=out,
                         on_done=seen.append, **kw)
    assert [r.seed for r in seen] == [2, 2]                     # only the new seed ran
    assert [(r.variant, r.seed) for r in again] == [(v, s) for s in range(3)
                                                    for v in ("llm", "rlm")]
    assert [stable(r.to_dict()) for r in again[:4]] == [stable(r.to_dict()) for r in first]
    # an error row is kept on resume, and redone with retry_errors
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    rows[0].update(status="error", reward=0.0, error="boom")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    seen.clear()
    run_ablation("verbatim_copy", ["llm", "rlm"], 3, results_path=out, on_done=seen.append, **kw)
    assert seen == []
    redone = run_ablation("verbatim_copy", ["llm", "rlm"], 3, results_path=out,
                          retry_errors=True, on_done=seen.append, **kw)
    assert [(r.variant, r.seed) for r in seen] == [("llm", 0)]
    assert redone[0].status == "final" and len(read_results(out)) == 6


# ---------------------------------------------------------------- on a local Ray instance
@pytest.fixture(scope="module")
def local_ray() -> Any:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    # workers import the scripted responder (`copy_script`) from tests/
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env=local_runtime_env())
    yield ray
    ray.shutdown()


def crash_on_seed_1(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["seed"] == 1 and not os.environ.get("RECURSA_TEST_NO_CRASH"):
        os._exit(1)   # the worker process dies: no row comes back from the task
    return run_rollout_spec(spec)


@pytest.mark.slow
def test_ray_rows_resume_and_report_match_the_local_executor(local_ray: Any,
                                                             tmp_path: Path) -> None:
    from recursa.bench.executors import RayExecutor
    from recursa.envs.ablate import summarize, table

    def run(name: str, executor: Any) -> list[Any]:
        return run_ablation("verbatim_copy", ["llm", "rlm", "rlm_tips"], 2, model="replay:",
                            responder="helpers_scripted:copy_script", executor=executor,
                            results_path=tmp_path / name / "results.jsonl",
                            trace_dir=tmp_path / name / "traces", length_tokens=40,
                            sandbox="local", max_iterations=3)

    ray_ex = RayExecutor(fn=run_rollout_spec, on_error=failed_rollout)
    on_ray = run("ray", ray_ex)
    local = run("local", LocalRolloutExecutor(3))
    assert len(on_ray) == 6 and all(r.status == "final" for r in on_ray)
    assert [r.reward for r in on_ray] == [0.0, 1.0, 1.0] * 2
    assert all(Path(r.trace_path or "").exists() for r in on_ray)
    assert [stable(r.to_dict()) for r in on_ray] == [stable(r.to_dict()) for r in local]
    # the result files hold the same rows (in completion order)
    files = {n: sorted((stable(r.to_dict()) for r in read_results(tmp_path / n / "results.jsonl")),
                       key=lambda r: r["key"]) for n in ("ray", "local")}
    assert files["ray"] == files["local"]
    def no_wall(rs: list[Any]) -> str:   # the report, minus the wall-clock column
        return table([replace(s, wall_s=0.0, wall_ci=0.0) for s in summarize(rs)])
    assert no_wall(on_ray) == no_wall(local)

    # resume: nothing is redone, the file is untouched
    before = (tmp_path / "ray" / "results.jsonl").read_text()
    seen: list[Any] = []
    again = run_ablation("verbatim_copy", ["llm", "rlm", "rlm_tips"], 2, model="replay:",
                         responder="helpers_scripted:copy_script", executor=ray_ex,
                         results_path=tmp_path / "ray" / "results.jsonl", length_tokens=40,
                         on_done=seen.append, sandbox="local", max_iterations=3)
    assert seen == [] and (tmp_path / "ray" / "results.jsonl").read_text() == before
    assert [r.to_dict() for r in again] == [r.to_dict() for r in on_ray]


@pytest.mark.slow
def test_a_dead_ray_task_is_an_error_rollout_and_retry_redoes_it(local_ray: Any,
                                                                tmp_path: Path) -> None:
    from recursa.bench.executors import RayExecutor
    results = tmp_path / "results.jsonl"
    kw = dict(model=script_file(tmp_path), length_tokens=40, sandbox="inprocess",
              results_path=results)
    rs = run_ablation("verbatim_copy", ["rlm"], 3, executor=RayExecutor(
        fn=crash_on_seed_1, on_error=failed_rollout), **kw)
    assert [(r.seed, r.status) for r in rs] == [(0, "final"), (1, "error"), (2, "final")]
    assert "ray task failed" in (rs[1].error or "") and rs[1].reward == 0.0
    ex = RayExecutor(fn=crash_on_seed_1, on_error=failed_rollout, runtime_env=local_runtime_env(
        RECURSA_TEST_NO_CRASH="1"))
    rs = run_ablation("verbatim_copy", ["rlm"], 3, executor=ex, retry_errors=True, **kw)
    assert [(r.seed, r.reward) for r in rs] == [(0, 1.0), (1, 1.0), (2, 1.0)]


@pytest.mark.slow
def test_cli_ablate_with_the_ray_executor(local_ray: Any, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "abl"
    args = ["ablate", "--env", "verbatim_copy", "--variants", "llm,rlm", "-n", "2",
            "--length", "40", "--model", script_file(tmp_path), "--sandbox", "inprocess",
            "--out", str(out), "--executor", "ray"]
    assert main(args) == 0
    printed = capsys.readouterr()
    assert "| llm | 2 | 0 | 0.00 ± 0.00 |" in printed.out
    assert "| rlm | 2 | 0 | 1.00 ± 0.00 |" in printed.out
    assert "4 run, 0 already" in printed.err
    assert len(read_results(out / "results.jsonl")) == 4
    assert (out / "report.md").exists() and (out / "ablation.svg").exists()
    assert main(args) == 0   # resume through the CLI: nothing redone, same table
    again = capsys.readouterr()
    assert "0 run, 4 already" in again.err and again.out == printed.out
    assert len((out / "results.jsonl").read_text().splitlines()) == 4


def test_cli_executor_options() -> None:
    import argparse

    from recursa.envs.cli import register, rollout_executor
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    register(sub)
    a = p.parse_args(["ablate", "--env", "oolong", "--executor", "ray", "--address", "auto",
                      "--ray-env", "OPENAI_API_KEY"])
    ex = rollout_executor(a)
    assert type(ex).__name__ == "RayExecutor" and ex.address == "auto"
    assert ex.fn is run_rollout_spec and ex.on_error is failed_rollout
    assert ex.env_vars == ["OPENAI_API_KEY"]
    local = rollout_executor(p.parse_args(["ablate", "--env", "oolong", "--concurrency", "7"]))
    assert isinstance(local, LocalRolloutExecutor) and local.concurrency == 7


@pytest.mark.slow
def test_async_run_rollouts_takes_the_ray_executor(local_ray: Any, tmp_path: Path) -> None:
    import asyncio

    from recursa.bench.executors import RayExecutor
    from recursa.envs.rollout import run_rollouts
    rs = asyncio.run(run_rollouts(
        "verbatim_copy", ["llm", "rlm"], 1, model=script_file(tmp_path), length_tokens=40,
        sandbox="inprocess", executor=RayExecutor(fn=run_rollout_spec, on_error=failed_rollout),
        results_path=tmp_path / "results.jsonl"))
    assert [(r.variant, r.reward) for r in rs] == [("llm", 0.0), ("rlm", 1.0)]
    assert len(read_results(tmp_path / "results.jsonl")) == 2
