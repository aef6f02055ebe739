"""Benchmark: the cost of isolated sandbox starts, side by side in one run.

    .venv/bin/python benchmarks/bench_sandbox_start.py            # 64 runs, 5 repeats
    .venv/bin/python benchmarks/bench_sandbox_start.py --runs 16 --repeats 3
    .venv/bin/python benchmarks/bench_sandbox_start.py --as-user    # (as root) the non-root path
    .venv/bin/python benchmarks/bench_sandbox_start.py --sides local,inprocess,local@user,inprocess@user

Sides, each in its own driver process against its own scripted OpenAI-compatible server
(127.0.0.1, every request waits --latency s):
  local         sandbox="local" as shipped (bubblewrap as root: workers forked by the zygote)
  local-spawn   sandbox="local" with RECURSA_ZYGOTE=0 (a bubblewrap + interpreter per run, one
                pre-started spare): the previous default, for reference
  inprocess     sandbox="inprocess" (no isolation): the floor

Each repeat runs the sides one after another (interleaved, so machine load hits them alike):
one RLM, a warm-up run, then `asyncio.gather` of --runs runs; each run is 2 root turns and one
batch of --subcalls sub-calls (ideal wall time 3 x latency), and is checked (its own tag, all
sub-calls answered). CPU is the driver's whole process tree (host, zygote, bubblewrap, workers)
from its own cpuacct control group when the host has one, else getrusage (which misses workers
that were killed). With --as-user (run as root) every driver runs as an unprivileged uid
(tests/sandbox_asuser.py), as most users do: the local side is then the zygote in a user
namespace, and the cpuacct group is made by this orchestrator and handed to that uid. Then, per
isolated side, 30 sandbox start+close cycles in a row measure the
CPU of one isolated start at steady state, and the resident memory of an idle spare (the
zygote, or a pre-started worker) and of one started, idle worker.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import BENCH_DIR, RECURSA_PYTHON, REPO, Server, driver_main, run_driver  # noqa: E402

import sandbox_asuser  # noqa: E402

SIDES = {"local": ("local", True), "local-spawn": ("local", False),
         "inprocess": ("inprocess", True)}


# ---------------------------------------------------------------- in the driver
def _cpuacct_dir() -> str | None:
    try:
        for line in open("/proc/self/cgroup"):
            _, ctrls, path = line.strip().split(":", 2)
            if "cpuacct" in ctrls.split(","):
                for mnt in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"):
                    if os.path.isdir(mnt):
                        return mnt + path.rstrip("/")
    except OSError:
        pass
    return None


def _join_own_cpuacct() -> str | None:
    """Put this driver (and so everything it starts) in a cpuacct group of its own."""
    base = _cpuacct_dir()
    if base is None:
        return None
    for entry in os.listdir(base):   # groups of drivers that were killed
        pid = entry.removeprefix("recursa-bench-")
        if entry.startswith("recursa-bench-") and pid.isdigit() and \
                not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(base, entry))
            except OSError:
                pass
    d = os.path.join(base, f"recursa-bench-{os.getpid()}")
    try:
        os.mkdir(d)
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError:
        return None
    return d


def _tree_cpu(group: str | None) -> float:
    if group:
        with open(os.path.join(group, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    import resource
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _mem_kb(pid: int) -> dict[str, int]:
    """Rss, Pss and private (USS) kB of one process."""
    out = {"rss": 0, "pss": 0, "uss": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                kb = int(v.split()[0]) if v.split() else 0
                if k == "Rss":
                    out["rss"] = kb
                elif k == "Pss":
                    out["pss"] = kb
                elif k in ("Private_Clean", "Private_Dirty"):
                    out["uss"] += kb
    except (OSError, ValueError, IndexError):
        pass
    return out


def _sum_mem(pids: list[int]) -> dict[str, float]:
    tot = {"rss": 0, "pss": 0, "uss": 0}
    for p in pids:
        for k, v in _mem_kb(p).items():
            tot[k] += v
    return {f"{k}_mb": round(v / 1024, 1) for k, v in tot.items()} | {"processes": len(pids)}


def _starts(sandbox: str, zygote: bool, group: str | None, n: int) -> dict[str, Any]:
    """n sandbox start + one cell + close cycles in a row: CPU per cycle, and memory."""
    import asyncio
    import tempfile

    from recursa.base.types import ContextPayload
    from recursa.sandbox import make_sandbox
    from recursa.sandbox.transport import descendants

    tmp = tempfile.mkdtemp(prefix="bench-start-")
    path = os.path.join(tmp, "ctx.txt")
    with open(path, "w") as f:
        f.write("shared context for every run\n" * 20)
    payload = ContextPayload(path=path, kind="text", sha256="-", size_bytes=580)

    async def handler(kind: str, args: dict) -> Any:
        return "ok"

    async def cycle() -> None:
        sb = make_sandbox(sandbox)
        await sb.start(payload, handler)
        await sb.run("x = len(context)", timeout=30, max_output_chars=1000)
        await sb.close()

    async def main() -> dict[str, Any]:
        for _ in range(3):
            await cycle()
        await asyncio.sleep(1.0)   # the next spare (if any) is up
        c0, t0 = _tree_cpu(group), time.perf_counter()
        for _ in range(n):
            await cycle()
        await asyncio.sleep(1.0)   # the spare started after the last take is counted too
        cpu = (_tree_cpu(group) - c0) / n
        out: dict[str, Any] = {"cycles": n, "cpu_ms_per_start_cell_close": round(cpu * 1e3, 2),
                               "wall_ms_per_cycle": round((time.perf_counter() - t0 - 1) / n
                                                          * 1e3, 1)}
        # memory: the idle spare, and one started idle worker
        if zygote:
            from recursa.sandbox import forkserver
            hosts = list(forkserver._HOSTS.values())
            z = hosts[0].get() if hosts else None
            if z is not None and z.pid:
                out["idle_spare"] = _sum_mem([z.pid, *descendants(z.pid)])
                out["idle_spare_is"] = "the zygote (bwrap, its init, the zygote interpreter)"
        else:
            from recursa.sandbox.local import POOL
            pids = POOL.pids()
            if pids:
                out["idle_spare"] = _sum_mem([p for s in pids for p in (s, *descendants(s))])
                out["idle_spare_is"] = "one pre-started worker (bwrap x2, the interpreter)"
        sb = make_sandbox(sandbox)
        await sb.start(payload, handler)
        await sb.run("x = len(context)", timeout=30, max_output_chars=1000)
        out["started_worker"] = _sum_mem(sb.processes())
        await sb.close()
        return out

    return asyncio.run(main())


def _join_given(group: str) -> str | None:
    """Join the cpuacct group the (root) orchestrator made for this unprivileged driver."""
    try:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError:
        return None
    return group


def drive(p: dict[str, Any]) -> dict[str, Any]:
    given = p.get("cpuacct")
    group = _join_given(given) if given else _join_own_cpuacct()
    sandbox, zygote = SIDES[p["side"].removesuffix("@user")]
    if not zygote:
        os.environ["RECURSA_ZYGOTE"] = "0"
    import asyncio

    from recursa import RLM
    try:
        rlm = RLM(model="openai:bench-model", base_url=p["base_url"], api_key="bench-key",
                  sandbox=sandbox, max_iterations=6)
        runs, n = p["runs"], p["subcalls"]

        async def one(k: int) -> str:
            try:
                res = await rlm.acompletion(f"ROOTQ-tagbatch-{k}-{n}: which run is this?",
                                            "shared context for every run\n" * 20)
                return str(res.answer)
            except Exception as e:
                return f"raised {type(e).__name__}: {e}"

        async def all_runs() -> tuple[list[str], float, float]:
            await one(0)   # warm-up: clients, imports, the zygote or first spare
            await asyncio.sleep(0.5)
            c0, t0 = _tree_cpu(group), time.perf_counter()
            got = list(await asyncio.gather(*(one(k) for k in range(runs))))
            return got, time.perf_counter() - t0, _tree_cpu(group) - c0

        answers, wall, cpu = asyncio.run(all_runs())
        wrong = [f"run {k}: {a[:120]!r}" for k, a in enumerate(answers) if a != f"run-{k}"]
        out: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu, "n_wrong": len(wrong),
                               "wrong": wrong[:3], "cpu_source": "cpuacct" if group else
                               "rusage", "euid": os.geteuid()}
        if p.get("starts") and sandbox == "local":
            out["starts"] = _starts(sandbox, zygote, group, p["starts"])
        return out
    finally:
        if group and not given:
            _leave(group)
        elif given:
            from recursa.sandbox import forkserver
            from recursa.sandbox.local import POOL
            forkserver.shutdown()
            POOL.shutdown()


def _leave(group: str) -> None:
    """Stop what the driver started (zygotes, spares), leave the group and remove it."""
    from recursa.sandbox import forkserver
    from recursa.sandbox.local import POOL
    forkserver.shutdown()
    POOL.shutdown()
    try:
        with open(os.path.join(os.path.dirname(group), "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError:
        return
    for _ in range(50):   # the last processes may take a moment to exit
        try:
            os.rmdir(group)
            return
        except OSError:
            time.sleep(0.1)


# ---------------------------------------------------------------- the orchestrator
@contextlib.contextmanager
def _no_group() -> Iterator[str | None]:
    yield None


def _as_user() -> tuple[str, Any]:
    """An interpreter command that runs as the unprivileged uid, and a maker of cpuacct groups
    that uid can join."""
    why = sandbox_asuser.usable()
    if why:
        raise SystemExit(f"--as-user: {why}")
    n = sandbox_asuser.uid()
    d = tempfile.mkdtemp(prefix="recursa-bench-asuser-")
    os.chmod(d, 0o755)
    atexit.register(shutil.rmtree, d, True)
    wrapper = os.path.join(d, "python")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(x) for x in
                                            sandbox_asuser.command([RECURSA_PYTHON], expose=[
                                                REPO / "src", BENCH_DIR])) + ' "$@"\n')
    os.chmod(wrapper, 0o755)

    @contextlib.contextmanager
    def group() -> Iterator[str | None]:
        base = _cpuacct_dir()
        g = os.path.join(base, f"recursa-bench-asuser-{os.getpid()}") if base else None
        try:
            if g:
                os.mkdir(g)
                for f in ("cgroup.procs", "tasks"):
                    os.chown(os.path.join(g, f), n, n)
        except OSError:
            g = None
        try:
            yield g
        finally:
            for _ in range(50 if g else 0):   # the driver's last processes may take a moment
                try:
                    os.rmdir(g)   # type: ignore[arg-type]
                    break
                except OSError:
                    time.sleep(0.1)

    return wrapper, group


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--subcalls", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--starts", type=int, default=30, help="start/close cycles per side")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="comma-separated; a side with the suffix @user runs as an unprivileged "
                         "uid (as root)")
    ap.add_argument("--out", default="")
    ap.add_argument("--as-user", action="store_true",
                    help="(as root) run every side as an unprivileged uid: the non-root path")
    a = ap.parse_args(argv)
    sides = [s for s in a.sides.split(",") if s]
    if a.as_user:
        sides = [s if s.endswith("@user") else s + "@user" for s in sides]
    bad = [s for s in sides if s.removesuffix("@user") not in SIDES]
    if bad:
        raise SystemExit(f"unknown sides {bad}: choose from {sorted(SIDES)}, each with an "
                         f"optional @user suffix")
    runners = {False: (RECURSA_PYTHON, _no_group)}
    if any(s.endswith("@user") for s in sides):
        runners[True] = _as_user()
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for rep in range(a.repeats):
        for side in sides:
            python, made_group = runners[side.endswith("@user")]
            with Server("scripted", latency=a.latency) as srv, made_group() as group:
                r = run_driver(python, "bench_sandbox_start",
                               {"side": side, "base_url": srv.base_url, "runs": a.runs,
                                "subcalls": a.subcalls, "cpuacct": group,
                                "starts": a.starts if rep == 0 else 0},
                               timeout=600)
            rows[side].append(r)
            msg = r.get("error") or (f"wall {r['wall_s']:.2f} s, cpu {r['cpu_s']:.2f} s, "
                                     f"wrong {r['n_wrong']}")
            print(f"repeat {rep + 1}/{a.repeats} {side:16s} {msg}", file=sys.stderr, flush=True)

    def med(side: str, key: str) -> float | None:
        xs = [r[key] for r in rows[side] if key in r]
        return statistics.median(xs) if xs else None

    ideal = 3 * a.latency
    print(f"\ndrivers ran as uid {os.geteuid()}; sides marked @user as unprivileged uid "
          f"{sandbox_asuser.uid()}")
    print(f"{a.runs} concurrent runs in one process, one RLM; each run 2 root turns + "
          f"{a.subcalls} sub-calls, latency {a.latency} s (ideal {ideal:.1f} s); "
          f"median of {a.repeats} repeats, sides interleaved")
    print(f"{'side':16s} {'wall s (min-max)':>22s} {'cpu s / run':>12s} {'wrong':>6s}")
    for side in sides:
        walls = [r["wall_s"] for r in rows[side] if "wall_s" in r]
        w = med(side, "wall_s")
        c = med(side, "cpu_s")
        wrong = sum(r.get("n_wrong", 0) for r in rows[side])
        errs = [r["error"] for r in rows[side] if "error" in r]
        wtxt = f"{w:.2f} ({min(walls):.2f}-{max(walls):.2f})" if walls else "-"
        ctxt = f"{c / a.runs * 1e3:.1f} ms" if c is not None else "-"
        print(f"{side:16s} {wtxt:>22s} {ctxt:>12s} {wrong:>6d}" + (f"  errors: {errs[:1]}"
                                                                    if errs else ""))
    for side in sides:
        ref = "inprocess@user" if side.endswith("@user") else "inprocess"
        base = med(ref, "wall_s") if ref in rows else None
        w = med(side, "wall_s")
        if base and w and side != ref:
            print(f"ratio {side} / {ref} (median wall): {w / base:.2f}x")
    print("\nisolated starts at steady state (start + one cell + close, in a row):")
    for side in sides:
        st = next((r["starts"] for r in rows[side] if "starts" in r), None)
        if not st:
            continue
        spare = st.get("idle_spare", {})
        worker = st.get("started_worker", {})
        print(f"{side:16s} cpu {st['cpu_ms_per_start_cell_close']:.1f} ms per cycle, wall "
              f"{st['wall_ms_per_cycle']:.1f} ms; idle spare: rss {spare.get('rss_mb')} MB, "
              f"pss {spare.get('pss_mb')} MB, private {spare.get('uss_mb')} MB "
              f"({st.get('idle_spare_is', '-')}); a started idle worker: private "
              f"{worker.get('uss_mb')} MB, pss {worker.get('pss_mb')} MB in "
              f"{worker.get('processes')} processes")
    src = {r.get("cpu_source") for rs in rows.values() for r in rs if "cpu_source" in r}
    print(f"cpu measured with: {', '.join(sorted(src)) or '-'} (the driver's whole tree)")
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--drive":
        driver_main(drive)
    else:
        sys.exit(main())
