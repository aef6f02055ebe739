"""`recursa batch` / RLM.batch on a real multi-node Ray cluster made on this machine
(tests/ray_cluster.py: a head with no CPUs and worker nodes of one CPU each, separate `ray
start` processes; the driver is tests/batch_ray_driver.py, a process of its own): items run on
the worker nodes, the batch budget holds across them through the ledger actor, and a worker
node killed mid-batch has its items redone elsewhere, each attempt's spend counted once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from ray_cluster import TESTS, LocalCluster, cluster_env  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Any:
    c = LocalCluster(workers=2, cpus=1)
    try:
        yield c
    finally:
        c.shutdown()


def drive(c: LocalCluster, nodes: int, scenario: str, *extra: str) -> dict[str, Any]:
    p = subprocess.run(["nice", "-n", "5", sys.executable, str(TESTS / "batch_ray_driver.py"),
                        c.address, str(nodes), scenario, *extra],
                       capture_output=True, timeout=600, env=cluster_env())
    assert p.returncode == 0, p.stderr.decode()[-4000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_budget_holds_across_worker_nodes(cluster: LocalCluster) -> None:
    out = drive(cluster, 3, "budget")
    answers, s, led = out["answers"], out["summary"], out["ledger"]
    assert answers[:6] == [f"w{i}" for i in range(6)] or sum(a is not None for a in answers) == 6
    assert sum(a is not None for a in answers) == 6              # 6 x $0.01 fit in $0.065
    assert s["not_started"] == 4 and s["stopped"] == "max_cost_usd"
    assert led["cost_usd"] == pytest.approx(0.06) and led["in_flight"] == 0
    # the rows came from both worker nodes, never the CPU-less head (the driver's node)
    nodes = {r["ray_node"] for r in out["rows"]}
    assert len(nodes) == 2 and out["driver_node"] not in nodes
    assert sorted(r["answer"] for r in out["rows"]) == sorted(f"v{i}" for i in range(8))


def test_cli_on_the_cluster_writes_rows_and_resumes(cluster: LocalCluster,
                                                    tmp_path: Path) -> None:
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(5):
        (d / f"d{i}.txt").write_text(f"word{i} rest\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"cycle": ["```repl\nFINAL(str(context).split()[0])\n```"]}))
    out = tmp_path / "answers.jsonl"
    cmd = ["nice", "-n", "5", sys.executable, "-m", "recursa.cli", "batch", "first word?",
           "--contexts", str(d), "--out", str(out), "--model", f"replay-file:{script}",
           "--sandbox", "inprocess", "--executor", "ray", "--address", cluster.address,
           "--events", "jsonl"]
    p = subprocess.run(cmd, capture_output=True, timeout=300, env=cluster_env())
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["answer"] for r in rows) == [f"word{i}" for i in range(5)]
    assert all(r["ray_node"] for r in rows)
    q = subprocess.run(cmd, capture_output=True, timeout=300, env=cluster_env())
    assert q.returncode == 0, q.stderr.decode()[-3000:]
    assert len(out.read_text().splitlines()) == 5        # nothing ran again


def test_a_killed_worker_nodes_items_are_redone_and_spend_counted_once(
        cluster: LocalCluster) -> None:
    # last in this file: the driver kills the worker node that ran the third item, mid-item
    out = drive(cluster, 3, "kill", ",".join(str(p.pid) for p in cluster.workers))
    rows, led = out["rows"], out["ledger"]
    assert out["killed"]
    assert sorted(r["index"] for r in rows) == list(range(12))       # each item once
    assert all(r["status"] == "final" and r["answer"] == f"w{r['index']}" for r in rows)
    attempts = sum(r["attempt"] for r in rows)
    assert attempts > 12, "no item was running on the killed node"
    # every attempt was settled exactly once: as finished, or as lost with what it reported
    assert led["items"] + led["lost_attempts"] == attempts and led["in_flight"] == 0
    assert led["cost_usd"] == pytest.approx(0.01 * led["items"] + led["lost_cost_usd"])
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(0.12)
    assert 0.12 - 1e-9 <= led["cost_usd"] <= 0.01 * attempts + 1e-9
