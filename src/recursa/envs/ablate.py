"""Ablation reports: per variant, mean reward with a 95% confidence interval, root and sub-model
tokens, sub-calls, tool calls and wall-clock time; as a Markdown table and as an SVG chart
(drawn by hand: no plotting dependency)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from pathlib import Path

from recursa.envs.rollout import Rollout

# two-sided 95% Student-t critical values, df 1..30 (small n is the norm on a laptop)
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t interval); half-width is nan below two samples."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return m, t * sd / math.sqrt(n)


@dataclass
class VariantStats:
    variant: str
    n: int
    errors: int
    reward: float
    reward_ci: float
    root_in: float
    root_out: float
    sub_in: float
    sub_out: float
    subcalls: float
    tool_calls: float
    wall_s: float
    wall_ci: float


def summarize(rollouts: list[Rollout], variants: list[str] | None = None) -> list[VariantStats]:
    order = variants or list(dict.fromkeys(r.variant for r in rollouts))
    out = []
    for v in order:
        rs = [r for r in rollouts if r.variant == v]
        if not rs:
            continue

        def avg(attr: str, rs: list[Rollout] = rs) -> float:
            return sum(getattr(r, attr) for r in rs) / len(rs)

        rew, rew_ci = mean_ci([r.reward for r in rs])
        wall, wall_ci = mean_ci([r.elapsed_s for r in rs])
        out.append(VariantStats(
            variant=v, n=len(rs), errors=sum(1 for r in rs if r.status == "error"),
            reward=rew, reward_ci=rew_ci, root_in=avg("root_input_tokens"),
            root_out=avg("root_output_tokens"), sub_in=avg("sub_input_tokens"),
            sub_out=avg("sub_output_tokens"), subcalls=avg("subcalls"),
            tool_calls=avg("tool_calls"), wall_s=wall, wall_ci=wall_ci))
    return out


def _pm(m: float, h: float, fmt: str = "{:.2f}") -> str:
    return fmt.format(m) + ("" if math.isnan(h) else " ± " + fmt.format(h))


def table(stats: list[VariantStats]) -> str:
    head = ("| variant | n | errors | reward (mean ± 95% CI) | root prompt tok | root completion "
            "tok | sub prompt tok | sub completion tok | sub-calls | tool calls | wall s |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = [f"| {s.variant} | {s.n} | {s.errors} | {_pm(s.reward, s.reward_ci)} | "
            f"{s.root_in:,.0f} | {s.root_out:,.0f} | {s.sub_in:,.0f} | {s.sub_out:,.0f} | "
            f"{s.subcalls:.1f} | {s.tool_calls:.1f} | {_pm(s.wall_s, s.wall_ci, '{:.1f}')} |"
            for s in stats]
    return head + "\n".join(rows) + "\n"


_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]


def svg_chart(stats: list[VariantStats], title: str = "") -> str:
    """Four bar panels (reward with CI, root tokens, sub-model tokens, wall time) in one SVG."""
    panels = [("reward (mean, 95% CI)", [s.reward for s in stats], [s.reward_ci for s in stats]),
              ("root tokens (prompt+completion)", [s.root_in + s.root_out for s in stats], None),
              ("sub-model tokens (prompt+completion)", [s.sub_in + s.sub_out for s in stats],
               None),
              ("wall-clock s per rollout", [s.wall_s for s in stats], [s.wall_ci for s in stats])]
    pw, ph, pad = 260, 200, 40
    width, height = pw * len(panels) + pad, ph + 90
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">'
             f'{escape(title)}</text>']
    for p, (label, vals, cis) in enumerate(panels):
        x0, y0 = pad + p * pw, 40
        top = max([v + (c if cis and not math.isnan(c) else 0)
                   for v, c in zip(vals, cis or [0.0] * len(vals), strict=True)] + [1e-9])
        if label.startswith("reward"):
            top = max(top, 1.0)
        scale = (ph - 20) / top
        parts.append(f'<text x="{x0 + (pw - pad) / 2}" y="{y0 - 6}" text-anchor="middle">'
                     f'{escape(label)}</text>')
        parts.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw - pad}" y2="{y0 + ph}" '
                     'stroke="#333"/>')
        bw = (pw - pad) / max(1, len(vals))
        for i, v in enumerate(vals):
            h = 0 if math.isnan(v) else v * scale
            bx = x0 + i * bw + bw * 0.15
            parts.append(f'<rect x="{bx:.1f}" y="{y0 + ph - h:.1f}" width="{bw * 0.7:.1f}" '
                         f'height="{h:.1f}" fill="{_COLORS[i % len(_COLORS)]}"/>')
            shown = "nan" if math.isnan(v) else (f"{v:.2f}" if top < 10 else f"{v:,.0f}")
            parts.append(f'<text x="{bx + bw * 0.35:.1f}" y="{y0 + ph - h - 4:.1f}" '
                         f'text-anchor="middle">{shown}</text>')
            if cis and not math.isnan(cis[i]) and not math.isnan(v):
                cx = bx + bw * 0.35
                lo, hi = max(0.0, v - cis[i]) * scale, (v + cis[i]) * scale
                parts.append(f'<line x1="{cx:.1f}" y1="{y0 + ph - lo:.1f}" x2="{cx:.1f}" '
                             f'y2="{y0 + ph - hi:.1f}" stroke="black"/>')
            parts.append(f'<text x="{bx + bw * 0.35:.1f}" y="{y0 + ph + 14}" '
                         f'text-anchor="middle">{escape(stats[i].variant)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_report(rollouts: list[Rollout], out_dir: str | Path, *, env: str, command: str,
                 variants: list[str] | None = None, notes: str = "") -> Path:
    """report.md (command, table, per-rollout list) and ablation.svg in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats = summarize(rollouts, variants)
    (out / "ablation.svg").write_text(svg_chart(stats, f"recursa ablation: {env}"),
                                      encoding="utf-8")
    lines = [f"# Ablation: {env}", "", "```", command, "```", "", table(stats), "",
             "![ablation chart](ablation.svg)", ""]
    if notes:
        lines += [notes.strip(), ""]
    lines += ["## Rollouts", "", "| variant | seed | reward | status | turns | sub-calls | "
              "tool calls | wall s | answer |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rollouts, key=lambda r: (r.variant, r.seed)):
        ans = " ".join((r.answer or r.error or "").split())[:60].replace("|", "\\|")
        lines.append(f"| {r.variant} | {r.seed} | {r.reward:.2f} | {r.status} | {r.turns} | "
                     f"{r.subcalls} | {r.tool_calls} | {r.elapsed_s:.1f} | {ans} |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
