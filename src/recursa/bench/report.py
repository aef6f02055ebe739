"""Tables and plots from bench rows.

Mean score per task / method / length with a 95% confidence interval from a **percentile
bootstrap** (resampling the instances with replacement, 2,000 resamples, fixed seed): scores are
bounded in [0, 1] and often all-or-nothing, where a t interval would run past 0 or 1 and assume a
normality small samples do not have. With n = 1 the interval is the point itself.

Plots (PNG, matplotlib's Agg backend, no display needed): score against input length per method,
one panel per task (the shape of the RLM paper's first figure); and cost against score, where
the cost axis is USD when any run had a non-zero known price and total tokens otherwise (a free
local model costs $0 everywhere, and tokens are then the honest measure of work).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .baselines import BASELINES, NO_LABEL_BASELINES
from .runner import format_length, load_rows

CI_METHOD = "95% percentile bootstrap over instances (2,000 resamples, seed 0)"


def bootstrap_ci(values: list[float], resamples: int = 2000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean."""
    if not values:
        return (float("nan"), float("nan"))
    if len(values) == 1 or len(set(values)) == 1:
        return (values[0], values[0])
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    lo = means[int(alpha / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 - alpha / 2) * resamples))]
    return (lo, hi)


@dataclass
class Cell:
    task: str
    method: str
    length: int | None          # None: all lengths together
    n: int
    mean: float
    lo: float
    hi: float
    errors: int
    overflow: int               # inputs beyond the model's window (direct)
    cost: float | None          # mean USD per instance; None when any cost is unknown
    root_tokens: float
    sub_tokens: float
    wall_s: float
    by_seed: dict[int, float] = field(default_factory=dict)   # for the paired test


def summarise(rows: list[dict[str, Any]], resamples: int = 2000) -> list[Cell]:
    groups: dict[tuple[str, str, int | None], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["method"], int(r["length"]))].append(r)
        groups[(r["task"], r["method"], None)].append(r)
    cells = []
    for (task, method, length), rs in groups.items():
        scores = [float(r.get("score") or 0.0) for r in rs]
        lo, hi = bootstrap_ci(scores, resamples)
        costs = [r.get("cost_usd") for r in rs]
        known = [float(c) for c in costs if c is not None]
        cells.append(Cell(
            task=task, method=method, length=length, n=len(rs), mean=statistics.fmean(scores),
            lo=lo, hi=hi, errors=sum(r.get("status") == "error" for r in rs),
            overflow=sum(r.get("limit") == "context_window" for r in rs),
            cost=None if len(known) < len(costs) else statistics.fmean(known),
            root_tokens=statistics.fmean(
                r.get("root_input_tokens", 0) + r.get("root_output_tokens", 0) for r in rs),
            sub_tokens=statistics.fmean(
                r.get("sub_input_tokens", 0) + r.get("sub_output_tokens", 0) for r in rs),
            wall_s=statistics.fmean(float(r.get("wall_s") or 0.0) for r in rs),
            by_seed=({int(r["seed"]): float(r.get("score") or 0.0) for r in rs}
                     if length is not None else {})))
    cells.sort(key=lambda c: (c.task, c.method, c.length is None, c.length or 0))
    return cells


def _cost(c: Cell) -> str:
    return "unknown" if c.cost is None else f"${c.cost:.4f}"


HEADERS = ["method", "length", "n", "score", "95% CI", "vs best baseline", "labelled ref.",
           "errors", "cost/inst", "root tok", "sub tok", "time s"]
REFERENCE = "classifier"     # trained on dev labels: shown beside, never the best baseline


def is_baseline(method: str) -> bool:
    return method in BASELINES


def sign_test(a: dict[int, float], b: dict[int, float]) -> tuple[int, int, float]:
    """Exact two-sided sign test of paired scores (the seeds both have): wins of a, losses of
    a, and the p-value (ties dropped; p = 1 with no untied pair)."""
    wins = sum(a[s] > b[s] for s in a.keys() & b.keys())
    losses = sum(a[s] < b[s] for s in a.keys() & b.keys())
    n = wins + losses
    if n == 0:
        return 0, 0, 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return wins, losses, min(1.0, 2 * tail)


def best_baselines(cells: list[Cell]) -> dict[tuple[str, int | None], Cell]:
    """The best baseline of each (task, length) cell (length None: all lengths) among those that
    need no labelled examples (the classifier is a reference beside it)."""
    best: dict[tuple[str, int | None], Cell] = {}
    for c in cells:
        if c.method in NO_LABEL_BASELINES:
            k = (c.task, c.length)
            if k not in best or c.mean > best[k].mean:
                best[k] = c
    return best


def reference_cells(cells: list[Cell]) -> dict[tuple[str, int | None], Cell]:
    return {(c.task, c.length): c for c in cells if c.method == REFERENCE}


def versus(c: Cell, best: dict[tuple[str, int | None], Cell]) -> str:
    """How a method stands against the best baseline of its cell. 'beats' needs the lower end
    of its interval above the baseline's mean; a mean above it with an interval reaching below
    is 'above (CI overlaps)'; anything else does not beat it."""
    if is_baseline(c.method):
        return "(baseline)"
    b = best.get((c.task, c.length))
    if b is None:
        return "no baseline run"
    if c.mean <= b.mean:
        return f"NOT above {b.method} {b.mean:.2f}"
    paired = ""
    if c.by_seed and b.by_seed:
        w, lo, p = sign_test(c.by_seed, b.by_seed)
        paired = f"; sign test {w}+/{lo}-, p={p:.2g}"
    if c.lo > b.mean:
        return f"beats {b.method} {b.mean:.2f}{paired}"
    return f"above {b.method} {b.mean:.2f} (CI overlaps{paired})"


def reference(c: Cell, refs: dict[tuple[str, int | None], Cell]) -> str:
    r = refs.get((c.task, c.length))
    return "-" if r is None or c.method == REFERENCE else f"{r.mean:.2f}"


def _cells_row(c: Cell, best: dict[tuple[str, int | None], Cell] | None = None,
               refs: dict[tuple[str, int | None], Cell] | None = None) -> list[str]:
    err = str(c.errors) + (f" ({c.overflow} over window)" if c.overflow else "")
    return [c.method, "all" if c.length is None else format_length(c.length), str(c.n),
            f"{c.mean:.2f}", f"[{c.lo:.2f}, {c.hi:.2f}]", versus(c, best or {}),
            reference(c, refs or {}), err, _cost(c),
            f"{c.root_tokens:,.0f}", f"{c.sub_tokens:,.0f}", f"{c.wall_s:.1f}"]


def markdown(cells: list[Cell], rows: list[dict[str, Any]]) -> str:
    out = [f"Scores are means over instances; the interval is a {CI_METHOD}. Tokens and time "
           "are means per instance; 'errors' counts runs that produced no usable answer "
           "(an input over the model's window is one).", ""]
    models = sorted({f"{r['model']} (sub: {r.get('sub_model') or r['model']})" for r in rows
                     if not is_baseline(r["method"])})
    out.append("Models: " + "; ".join(models))
    splits = sorted({str(r.get("split") or "test (no split)") for r in rows})
    out.append("Split: " + ", ".join(splits))
    out += ["", "Baselines (no model, no cost): `grep` (the query's rarest words: the line "
            "holding them, or for a count the number of such lines), `regex` (the commonest "
            "value of the answer's shape), `constant` (the commonest gold over dev seeds); on "
            "the real-label families also `lexicon` (VADER / keyword lists) and `embed` "
            "(zero-shot MiniLM similarity), each labelling every record. 'vs best baseline' "
            "compares each method with the best of these in the same cell: 'beats' when the "
            "lower end of its interval is above the baseline's mean, with an exact two-sided "
            "sign test over the seeds both ran beside it, 'NOT above' when its mean is not "
            "higher. 'labelled ref.' is the `classifier` (TF-IDF + logistic regression trained "
            "on the dev half's labels, which no other method sees): a reference, never the "
            "best baseline."]
    best = best_baselines(cells)
    refs = reference_cells(cells)
    for task in sorted({c.task for c in cells}):
        out += ["", f"### {task}", "", "| " + " | ".join(HEADERS) + " |",
                "|" + "---|" * len(HEADERS)]
        out += ["| " + " | ".join(_cells_row(c, best, refs)) + " |"
                for c in cells if c.task == task]
    return "\n".join(out) + "\n"


def print_tables(cells: list[Cell], console: Any) -> None:
    from rich.table import Table
    best = best_baselines(cells)
    refs = reference_cells(cells)
    for task in sorted({c.task for c in cells}):
        t = Table(title=f"{task}  (score: mean, {CI_METHOD})", title_justify="left")
        for h in HEADERS:
            t.add_column(h, justify="left" if h == "method" else "right")
        prev = None
        for c in (c for c in cells if c.task == task):
            if prev is not None and c.method != prev:
                t.add_section()
            prev = c.method
            t.add_row(*_cells_row(c, best, refs))
        console.print(t)


# ---------------------------------------------------------------- plots
def _plt() -> Any:
    import matplotlib
    matplotlib.use("Agg")    # files only; never needs a display
    import matplotlib.pyplot as plt
    return plt


def _legend_below(fig: Any, axes: Any) -> None:
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center",
               ncol=min(len(handles), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))


BASELINE_COLOURS = {"grep": "0.35", "regex": "0.55", "constant": "0.75", "lexicon": "tan",
                    "embed": "rosybrown", "classifier": "0.15"}


def plot_score_vs_length(cells: list[Cell], path: Path) -> Path:
    plt = _plt()
    tasks = sorted({c.task for c in cells})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.4 * len(tasks), 4.0), squeeze=False,
                             sharey=True)
    methods = sorted({c.method for c in cells})
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, method in enumerate(methods):
            pts = sorted((c for c in cells if c.task == task and c.method == method
                          and c.length is not None), key=lambda c: c.length or 0)
            if not pts:
                continue
            # dodge: methods side by side around each length, so equal scores stay visible
            shift = 2 ** (0.06 * (i - (len(methods) - 1) / 2))
            xs = [(c.length or 0) * shift for c in pts]
            ys = [c.mean for c in pts]
            err = [[c.mean - c.lo for c in pts], [c.hi - c.mean for c in pts]]
            if is_baseline(method):     # no-model baselines: grey dashed, every panel
                ax.errorbar(xs, ys, yerr=err, marker="x", capsize=2, linestyle="--",
                            color=BASELINE_COLOURS[method], alpha=0.8,
                            label=f"{method} (baseline)")
            else:
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=method)
        ax.set_xscale("log", base=2)
        lengths = sorted({c.length for c in cells if c.task == task and c.length})
        ax.set_xticks(lengths, [format_length(x) for x in lengths])
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(task)
        ax.set_xlabel("input length (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("score (mean, 95% CI)")
    _legend_below(fig, axes)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cost_vs_score(cells: list[Cell], path: Path) -> Path:
    plt = _plt()
    per_len = [c for c in cells if c.length is not None]
    use_usd = any(c.cost for c in per_len)
    tasks = sorted({c.task for c in per_len})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.4 * len(tasks), 4.0), squeeze=False,
                             sharey=True)
    markers = "osD^vP*X"
    methods = sorted({c.method for c in per_len})
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, method in enumerate(methods):
            pts = [c for c in per_len if c.task == task and c.method == method]
            if not pts:
                continue
            if is_baseline(method):
                # a baseline spends nothing, so it has no place on the cost axis: a line at
                # its best score over the lengths shows what any method must beat
                ax.axhline(max(c.mean for c in pts), linestyle="--", linewidth=1,
                           color=BASELINE_COLOURS[method], label=f"{method} (baseline, best)")
                continue
            xs = [(c.cost or 0.0) if use_usd else c.root_tokens + c.sub_tokens for c in pts]
            ax.scatter(xs, [c.mean for c in pts], marker=markers[i % len(markers)],
                       label=method, s=40)
            for x, c in zip(xs, pts, strict=True):
                ax.annotate(format_length(c.length or 0), (x, c.mean), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        if not use_usd:
            from matplotlib.ticker import FuncFormatter, NullFormatter
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(task)
        ax.set_xlabel("mean cost per instance (USD)" if use_usd
                      else "mean tokens per instance (root + sub)")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("score (mean)")
    if not use_usd:
        fig.suptitle("every run cost $0 or an unknown amount: tokens stand in for cost",
                     fontsize=9)
    _legend_below(fig, axes)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(results: str | Path, *, out_dir: str | Path | None = None, plots: bool = True,
           resamples: int = 2000, console: Any = None) -> dict[str, Any]:
    """Print tables, write results.md and the PNG plots; returns what was written."""
    src = Path(results)
    if not src.exists():
        raise FileNotFoundError(f"no results at {src}")
    rows = load_rows(src)
    if not rows:
        raise ValueError(f"no result rows in {src}")
    cells = summarise(rows, resamples)
    out = Path(out_dir) if out_dir else (src if src.is_dir() else src.parent)
    out.mkdir(parents=True, exist_ok=True)
    if console is not None:
        print_tables(cells, console)
    md = out / "results.md"
    md.write_text(markdown(cells, rows), encoding="utf-8")
    written: dict[str, Any] = {"rows": len(rows), "cells": cells, "markdown": md}
    if plots:
        written["score_vs_length"] = plot_score_vs_length(cells, out / "score_vs_length.png")
        written["cost_vs_score"] = plot_cost_vs_score(cells, out / "cost_vs_score.png")
    if console is not None:
        console.print(f"[dim]{len(rows)} rows; wrote {md}"
                      + ("" if not plots else f", {written['score_vs_length']}, "
                         f"{written['cost_vs_score']}") + "[/]")
    return written
