"""Figures of a sweep report (PNG, matplotlib Agg), made to be read at a glance.

    val_curves.png     the metric vs optimizer steps per group: mean over finite seeds, band = min..max over seeds;
                       a log axis labelled with plain numbers (no "2.4 x 10^1"), limits that hold every band
    delta_curves.png   small multiples, one panel per claim (the control first, on its own panel): the claim's
                       paired change in % at every validation (the geometric-mean change, as the tables), its 95%
                       interval over seeds as the band, the zero line and E (dashed: the paper's change in our
                       unit, or the control's planted size); title: final change and the verdict
    val_curves.png     (as above) without the control's group, which would flatten the arms' differences
    stability.png      pre-clip gradient norm and cumulative loss spikes; a panel without data says so in words
    ppl_vs_tokens.png  the metric vs training tokens (dots: each seed's final value)

Groups are told apart by colour and line style (10 colours x 4 styles); files stay well under 300 KB (100 dpi).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lightning_cqk.study.results_model import StudyData

STYLES = ("-", "--", ":", "-.")


def _plain(ax, axis: str = "y") -> None:
    """Plain-number tick labels on a log axis (10, 20, 50 rather than 10^1, 2 x 10^1)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def _finite(xs: list[float]) -> list[float]:
    return [x for x in xs if math.isfinite(x)]


def _band(runs: list[dict[str, Any]], tag: str, x_of=None):
    """(xs, mean, low, high) over the steps every run logged; low/high = min/max over finite seeds."""
    series = [dict(r["scalars"].get(tag) or []) for r in runs]
    if not series or not all(series):
        return [], [], [], []
    steps = sorted(set.intersection(*(set(s) for s in series)))
    xs, ms, lo, hi = [], [], [], []
    for step in steps:
        vals = _finite([s[step] for s in series])
        if not vals:
            continue
        xs.append(x_of(runs[0], step) if x_of else step + 1)  # TensorBoard step s: after s + 1 optimizer steps
        ms.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return xs, ms, lo, hi


def claim_curve(groups: dict[str, Any], plus: list[str], minus: list[str], tag: str):
    """(steps, mean, low, high): a claim's paired change over training in % (the log contrast of its groups per
    seed at every validation all of them logged, as the tables), with the 95% t interval over seeds."""
    from scipy import stats

    named = [*plus, *minus]
    if not all(g in groups for g in named):
        return [], [], [], []
    by = {g: {r["seed"]: dict(r["scalars"].get(tag) or []) for r in groups[g].runs} for g in named}
    seeds = sorted(set.intersection(*(set(by[g]) for g in named)))
    if not seeds:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(by[g][s]) for g in named for s in seeds)))
    xs, ms, lo, hi = [], [], [], []
    for step in steps:
        d = []
        for s in seeds:
            vals = [by[g][s][step] for g in named]
            if all(math.isfinite(v) and v > 0 for v in vals):
                d.append(sum(math.log(by[g][s][step]) for g in plus) - sum(math.log(by[g][s][step]) for g in minus))
        if len(d) < 2:
            continue
        mean = sum(d) / len(d)
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
        half = float(stats.t.ppf(0.975, len(d) - 1)) * sd / math.sqrt(len(d))
        xs.append(step + 1)  # TensorBoard step s: after s + 1 optimizer steps
        ms.append(100.0 * math.expm1(mean))
        lo.append(100.0 * math.expm1(mean - half))
        hi.append(100.0 * math.expm1(mean + half))
    return xs, ms, lo, hi


def _style(i: int, cmap) -> dict[str, Any]:
    return {"color": cmap(i % 10), "linestyle": STYLES[(i // 10) % len(STYLES)]}


def figures(data: StudyData, out: Path, judgements: list | None = None) -> list[Path]:
    """Write the PNG figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = data.manifest["spec"]
    metric = spec.get("metric", "val/ppl")
    groups = {k: g for k, g in data.groups.items() if g.runs}
    cmap = plt.get_cmap("tab10")
    title = f"{data.manifest['study']} ({data.manifest['profile']})"
    written: list[Path] = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        written.append(out / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)

    def plot_bands(ax, tag: str, x_of=None) -> list[float]:
        shown: list[float] = []
        for i, (name, group) in enumerate(groups.items()):
            xs, ms, lo, hi = _band(group.runs, tag, x_of)
            if not xs:
                continue
            ax.plot(xs, ms, lw=1.4, label=f"{name} (n={len(group.runs)})", **_style(i, cmap))
            ax.fill_between(xs, lo, hi, color=cmap(i % 10), alpha=0.15, lw=0)
            shown += lo + hi
        return shown

    def fit_limits(ax, values: list[float], log: bool) -> None:
        vals = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
        if not vals:
            return
        lo, hi = min(vals), max(vals)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(lo / 1.05, hi * 1.05)
            _plain(ax)
        else:
            pad = 0.05 * (hi - lo or abs(hi) or 1.0)
            ax.set_ylim(lo - pad, hi + pad)

    # -- absolute curves (the control's group apart: its own panel)
    control_group = (spec.get("control") or {}).get("group")
    every = groups
    groups = {k: g for k, g in every.items() if k != control_group}
    fig, ax = plt.subplots(figsize=(8, 5))
    shown = plot_bands(ax, metric)
    fit_limits(ax, shown, log=metric == "val/ppl")
    ax.set(xlabel="optimizer steps", ylabel=metric, title=f"{title}: {metric}, mean over seeds (band: min-max)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper right", ncol=2 if len(groups) > 8 else 1)
    save(fig, "val_curves.png")
    groups = every

    # -- the paired change of every claim over training with its 95% band; the control on its own panel
    panels = [
        j
        for j in (judgements or [])
        if j.effect is not None and j.expect != "token_multiplier" and all(g in groups for g in [*j.plus, *j.minus])
    ]
    panels.sort(key=lambda j: not j.is_control)  # the control first, alone: its scale never flattens the claims
    if panels:
        cols = min(4, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(max(3.4 * cols, 7.0), 2.8 * rows + 0.6), squeeze=False)
        for k, j in enumerate(panels):
            ax = axes[k // cols][k % cols]
            xs, ms, lo, hi = claim_curve(groups, j.plus, j.minus, metric)
            ax.axhline(0.0, color="0.4", lw=0.8)
            color = "0.3" if j.is_control else cmap(k % 10)
            if xs:
                ax.plot(xs, ms, color=color, lw=1.4, marker=".", ms=3)
                ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
                target = j.expected_pct if j.is_control else j.converted_pct
                if math.isfinite(target):
                    ax.axhline(target, color=color, lw=0.9, ls="--")
                late = len(xs) // 5  # the first validations move by tens of %: the limits hold the last 80%
                fit_limits(ax, lo[late:] + hi[late:] + [0.0] + ([target] if math.isfinite(target) else []), log=False)
                label = "control " if j.is_control else ""
                # The title holds the table's change (each run's last validation); where the groups end at different
                # steps (a control on fewer tokens), the curve can only pair the steps they share.
                ends = {max(s for s, _ in r["scalars"].get(metric) or [(-1, 0)]) for g in [*j.plus, *j.minus]
                        for r in groups[g].runs}  # fmt: skip
                shared = f" (curve: the steps both logged, to {xs[-1]})" if len(ends) > 1 else ""
                ax.set_title(f"{label}{j.name}\nfinal {j.effect.delta_pct:+.2f}% · {j.verdict}{shared}", fontsize=7)
            else:
                ax.text(0.5, 0.5, "no paired seeds", ha="center", va="center", transform=ax.transAxes)
                ax.set_title(j.name, fontsize=7)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("optimizer steps", fontsize=7)
        for k in range(len(panels), rows * cols):
            axes[k // cols][k % cols].axis("off")
        fig.suptitle(
            f"{title}: change of {metric} per claim, %, paired by seed\n(band: 95% interval over seeds; dashed: E, "
            "the paper's change in our unit, or the control's planted size)",
            fontsize=8,
        )
        save(fig, "delta_curves.png")

    # -- stability
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    shown = plot_bands(axes[0], "train/grad_norm/total")
    if shown:
        fit_limits(axes[0], shown, log=True)
        axes[0].legend(fontsize=7, ncol=2 if len(groups) > 8 else 1)
        axes[0].grid(alpha=0.3, which="both")
    else:
        axes[0].text(
            0.5,
            0.5,
            "gradient norm not logged\n(GradNormMonitor is in callbacks/sweep.yaml)",
            ha="center",
            va="center",
            transform=axes[0].transAxes,
        )
    axes[0].set(xlabel="optimizer steps", ylabel="gradient norm (pre-clip)", title=f"{title}: gradient norm")
    spikes = [
        max((v for _, v in r["scalars"].get("train/spikes") or []), default=math.nan)
        for g in groups.values()
        for r in g.runs
    ]
    logged = [v for v in spikes if math.isfinite(v)]
    if logged and max(logged) > 0:
        plot_bands(axes[1], "train/spikes")
        axes[1].legend(fontsize=7, ncol=2 if len(groups) > 8 else 1)
        axes[1].grid(alpha=0.3)
        axes[1].set(xlabel="optimizer steps", ylabel="loss spikes (cumulative)")
    else:
        axes[1].axis("off")
        msg = (
            f"no loss spikes in any of the {len(logged)} runs\n(LossSpikeMonitor)"
            if logged
            else "loss spikes not logged\n(LossSpikeMonitor is in callbacks/sweep.yaml)"
        )
        axes[1].text(0.5, 0.5, msg, ha="center", va="center", fontsize=11, transform=axes[1].transAxes)
    axes[1].set_title(f"{title}: loss spikes")
    save(fig, "stability.png")

    # -- metric vs tokens
    def tokens_at(run: dict[str, Any], step: int) -> float:
        seen = dict(run["scalars"].get("train/tokens_seen") or [])
        return seen.get(step, (step + 1) * float(run["budget"].get("tokens_per_step") or 1))

    fig, ax = plt.subplots(figsize=(8, 5))
    shown = plot_bands(ax, metric, tokens_at)
    for i, group in enumerate(groups.values()):
        finals = [
            (float(r["budget"].get("tokens", 0)), (r["scalars"].get(metric) or [(0, math.nan)])[-1][1])
            for r in group.runs
        ]
        finals = [f for f in finals if math.isfinite(f[1])]
        ax.scatter([f[0] for f in finals], [f[1] for f in finals], color=cmap(i % 10), s=14, zorder=3)
    fit_limits(ax, shown, log=metric == "val/ppl")
    ax.set(xlabel="training tokens", ylabel=metric, title=f"{title}: {metric} vs tokens (dots: final, per seed)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper right", ncol=2 if len(groups) > 8 else 1)
    save(fig, "ppl_vs_tokens.png")
    return written
