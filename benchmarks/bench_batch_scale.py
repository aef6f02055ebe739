"""`RLM.batch` / `recursa batch` on the scripted model: items per minute against concurrency on
this machine, 1 vs 2 Ray worker nodes, and how far the batch budget's spend goes past its cap
at the moment it stops.

The model is `replay:` with a fixed latency per call (no quality figure: only the batch
machinery). Each item is one root turn that makes one sub-call and commits; every call costs
$0.01. The Ray part makes a real cluster on this machine (tests/ray_cluster.py: a CPU-less head
and worker nodes of one CPU each, separate `ray start` processes). On a 2-core machine two Ray
nodes show the overhead and that the batch is correct across nodes, not a speed-up: the nodes
share the same two cores with the driver and everything else running.

    PYTHONPATH=src nice -n 5 .venv/bin/python benchmarks/bench_batch_scale.py \\
        [--items 24] [--latency 0.25] [--concurrency 1 2 4 8] [--sandbox local] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
# Ray reads its auth mode when imported: the test cluster's nodes use token auth
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from recursa import RLM  # noqa: E402
from recursa.core.batch import BatchBudget  # noqa: E402

CALL_COST = 0.01


def respond(messages: list[dict[str, Any]]) -> str:
    """Root: one sub-call, then commit the context's first word; sub-call: 'ok'.
    With SUBS=n in the query, the root makes n sub-calls (an item that wants more than its
    cap)."""
    system = str(messages[0].get("content", "")) if messages else ""
    if "REPL" not in system:
        return "ok"
    text = " ".join(str(m.get("content", "")) for m in messages)
    n = int(text.split("SUBS=", 1)[1][:1]) if "SUBS=" in text else 1
    return ("```repl\nrs = [llm_query('say ok') for _ in range(" + str(n) + ")]\n"
            "FINAL(str(context).split()[0])\n```")


def make_rlm(latency: float, sandbox: str) -> RLM:
    return RLM("replay:", sandbox=sandbox, preflight=False,
               client_options={"responses": respond, "latency": latency,
                               "cost_usd": CALL_COST})


def contexts(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i} and some more words" for i in range(n)]


def timed(rlm: RLM, n: int, **kw: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    got = list(rlm.iter_batch(query="first word?", contexts=contexts(n), **kw))
    wall = time.monotonic() - t0
    done = [r for r in got if r.result is not None]
    right = sum(r.result.answer == f"w{r.item.index}" for r in done if r.result)
    nodes = {r.row.get("ray_node") for r in done if r.row and r.row.get("ray_node")}
    return {"items": n, "done": len(done), "right": right, "wall_s": round(wall, 2),
            "items_per_min": round(60 * len(done) / wall, 1), "ray_nodes_used": len(nodes)}


def overshoot(rlm: RLM, *, cap: float, item_cap: float, subs: int, concurrency: int,
              executor: Any = None) -> dict[str, Any]:
    """Spend past the batch cap when it stops (negative: under it)."""
    res = rlm.batch(query=f"first word? SUBS={subs}", contexts=contexts(40),
                    concurrency=concurrency, budget=BatchBudget(max_cost_usd=cap),
                    max_cost_usd=item_cap, executor=executor)
    s = res.summary
    spent = s["cost_usd"] or 0.0
    per_item = [r.cost_usd or 0.0 for r in res if r is not None]
    return {"cap": cap, "item_reservation": item_cap, "subcalls_per_item": subs,
            "concurrency": concurrency, "done": s["done"], "not_started": s["not_started"],
            "spent": round(spent, 4), "overshoot": round(spent - cap, 4),
            "max_item_spend": round(max(per_item, default=0.0), 4),
            "within_one_reservation": spent - cap <= item_cap + 1e-9}


def ray_part(a: argparse.Namespace, rlm: RLM) -> dict[str, Any]:
    import ray

    from ray_cluster import LocalCluster
    from recursa.core.batch.run import RayBatchExecutor
    out: dict[str, Any] = {}
    cluster = LocalCluster(workers=1, cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_nodes(ray, 2)
        ex = RayBatchExecutor(cluster.address)
        rlm.batch(query="warm-up", contexts=contexts(2), executor=ex)   # workers start
        out["1_node"] = timed(rlm, a.items, executor=ex)
        cluster.add_worker()
        cluster.wait_nodes(ray, 3)
        rlm.batch(query="warm-up 2", contexts=contexts(4), executor=ex)
        out["2_nodes"] = timed(rlm, a.items, executor=ex)
        out["overshoot_2_nodes"] = overshoot(rlm, cap=0.25, item_cap=0.03, subs=1,
                                             concurrency=2, executor=ex)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--latency", type=float, default=0.25, help="seconds per model call")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sandbox", default="local")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "batch_scale.json"))
    a = ap.parse_args()
    rlm = make_rlm(a.latency, a.sandbox)
    rlm.batch(query="warm-up", contexts=contexts(2))
    report: dict[str, Any] = {"items": a.items, "latency_s": a.latency, "sandbox": a.sandbox,
                              "cpus": os.cpu_count(), "local": {}}
    print(f"{a.items} items, 2 model calls each at {a.latency}s, sandbox {a.sandbox}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'where':24s} {'done':>5s} {'right':>5s} {'wall s':>7s} {'items/min':>9s}")
    for c in a.concurrency:
        r = timed(rlm, a.items, concurrency=c)
        report["local"][str(c)] = r
        print(f"{'local, concurrency ' + str(c):24s} {r['done']:5d} {r['right']:5d} "
              f"{r['wall_s']:7.2f} {r['items_per_min']:9.1f}")
    print("\nbudget overshoot at the stop (cap $0.25, every call $0.01, reservation = the "
          "item's own cap):")
    report["overshoot"] = [
        overshoot(rlm, cap=0.25, item_cap=0.03, subs=1, concurrency=4),     # items under cap
        overshoot(rlm, cap=0.25, item_cap=0.03, subs=4, concurrency=4),     # items hit cap
    ]
    if not a.no_ray:
        report["ray"] = ray_part(a, rlm)
        for k in ("1_node", "2_nodes"):
            r = report["ray"][k]
            print(f"{'ray, ' + k.replace('_', ' '):24s} {r['done']:5d} {r['right']:5d} "
                  f"{r['wall_s']:7.2f} {r['items_per_min']:9.1f}  "
                  f"(nodes used: {r['ray_nodes_used']})")
        report["overshoot"].append({**report["ray"]["overshoot_2_nodes"], "where": "ray"})
    for o in report["overshoot"]:
        print(f"  {o.get('where', 'local')}: {o['subcalls_per_item']} sub-call(s)/item, "
              f"concurrency {o['concurrency']}: {o['done']} done, {o['not_started']} not "
              f"started, spent ${o['spent']:.2f}, overshoot ${o['overshoot']:+.2f}, max item "
              f"${o['max_item_spend']:.2f} (reservation ${o['item_reservation']:.2f}); within "
              f"one reservation: {o['within_one_reservation']}")
    Path(a.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\nwritten: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
