"""A batch driver for tests/test_batch_ray.py, run as its own process with the cluster's
environment (Ray reads its auth mode when it is imported, so the test process, which may have
imported Ray for other tests, cannot be the driver). Prints one JSON object: the rows, the
ledger's final snapshot, the summary and the driver's node.

    python batch_ray_driver.py ADDRESS NODES SCENARIO [WORKER_PGIDS]
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import ray

import helpers_batch
from ray_cluster import kill_node_of_worker
from recursa import RLM
from recursa.core.batch import BatchBudget
from recursa.core.batch.run import RayBatchExecutor


def rlm(responder: Any) -> RLM:
    # every model call costs $0.01: an item is one root call, so it spends exactly $0.01
    return RLM("replay:", sandbox="inprocess", preflight=False,
               client_options={"responses": responder, "cost_usd": 0.01})


def main() -> None:
    address, nodes, scenario = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ray.init(address=address, log_to_driver=False)
    deadline = time.monotonic() + 60
    while sum(n["Alive"] for n in ray.nodes()) < nodes:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {sum(n['Alive'] for n in ray.nodes())} nodes alive")
        time.sleep(0.5)
    out: dict[str, Any] = {"driver_node": ray.get_runtime_context().get_node_id()}
    if scenario == "budget":
        ex = RayBatchExecutor(address, retries=1)
        res = rlm(helpers_batch.first_word).batch(
            query="q", contexts=[f"w{i} x" for i in range(10)], executor=ex,
            budget=BatchBudget(max_cost_usd=0.065), max_cost_usd=0.01)
        out.update(answers=[r.answer if r else None for r in res], summary=res.summary,
                   ledger=ex.last_ledger)
        got = list(rlm(helpers_batch.first_word).iter_batch(
            query="q", contexts=[f"v{i} x" for i in range(8)], executor=ex))
        out["rows"] = [r.row for r in got]
    elif scenario == "kill":
        victims = {int(g) for g in sys.argv[4].split(",")}    # the worker nodes' sessions
        ex = RayBatchExecutor(address, retries=3)
        rows = []
        killed = False
        for r in rlm(helpers_batch.slow_first_word).iter_batch(
                query="q", contexts=[f"w{i} x" for i in range(12)], executor=ex,
                budget=BatchBudget(max_cost_usd=1.0), max_cost_usd=0.05):
            rows.append(r.row)
            # the node that just finished an item runs the next queued one, so killing it
            # 0.15 s later lands mid-item
            if not killed and len(rows) >= 3:
                time.sleep(0.15)
                killed = kill_node_of_worker(r.row["ray_pid"], victims)
        out["killed"] = killed
        out.update(rows=rows, ledger=ex.last_ledger)
    ray.shutdown()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
