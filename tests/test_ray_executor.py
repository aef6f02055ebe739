"""`RayExecutor` on a local Ray instance started by the test (2 CPUs, no dashboard): the same
rows, resume and report as the local executor; concurrency bounded by Ray's CPUs; a task
that dies becomes an error row that --retry-errors redoes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ray_local import local_runtime_env

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from recursa.bench.executors import RayExecutor, executor_from_args  # noqa: E402
from recursa.bench.methods import MethodConfig, parse_method  # noqa: E402
from recursa.bench.report import summarise  # noqa: E402
from recursa.bench.runner import (  # noqa: E402
    AsyncioExecutor,
    load_rows,
    make_specs,
    run_bench,
    run_instance,
)

pytestmark = pytest.mark.slow

RESPONDER = "helpers_scripted:sniah_model"


def configs(*methods: str) -> list[MethodConfig]:
    out = []
    for m in methods:
        name, depth, trunc = parse_method(m)
        out.append(MethodConfig(method=name, depth=depth, truncate=trunc, model="replay:",
                                sandbox="local", limits={"max_iterations": 3},
                                client_options={"responder": RESPONDER}))
    return out


@pytest.fixture(scope="module")
def local_ray() -> Any:
    # Workers import the scripted responder and this module's task functions from tests/.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env=local_runtime_env())
    yield ray
    ray.shutdown()


def slow_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Stands in for run_instance: records when and where it ran."""
    t0 = time.time()
    time.sleep(0.5)
    return {"key": spec["key"], "task": spec["task"], "length": spec["length"],
            "seed": spec["seed"], "method": "probe", "score": 1.0, "status": "final",
            "pid": os.getpid(), "started_at": t0, "finished_at": time.time()}


def crash_on_seed_1(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["seed"] == 1 and not os.environ.get("RECURSA_TEST_NO_CRASH"):
        os._exit(1)   # the worker process dies: no row comes back from the task
    return run_instance(spec)


def test_rows_resume_and_report_match_the_local_executor(local_ray: Any,
                                                         tmp_path: Path) -> None:
    specs = make_specs(["sniah"], [1024, 2048], range(2), configs("rlm", "direct"),
                       str(tmp_path / "ray" / "traces"))
    s = run_bench(specs, tmp_path / "ray", executor=RayExecutor(), progress=False)
    assert s == {"total": 8, "skipped": 0, "ran": 8, "errors": 0}
    rows = {r["key"]: r for r in load_rows(tmp_path / "ray")}
    assert set(rows) == {sp["key"] for sp in specs}
    assert all(r["score"] == 1.0 and r["status"] == "final" for r in rows.values())
    assert all(Path(r["trace_path"]).exists() for r in rows.values())
    assert any(r["sub_input_tokens"] > 0 for r in rows.values() if r["method"] == "rlm")

    # resume: nothing is redone
    lines = (tmp_path / "ray" / "rows.jsonl").read_text().count("\n")
    s2 = run_bench(specs, tmp_path / "ray", executor=RayExecutor(), progress=False)
    assert s2["ran"] == 0 and s2["skipped"] == 8
    assert (tmp_path / "ray" / "rows.jsonl").read_text().count("\n") == lines

    # the same instances on the local executor give the same answers and scores
    run_bench(specs, tmp_path / "local", executor=AsyncioExecutor(4), progress=False)
    local = {r["key"]: r for r in load_rows(tmp_path / "local")}
    for key, r in rows.items():
        for field in ("answer", "gold", "score", "status", "turns", "subcalls", "tokens"):
            assert r[field] == local[key][field], (key, field)
    assert [c.mean for c in summarise(list(rows.values()))] == \
           [c.mean for c in summarise(list(local.values()))]


def test_concurrency_comes_from_ray_cpus(local_ray: Any, tmp_path: Path) -> None:
    specs = make_specs(["sniah"], [1024], range(6), configs("direct"), None)
    seen: list[dict[str, Any]] = []
    RayExecutor(fn=slow_probe, max_in_flight=6).run(specs, seen.append)
    assert sorted(r["key"] for r in seen) == sorted(s["key"] for s in specs)
    events = sorted([(r["started_at"], 1) for r in seen] + [(r["finished_at"], -1) for r in seen])
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert peak == 2   # two CPUs, one CPU per task: never more, and not serial either


def test_a_dead_task_is_an_error_row_and_retry_redoes_it(local_ray: Any,
                                                         tmp_path: Path) -> None:
    specs = make_specs(["sniah"], [1024], range(3), configs("direct"), None)
    s = run_bench(specs, tmp_path, executor=RayExecutor(fn=crash_on_seed_1), progress=False)
    assert s["ran"] == 3 and s["errors"] == 1
    rows = {r["seed"]: r for r in load_rows(tmp_path)}
    assert rows[1]["status"] == "error" and "ray task failed" in rows[1]["error"]
    assert rows[1]["method"] == "direct" and rows[1]["key"] == specs[1]["key"]
    assert rows[0]["score"] == rows[2]["score"] == 1.0
    json.dumps(rows[1])
    ex = RayExecutor(fn=crash_on_seed_1, runtime_env=local_runtime_env(
        RECURSA_TEST_NO_CRASH="1"))
    s = run_bench(specs, tmp_path, executor=ex, retry_errors=True, progress=False)
    assert s["ran"] == 1 and s["errors"] == 0
    assert {r["seed"]: r for r in load_rows(tmp_path)}[1]["score"] == 1.0


def test_executor_from_args() -> None:
    import argparse

    from recursa.bench.executors import add_executor_options
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", type=int, default=4)
    add_executor_options(p)
    ex = executor_from_args(p.parse_args(["--executor", "ray", "--address", "auto",
                                          "--ray-env", "OPENAI_API_KEY"]))
    assert isinstance(ex, RayExecutor) and ex.address == "auto"
    assert ex.env_vars == ["OPENAI_API_KEY"]
    assert isinstance(executor_from_args(p.parse_args([])), AsyncioExecutor)


def test_cli_bench_run_with_the_ray_executor(local_ray: Any, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from recursa.cli import main
    args = ["bench", "run", "--task", "sniah", "--lengths", "1k", "--method", "rlm,direct",
            "-n", "2", "--out", str(tmp_path), "--model", "replay:", "--sandbox", "local",
            "--client-option", f"responder={RESPONDER}", "--max-iterations", "3",
            "--no-progress", "--no-baselines", "--executor", "ray"]
    assert main(args) == 0
    rows = load_rows(tmp_path)
    assert len(rows) == 4 and all(r["score"] == 1.0 for r in rows)
    assert main(args) == 0   # resume through the CLI: nothing redone
    assert "0 run, 4 already done" in capsys.readouterr().err
    assert main(["bench", "report", str(tmp_path), "--no-plots"]) == 0
