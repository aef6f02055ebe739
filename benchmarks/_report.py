"""The text table run_all.py prints (also pasted into docs/performance.md)."""

from __future__ import annotations

from typing import Any


def _s(x: float | None, unit: str = "s", nd: int = 3) -> str:
    if x is None:
        return "-"
    if unit == "ms":
        return f"{x * 1000:.0f} ms"
    return f"{x:.{nd}f} {unit}".strip()


def _signed_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:+.0f} ms"


def _ok(v: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "-"}[v]


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _size(b: float | None) -> str:
    if b is None:
        return "-"
    return f"{b / 1e6:.1f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"


def _rows(head: list[str], rows: list[list[str]]) -> str:
    w = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    line = lambda r: "  " + "  ".join(str(c).ljust(n) for c, n in zip(r, w, strict=True))  # noqa: E731
    return "\n".join([line(head), line(["-" * n for n in w]), *map(line, rows)])


def table(res: dict[str, Any]) -> str:
    m = res["machine"]
    out = [f"recursa speed benchmarks - {m['cpus']} cores, load average "
           f"{m['loadavg_start'][0]:.1f} -> {m.get('loadavg_end', [0])[0]:.1f}, "
           f"{res['rounds']} round(s){' (quick)' if res['quick'] else ''}; reference: "
           f"{res['reference']}"]
    b = res["benchmarks"]

    if "overhead" in b:
        o = b["overhead"]
        out.append("\n1. Per-completion overhead, two-turn run, instant server "
                   "(target: recursa <= 1/10 of rlms)")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for side, s in o["sides"].items():
                st = s.get("overhead_s", {})
                rows.append([side, str(st.get("n", 0)), _s(st.get("median"), "ms"),
                             _s(st.get("p90"), "ms"), _x(s.get("ratio_to_rlms")),
                             _ok(s.get("target_met")),
                             _s((s.get("cpu_s") or {}).get("median"), "ms"),
                             _x(s.get("cpu_ratio_to_rlms")),
                             s.get("error", "") or (f"{s['n_wrong']} wrong" if s.get("n_wrong")
                                                    else "")])
            out.append(_rows(["side", "n", "median", "p90", "vs rlms", "target", "CPU",
                              "CPU vs rlms", "note"], rows))

    if "bigcontext" in b:
        o = b["bigcontext"]
        out.append(f"\n2. {o.get('context_mb', 40):.0f} MB context, regex question in two turns "
                   "(targets: time <= 1/3 rlms, trace < 1 MB, peak host+sandbox RSS < 400 MB)")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for side, s in o["sides"].items():
                if "error" in s:
                    rows.append([side, "error", "", "", "", "", "", "", s["error"][:60]])
                    continue
                t = s.get("targets", {})
                mem = s.get("memory") or {}
                rows.append([side, _s(s["time_s"]["median"]), _x(s.get("ratio_to_rlms")),
                             _ok(t.get("time_le_third_of_rlms")),
                             _size(s["trace_bytes"]["max"]), _ok(t.get("trace_lt_1mb")),
                             f"{mem.get('peak_tree_rss_mb', '-')} MB",
                             _ok(t.get("peak_lt_400mb")),
                             f"{s['n_wrong']} wrong" if s.get("n_wrong") else "answer ok"])
            out.append(_rows(["side", "median", "vs rlms", "target", "trace", "target",
                              "peak RSS", "target", "note"], rows))

    if "batch" in b:
        o = b["batch"]
        out.append(f"\n3. {o.get('subcalls', 80)} sub-calls in one batch, server latency "
                   f"{o.get('latency_s', 0.2)} s (target: within 15 % of the raw client "
                   "(floor-raw-http) at the same concurrency; ideal = latency x "
                   "(ceil(80/concurrency) + 2 root turns))")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for r in o["rows"]:
                st = r.get("time_s", {})
                over, raw = r.get("over_ideal"), r.get("over_raw")
                rows.append([r["side"], str(r["concurrency"]), _s(r["ideal_s"], nd=2),
                             _s(st.get("median")), "-" if over is None else f"{over:+.0%}",
                             "-" if raw is None else f"{raw:+.0%}",
                             _s((r.get("host_cpu_s") or {}).get("median")),
                             _ok(r.get("target_met")), str(r.get("waves_per_run", "-")),
                             r.get("error", "")[:60] or (f"{r['n_wrong']} wrong"
                                                         if r.get("n_wrong") else "")])
            out.append(_rows(["side", "concurrency", "ideal", "median", "over ideal", "vs raw",
                              "CPU", "target", "waves/run", "note"], rows))

    if "tree" in b:
        o = b["tree"]
        out.append(f"\n4a. Depth 2: {o.get('children')} child RLMs in one batch, each with "
                   f"{o.get('subcalls_per_child')} sub-calls; latency {o.get('latency_s')} s, "
                   f"ideal {o.get('ideal_s')} s")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for side, s in o["sides"].items():
                if "error" in s:
                    rows.append([side, "error", "", s["error"][:70]])
                    continue
                st = s["time_s"]
                rows.append([side, _s(st.get("median")), f"{s['runs_wrong']}/{s['runs']}",
                             "" if not s["runs_wrong"] else
                             next((x for x in s["samples"] if x != "ok"), "")[:70]])
            out.append(_rows(["side", "median", "runs wrong", "note"], rows))

    if "concurrent" in b:
        o = b["concurrent"]
        out.append(f"\n4b. Concurrent runs in one process (recursa: asyncio; rlms: threads); "
                   f"latency {o.get('latency_s')} s, ideal {o.get('ideal_s')} s per run")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for r in o["rows"]:
                st = r.get("wall_s", {})
                mem = r.get("memory") or {}
                rows.append([r["side"], str(r["runs"]), _s(st.get("median")),
                             f"{r.get('throughput_runs_per_s', '-')} /s",
                             f"{r['runs_wrong']}/{r['runs_total']}",
                             f"{mem.get('peak_tree_rss_mb', '-')} MB",
                             (r.get("error") or (r["wrong"][0] if r.get("wrong") else ""))[:70]])
            out.append(_rows(["side", "runs", "wall", "throughput", "wrong", "peak RSS",
                              "note"], rows))
    if "startup" in b:
        o = b["startup"]
        out.append(f"\n5a. First completion in a fresh process vs warm ones (medians over "
                   f"{o.get('processes')} fresh processes; target: first - warm <= "
                   f"{o.get('first_target_s')} s)")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for side, s in o["sides"].items():
                rows.append([side, _s((s.get("build_s") or {}).get("median"), "ms"),
                             _s((s.get("first_s") or {}).get("median"), "ms"),
                             _s((s.get("warm_s") or {}).get("median"), "ms"),
                             _s((s.get("delta_s") or {}).get("median"), "ms"),
                             _ok(s.get("target_met")), s.get("error", "")[:60]])
            out.append(_rows(["side", "import+RLM()", "first", "warm", "first - warm", "target",
                              "note"], rows))
            out.append(f"\n5b. `recursa run` from process spawn to its first model request "
                       f"(target: <= {o.get('cli_target_s')} s)")
            rows = []
            for row, c in o.get("cli", {}).items():
                st = c.get("to_first_request_s", {})
                label = row if row.startswith(("recursa", "floor")) else f"recursa-{row}"
                rows.append([label, str(st.get("n", 0)),
                             _s(st.get("median"), "ms"), _s(st.get("min"), "ms"),
                             _s(st.get("max"), "ms"), _ok(c.get("target_met")),
                             _s((c.get("run_cpu_s") or {}).get("median"), "ms"),
                             "; ".join(c.get("errors", []))[:60]])
            out.append(_rows(["side", "n", "median", "min", "max", "target",
                              "CPU of the whole run", "note"], rows))
            out.append("  floor: python + asyncio + pydantic (one model) + httpx (without trio, h2, "
                       "click) + one request: the least a command on this stack does. "
                       f"Plain venv: {o.get('plain_venv', '-')}")

    if "serve" in b:
        o = b["serve"]
        out.append(f"\n6. `recursa serve`: {o.get('requests')} concurrent chat completions, "
                   f"upstream latency {o.get('latency_s')} s (ideal {o.get('ideal_s')} s per "
                   "request); served-LOOP = through the server on that event loop; direct = "
                   "RLM.acompletion in one "
                   "process with one shared client, as the server has; direct-per-run = with "
                   "the clients RLM builds per completion")
        if "error" in o:
            out.append(f"  error: {o['error']}")
        else:
            rows = []
            for r in o["rows"]:
                for mode in ("direct", "direct-per-run", "served-asyncio", "served-uvloop"):
                    if mode not in r:
                        continue
                    m = r[mode]
                    if "error" in m:
                        rows.append([r["side"], mode, "error", "", "", "", "", m["error"][:60]])
                        continue
                    rows.append([r["side"], mode, f"{m.get('answered')}/{m.get('total')}",
                                 _s(m.get("p50_s"), "ms"), _s(m.get("p99_s"), "ms"),
                                 _s((m.get("wall_s") or {}).get("median"), "ms"),
                                 "" if not mode.startswith("served") else
                                 f"{_signed_ms(m.get('overhead_p50_s'))} p50, "
                                 f"{_signed_ms(m.get('overhead_wall_s'))} wall",
                                 (m.get("wrong") or [""])[0][:60]])
            out.append(_rows(["side", "path", "answered", "p50", "p99", "wave wall",
                              "server overhead", "note"], rows))
    return "\n".join(out)
