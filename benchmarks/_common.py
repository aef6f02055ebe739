"""Shared plumbing for the speed benchmarks (stdlib only: it is also imported by the reference
library's interpreter, which has no recursa).

Each benchmark runs every *side* (recursa with sandbox="local", recursa with "inprocess", the
reference library `rlms`) in its own subprocess - a *driver* - against its own scripted
OpenAI-compatible server, itself a separate process on 127.0.0.1. The orchestrator polls the
driver's process tree in /proc for the resident-set high-water mark (host + sandbox workers) and
kills the whole tree at the timeout.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TESTS_DIR = REPO / "tests"
RECURSA_PYTHON = sys.executable
RLMS_VERSION = "0.1.3"
RLMS_VENV = Path(os.environ.get("RECURSA_BENCH_RLMS_VENV", "/tmp/rlmsvenv"))
RESULT_TAG = "@@RESULT@@ "

SIDES_ALL = ("recursa-local", "recursa-inprocess", "rlms")


# ---------------------------------------------------------------- statistics
def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summary(xs: list[float]) -> dict[str, Any]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    return {"n": len(s), "median": statistics.median(s), "min": s[0], "max": s[-1],
            "p90": s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---------------------------------------------------------------- the reference library
def rlms_python(install: bool = True, log=print) -> tuple[str | None, str]:
    """An interpreter that imports rlms==0.1.3 (installing it into its own venv if allowed).

    Returns (python or None, message). The reference library is never added to recursa's
    dependencies: it lives in a separate venv (RECURSA_BENCH_RLMS_VENV, default /tmp/rlmsvenv),
    or RECURSA_BENCH_RLMS_PYTHON names an interpreter that already has it.
    """
    cands = [os.environ.get("RECURSA_BENCH_RLMS_PYTHON"), str(RLMS_VENV / "bin" / "python")]
    probe = ("import importlib.metadata as m, rlm; v = m.version('rlms'); print(v)")
    for py in filter(None, cands):
        if not os.path.exists(py):
            continue
        try:
            out = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"rlms: {py} does not run: {e}"
        if out.returncode == 0:
            v = out.stdout.strip()
            if v != RLMS_VERSION:
                log(f"note: {py} has rlms {v}, not {RLMS_VERSION}; using it anyway")
            return py, f"rlms {v} at {py}"
    if not install:
        return None, ("rlms not found (set RECURSA_BENCH_RLMS_PYTHON, or drop --no-install to "
                      f"let the benchmark create {RLMS_VENV}); reference side skipped")
    log(f"installing rlms=={RLMS_VERSION} into {RLMS_VENV} (separate venv; up to 5 min) ...")
    failed = _make_venv(RLMS_VENV, [f"rlms=={RLMS_VERSION}"])
    if failed:
        return None, f"rlms could not be installed ({failed}); reference side skipped"
    return rlms_python(install=False, log=log)


def _make_venv(venv: Path, packages: list[str]) -> str | None:
    """Create `venv` and pip-install `packages` into it; None, or why it failed."""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120,
                       capture_output=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
                       check=True, timeout=300, capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return None


# ---------------------------------------------------------------- a plain install's venv
PLAIN_VENV = Path(os.environ.get("RECURSA_BENCH_PLAIN_VENV", "/tmp/recursa-plainvenv"))


def plain_python(install: bool = True, log=print) -> tuple[str | None, str]:
    """An interpreter with only recursa's own dependencies (pyproject's [project] list), as
    `pip install recursa` gives a user; the code under test still comes from this checkout
    (PYTHONPATH). The dev venv also holds every extra and test tool (selenium brings trio,
    uvicorn brings click), which changes what importing httpx costs. Made once, in its own venv
    (RECURSA_BENCH_PLAIN_VENV, default /tmp/recursa-plainvenv)."""
    import tomllib
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    py = PLAIN_VENV / "bin" / "python"
    probe = ("import importlib.metadata as m, sys; "
             "[m.version(d) for d in sys.argv[1:]]")
    names = [re.match(r"[A-Za-z0-9_.-]+", d).group() for d in deps]   # type: ignore[union-attr]
    if py.exists() and subprocess.run([str(py), "-c", probe, *names], capture_output=True,
                                      timeout=60).returncode == 0:
        return str(py), f"plain venv {PLAIN_VENV}"
    if not install:
        return None, "no plain venv (drop --no-install to let the benchmark make one)"
    log(f"making a venv with only recursa's dependencies at {PLAIN_VENV} (once; up to 5 min) ...")
    failed = _make_venv(PLAIN_VENV, deps)
    if failed:
        return None, f"the plain venv could not be made ({failed}); its rows are skipped"
    return plain_python(install=False, log=log)


# ---------------------------------------------------------------- scripted model server
class Server:
    """The test server of tests/openai_testserver.py in its own process, with a scripted
    responder from _responders.py. Loopback only."""

    def __init__(self, responder: str, *, latency: float = 0.0, dialect: str = "recursa",
                 timeout: float = 30.0):
        self.args = [RECURSA_PYTHON, str(BENCH_DIR / "_serve.py"), "--responder", responder,
                     "--latency", str(latency), "--dialect", dialect]
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = _readline_timeout(self.proc.stdout, self.timeout)
        if not line:
            self.__exit__()
            raise RuntimeError("benchmark model server did not start")
        self.base_url = json.loads(line)["base_url"]
        return self

    def stats(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = _readline_timeout(self.proc.stdout, 10)
        return json.loads(line) if line else {}

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            _kill_group(self.proc)
        self.proc = None


def _readline_timeout(stream, timeout: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


# ---------------------------------------------------------------- memory of a process tree
def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


class TreeMemory:
    """Polls the RSS of a process and all its descendants; keeps the peak of the sum and the
    peak of each process. (Polling can miss a spike shorter than `interval`; the host's own
    VmHWM, reported by the driver, is exact.)"""

    def __init__(self, pid: int, interval: float = 0.01):
        self.pid, self.interval = pid, interval
        self.peak_total_kb = 0
        self.peak_by_pid: dict[int, int] = {}
        self.max_procs = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeMemory:
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        # Imported here: driver processes of the reference side load this module without recursa.
        from recursa.sandbox.transport import descendants
        n = 0
        tree = [self.pid]
        while not self._stop.is_set():
            if n % 10 == 0:   # the tree changes rarely; /proc scans are not free
                tree = [self.pid, *descendants(self.pid)]
            n += 1
            total = 0
            for p in tree:
                kb = _rss_kb(p)
                total += kb
                if kb > self.peak_by_pid.get(p, 0):
                    self.peak_by_pid[p] = kb
            self.max_procs = max(self.max_procs, len(tree))
            self.peak_total_kb = max(self.peak_total_kb, total)
            self._stop.wait(self.interval)

    def report(self) -> dict[str, Any]:
        per = sorted(self.peak_by_pid.values(), reverse=True)
        return {"peak_tree_rss_mb": round(self.peak_total_kb / 1024, 1),
                "peak_host_rss_mb": round(self.peak_by_pid.get(self.pid, 0) / 1024, 1),
                "peak_rss_by_process_mb": [round(kb / 1024, 1) for kb in per if kb][:4],
                "max_processes": self.max_procs}


# ---------------------------------------------------------------- drivers
def run_driver(python: str, module: str, params: dict[str, Any], *, timeout: float,
               memory: bool = False) -> dict[str, Any]:
    """Run `python benchmarks/<module>.py --drive PARAMS_JSON`; return its result dict.

    The driver prints one line `@@RESULT@@ {json}`. On timeout the process group is killed and
    the result says so; a crash returns the last lines of stderr."""
    cmd = [python, str(BENCH_DIR / f"{module}.py"), "--drive", json.dumps(params)]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    # this checkout's recursa first (an editable install may point at another one)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), str(TESTS_DIR), str(REPO / "src")])
    env["PYTHONUNBUFFERED"] = "1"
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, cwd=str(params.get("cwd", "/tmp")))
    mem = TreeMemory(proc.pid).start() if memory else None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        res: dict[str, Any] = {"error": f"timed out after {timeout:.0f} s (process tree killed)",
                               "timed_out": True}
    else:
        res = {}
        for line in out.splitlines():
            if line.startswith(RESULT_TAG):
                res = json.loads(line[len(RESULT_TAG):])
        if not res:
            tail = "\n".join(err.strip().splitlines()[-6:])
            res = {"error": f"driver exited {proc.returncode} without a result: {tail}"}
    finally:
        if mem:
            mem.stop()
        if proc.poll() is None:
            _kill_group(proc)
    res["driver_wall_s"] = round(time.monotonic() - t0, 3)
    if mem:
        res["memory"] = mem.report()
    if err and "error" in res:
        res.setdefault("stderr_tail", err.strip().splitlines()[-6:])
    return res


def emit(result: dict[str, Any]) -> None:
    """Called by a driver: hand its result to the orchestrator."""
    result["host_vmhwm_mb"] = vmhwm_mb()
    # sys.__stdout__: the reference library swaps sys.stdout from several threads at once and
    # may leave it pointing at a REPL's capture buffer.
    out = sys.__stdout__ or sys.stdout
    out.write(RESULT_TAG + json.dumps(result) + "\n")
    out.flush()


def vmhwm_mb(pid: int | str = "self") -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def driver_main(drive) -> None:
    """`__main__` of a benchmark module: `--drive JSON` runs one side and emits its result."""
    if len(sys.argv) >= 3 and sys.argv[1] == "--drive":
        params = json.loads(sys.argv[2])
        try:
            emit(drive(params))
        except Exception as e:   # the orchestrator records it; the table shows "error"
            import traceback
            traceback.print_exc()
            emit({"error": f"{type(e).__name__}: {e}"})
        return
    print("run benchmarks through run_all.py (e.g. .venv/bin/python benchmarks/run_all.py "
          "--only " + Path(sys.argv[0]).stem.removeprefix("bench_") + ")", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- building each side's RLM
def make_rlm(side: str, base_url: str, *, trace: str | None = None, **kw: Any):
    """An RLM for `side`, talking to `base_url`. Imports only the side's own library."""
    if side.startswith("recursa"):
        from recursa import RLM
        sandbox = side.split("-", 1)[1]
        opts: dict[str, Any] = {"sandbox": sandbox, "max_iterations": 6}
        if trace:
            opts["trace_path"] = trace
        if "concurrency" in kw:
            opts["concurrency"] = kw["concurrency"]
        if "depth" in kw:   # children allowed one level down: recursa's max_depth=1
            opts["max_depth"] = kw["depth"]
        return RLM(model="openai:bench-model", base_url=base_url, api_key="bench-key", **opts)
    from rlm import RLM
    from rlm.logger import RLMLogger
    logger = RLMLogger(log_dir=trace) if trace else None
    ropts: dict[str, Any] = {"max_iterations": 6}
    if "depth" in kw:   # the same tree in the reference: its max_depth counts the root
        ropts["max_depth"] = kw["depth"] + 1
    if "subcall_workers" in kw:
        ropts["max_concurrent_subcalls"] = kw["subcall_workers"]
    return RLM(backend="openai", backend_kwargs={"model_name": "bench-model",
                                                 "base_url": base_url, "api_key": "bench-key"},
               environment="local", logger=logger, **ropts)


def complete(side: str, rlm, query: str, context: Any) -> tuple[str, str]:
    """One completion; returns (answer, status)."""
    if side.startswith("recursa"):
        res = rlm.completion(query, context=context)
        return res.answer, res.status
    out = rlm.completion(context, root_prompt=query)
    return out.response, "final"


def cpu_s() -> float:
    """CPU seconds used so far by this process and its reaped children (sandbox workers)."""
    import resource
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def ensure_dir(p: str | Path) -> Path:
    p = Path(p)
    p.mkdir(parents=True, exist_ok=True)
    return p
