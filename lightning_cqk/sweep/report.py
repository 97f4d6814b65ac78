"""Report of a sweep: tables (Markdown and CSV) and figures (PNG) from the runs' TensorBoard scalars.

    lightning_cqk report runs/coupling-cpu [--output DIR]

Reads `<sweep>/manifest.json` (written by `lightning_cqk sweep`: the spec, the groups and seeds of the runs) and,
for every run, its TensorBoard event files and `budget.json`, and writes into `<sweep>/report/` (or `--output`):

    <study>.md / <study>.csv   one row per group (a grid point; its seeds are the samples):
        final val ppl and val bpb, mean +- sample std over seeds (the last validation of each run);
        delta %: the change of the mean of the study's metric vs the baseline group (the same grid point with the
            spec's `baseline` levels), 100 * (mean / mean_baseline - 1);
        seed-var ratio: var(group) / var(baseline) of the metric over seeds (the coupled-QK paper's "8x seed
            variance" is this ratio for the uncoupled MLP vs coupled);
        p: Welch's t-test of the group's seeds vs the baseline's (two-sided; needs >= 2 seeds on both sides);
        tokens, FLOPs, train s: what the runs used (budget.json; mean over seeds);
        published: the paper's number for the group (spec `published.values`) and its change vs the paper's
            baseline (computed from the values, or `published.deltas` where the paper states only the change).
    val_curves.png       the metric vs optimizer steps trained, per group: mean over seeds, +-1 std band (min/max of 2)
    stability.png        pre-clip gradient norm (train/grad_norm/total) and cumulative loss spikes (train/spikes)
    ppl_vs_tokens.png    the metric vs training tokens, per group (the compute-matched view: equal tokens vs more)

A run's scalar value at a step is the last one written for that step (a resumed run re-logs the steps between its
checkpoint and where it was killed); its final value is the value at its largest step.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning_cqk.sweep.stats import mean, std, welch_t_test

VAL_METRICS = ("val/ppl", "val/bpb")
CURVE_TAGS = (
    "val/ppl",
    "val/bpb",
    "val/loss",
    "train/grad_norm/total",
    "train/spikes",
    "train/loss",
    "train/tokens_seen",
)


class ReportError(ValueError):
    """A sweep directory the report cannot read; the message says why."""


# --------------------------------------------------------------------------------------------------- reading
def read_scalars(run_dir: str | Path, tags: Iterable[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...] sorted by step} from the TensorBoard event files directly in `run_dir`.

    For a step written more than once (a resumed run), the value written last (by wall time) wins.
    """
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=False
    )
    acc.Reload()
    wanted = acc.Tags().get("scalars", [])
    if tags is not None:
        wanted = [t for t in wanted if t in set(tags)]
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in wanted:
        last: dict[int, tuple[float, float]] = {}
        for event in acc.Scalars(tag):
            if event.step not in last or event.wall_time >= last[event.step][0]:
                last[event.step] = (event.wall_time, float(event.value))
        out[tag] = [(step, last[step][1]) for step in sorted(last)]
    return out


def _read_manifest(sweep_dir: Path) -> dict[str, Any]:
    path = sweep_dir / "manifest.json"
    if not path.is_file():
        raise ReportError(
            f"{sweep_dir}: no manifest.json. `lightning_cqk report` reads a sweep directory written by "
            "`lightning_cqk sweep configs/ablations/<study>.yaml` (default runs/<study>-<profile>)."
        )
    return json.loads(path.read_text())


def collect(sweep_dir: str | Path) -> dict[str, Any]:
    """Everything the tables and figures need: per group, per run, the scalars and budget."""
    sweep_dir = Path(sweep_dir)
    manifest = _read_manifest(sweep_dir)
    groups: dict[str, dict[str, Any]] = {}
    missing = []
    for run in manifest["runs"]:
        group = groups.setdefault(run["group"], {"levels": run["levels"], "runs": []})
        run_dir = sweep_dir / run["name"]
        scalars = read_scalars(run_dir, CURVE_TAGS) if run_dir.is_dir() else {}
        budget_file = run_dir / "budget.json"
        budget = json.loads(budget_file.read_text()) if budget_file.is_file() else {}
        if not scalars.get("val/ppl") or not budget:
            missing.append(run["name"])
            continue
        group["runs"].append({"name": run["name"], "seed": run["seed"], "scalars": scalars, "budget": budget})
    return {"manifest": manifest, "groups": groups, "missing": missing}


# ---------------------------------------------------------------------------------------------------- tables
def _final(run: dict[str, Any], tag: str) -> float:
    series = run["scalars"].get(tag) or []
    return series[-1][1] if series else math.nan


def _baseline_group(levels: dict[str, str], baseline: dict[str, str], groups: dict[str, Any]) -> str | None:
    target = dict(levels, **baseline)
    for name, group in groups.items():
        if group["levels"] == target:
            return name
    return None


def table_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group with the numbers of the module docstring (floats; nan where not defined)."""
    spec = data["manifest"]["spec"]
    metric = spec.get("metric", "val/ppl")
    baseline = spec["baseline"]
    published = spec.get("published") or {}
    pub_values = published.get("values") or {}
    pub_deltas = published.get("deltas") or {}
    groups = data["groups"]
    rows = []
    for name, group in groups.items():
        runs = group["runs"]
        base_name = _baseline_group(group["levels"], baseline, groups)
        base_runs = groups[base_name]["runs"] if base_name else []
        values = [_final(r, metric) for r in runs]
        base_values = [_final(r, metric) for r in base_runs]
        row: dict[str, Any] = {"group": name, "baseline": base_name or "", "seeds": len(runs)}
        for tag in VAL_METRICS:
            xs = [_final(r, tag) for r in runs]
            row[f"{tag}_mean"], row[f"{tag}_std"] = mean(xs), std(xs)
        m, mb = mean(values), mean(base_values)
        row["delta_pct"] = 100.0 * (m / mb - 1.0) if base_values and mb else math.nan
        var, var_b = std(values) ** 2, std(base_values) ** 2
        row["seed_var_ratio"] = var / var_b if var_b and var_b > 0 else math.nan
        row["p_welch"] = welch_t_test(values, base_values)[2] if name != base_name else math.nan
        for key in ("tokens", "flops", "wallclock"):
            row[key] = mean([float(r["budget"].get(key, math.nan)) for r in runs])
        pub, pub_base = pub_values.get(name), pub_values.get(base_name) if base_name else None
        row["published"] = float(pub) if pub is not None else math.nan
        row["published_delta_pct"] = (
            100.0 * (float(pub) / float(pub_base) - 1.0) if pub is not None and pub_base else math.nan
        )
        if name in pub_deltas:  # the paper states only the change for this group
            row["published_delta_pct"] = float(pub_deltas[name])
        rows.append(row)
    return rows


def _fmt(x: float, spec: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _si(x: float) -> str:
    if math.isnan(x):
        return "–"
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _pm(m: float, s: float, digits: int) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if not math.isnan(s) else f"{m:.{digits}f}"


def markdown(data: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The study's Markdown report (header, table, notes)."""
    manifest = data["manifest"]
    spec = manifest["spec"]
    metric = spec.get("metric", "val/ppl")
    published = spec.get("published") or {}
    with_published = bool(published.get("values") or published.get("deltas"))  # columns only where there are numbers
    lines = [f"## {spec.get('title', manifest['study'])} ({manifest['study']}, {manifest['profile']} profile)", ""]
    if spec.get("paper") or spec.get("claim"):
        lines += [f"{spec.get('paper', '')}: {spec.get('claim', '')}".strip(": "), ""]
    pub_head = f" | published {published.get('metric', metric)} | published Δ %" if with_published else ""
    lines.append(
        f"| group | seeds | val ppl | val bpb | Δ {metric} vs baseline % | seed-var ratio | p (Welch) | tokens | FLOPs"
        f" | train s{pub_head} |"
    )
    lines.append("|" + "---|" * (10 + (2 if with_published else 0)))
    for r in rows:
        is_base = r["group"] == r["baseline"]
        cells = [
            f"{r['group']}{' (baseline)' if is_base else ''}",
            str(r["seeds"]),
            _pm(r["val/ppl_mean"], r["val/ppl_std"], 2),
            _pm(r["val/bpb_mean"], r["val/bpb_std"], 4),
            "–" if is_base else _fmt(r["delta_pct"], "+.2f"),
            "–" if is_base else _fmt(r["seed_var_ratio"], ".2f"),
            _fmt(r["p_welch"], ".3f"),
            _si(r["tokens"]),
            _si(r["flops"]),
            _fmt(r["wallclock"], ".0f"),
        ]
        if with_published:
            cells += [_fmt(r["published"], ".2f"), "–" if is_base else _fmt(r["published_delta_pct"], "+.1f")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    notes = [
        f"Mean ± sample std over seeds of the last validation; Δ and p compare the study metric ({metric}) with "
        f"the baseline group ({', '.join(f'{k}={v}' for k, v in spec['baseline'].items())}, same other levels).",
    ]
    if published:
        notes.append(f"Published: {published.get('source', 'the paper')}.")
    if data["missing"]:
        notes.append(f"Runs without a finished validation (left out): {', '.join(data['missing'])}.")
    lines += notes
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "group",
    "baseline",
    "seeds",
    "val/ppl_mean",
    "val/ppl_std",
    "val/bpb_mean",
    "val/bpb_std",
    "delta_pct",
    "seed_var_ratio",
    "p_welch",
    "tokens",
    "flops",
    "wallclock",
    "published",
    "published_delta_pct",
)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items() if k in CSV_FIELDS})
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------- figures
def _band(runs: list[dict[str, Any]], tag: str, x_of=None) -> tuple[list[float], list[float], list[float]]:
    """Mean and +-1 std (min/max for two seeds) of a tag over seeds at the steps every run logged."""
    series = [dict(r["scalars"].get(tag) or []) for r in runs]
    if not series or not all(series):
        return [], [], []
    steps = sorted(set.intersection(*(set(s) for s in series)))
    xs, lo, hi, ms = [], [], [], []
    for step in steps:
        vals = [s[step] for s in series]
        m = mean(vals)
        if len(vals) == 2:
            low, high = min(vals), max(vals)
        elif len(vals) > 2:
            low, high = m - std(vals), m + std(vals)
        else:
            low = high = m
        xs.append(x_of(runs[0], step) if x_of else step + 1)  # TensorBoard step s = after s + 1 optimizer steps
        ms.append(m)
        lo.append(low)
        hi.append(high)
    return xs, ms, list(zip(lo, hi, strict=True))  # type: ignore[return-value]


def figures(data: dict[str, Any], out: Path) -> list[Path]:
    """Write the PNG figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = data["manifest"]["spec"]
    metric = spec.get("metric", "val/ppl")
    groups = {k: g for k, g in data["groups"].items() if g["runs"]}
    colors = plt.get_cmap("tab20" if len(groups) > 10 else "tab10")
    written = []

    def tokens_at(run: dict[str, Any], step: int) -> float:
        """Tokens trained when step `step` was logged: the run's train/tokens_seen there, else (step + 1) x B x T."""
        seen = dict(run["scalars"].get("train/tokens_seen") or [])
        return seen.get(step, (step + 1) * float(run["budget"].get("tokens_per_step") or 1))

    def plot_band(ax, tag: str, x_of=None) -> bool:
        any_line = False
        for i, (name, group) in enumerate(groups.items()):
            xs, ms, band = _band(group["runs"], tag, x_of)
            if not xs:
                continue
            any_line = True
            ax.plot(xs, ms, color=colors(i % colors.N), label=f"{name} (n={len(group['runs'])})", lw=1.4)
            ax.fill_between(xs, [b[0] for b in band], [b[1] for b in band], color=colors(i % colors.N), alpha=0.2)
        return any_line

    title = f"{data['manifest']['study']} ({data['manifest']['profile']})"
    fig, ax = plt.subplots(figsize=(8, 5))
    plot_band(ax, metric)
    ax.set(xlabel="optimizer steps", ylabel=metric, title=f"{title}: validation, mean ± std over seeds")
    if metric == "val/ppl":
        ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    written.append(out / "val_curves.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, tag, label in (
        (axes[0], "train/grad_norm/total", "gradient norm (pre-clip)"),
        (axes[1], "train/spikes", "loss spikes (cumulative)"),
    ):
        if plot_band(ax, tag):
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"{tag} not logged\n(add callbacks/stability.yaml)", ha="center", transform=ax.transAxes)
        ax.set(xlabel="optimizer steps", ylabel=label, title=f"{title}: {label}")
    if axes[0].lines:
        axes[0].set_yscale("log")
    fig.tight_layout()
    written.append(out / "stability.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    plot_band(ax, metric, tokens_at)
    for i, group in enumerate(groups.values()):
        finals = [(float(r["budget"].get("tokens", 0)), _final(r, metric)) for r in group["runs"]]
        ax.scatter([f[0] for f in finals], [f[1] for f in finals], color=colors(i % colors.N), s=14, zorder=3)
    ax.set(xlabel="training tokens", ylabel=metric, title=f"{title}: {metric} vs tokens (dots: final, per seed)")
    if metric == "val/ppl":
        ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    written.append(out / "ppl_vs_tokens.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


# ---------------------------------------------------------------------------------------------------- command
def write_report(
    sweep_dir: str | Path, output: str | Path | None = None, quiet: bool = False, glue: list[str] | None = None
) -> dict[str, Path]:
    """Write `<study>.md`, `<study>.csv` and the figures; print the Markdown. Returns the written paths.

    GLUE: the `glue.json` tables (`lightning_cqk glue`) of the sweep's checkpoints, and of the extra checkpoints or
    directories in `glue`, are put side by side in a "GLUE" section of the Markdown and in `glue.md`.
    """
    sweep_dir = Path(sweep_dir)
    data = collect(sweep_dir)
    if not any(g["runs"] for g in data["groups"].values()):
        raise ReportError(
            f"{sweep_dir}: none of the {len(data['missing'])} runs has a finished validation yet "
            "(val/ppl and budget.json); run the sweep first."
        )
    out = Path(output) if output is not None else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    study = data["manifest"]["study"]
    rows = table_rows(data)
    md = markdown(data, rows)
    glue_md = _glue_section(sweep_dir, glue or [])
    if glue_md:
        (out / "glue.md").write_text(glue_md)
        md = f"{md.rstrip()}\n\n## GLUE (fine-tuned checkpoints, `lightning_cqk glue`)\n\n{glue_md}"
    paths = {"markdown": out / f"{study}.md", "csv": out / f"{study}.csv"}
    paths["markdown"].write_text(md)
    paths["csv"].write_text(to_csv(rows))
    for fig in figures(data, out):
        paths[fig.stem] = fig
    if not quiet:
        print(md)
        pngs = ", ".join(p.name for p in paths.values() if p.suffix == ".png")
        print(f"Report: {paths['markdown']}, {paths['csv']}; figures ({out}): {pngs}")
    return paths


def _glue_section(sweep_dir: Path, extra: list[str]) -> str:
    """The GLUE tables under the sweep directory and at `extra`, side by side ('' when there are none)."""
    from lightning_cqk.downstream.glue_table import JSON_NAME, side_by_side

    paths = sorted(p for p in sweep_dir.rglob(JSON_NAME) if "report" not in p.relative_to(sweep_dir).parts)
    paths += [Path(p) for p in extra]
    return side_by_side(paths) if paths else ""


def report_command(argv: list[str]) -> None:
    """`lightning_cqk report runs/<sweep> [--output DIR]`."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk report", description="Tables and figures of a sweep from its runs' TensorBoard scalars."
    )
    parser.add_argument("sweep_dir", help="a sweep directory, e.g. runs/coupling-cpu")
    parser.add_argument("--output", default=None, help="where to write (default <sweep_dir>/report)")
    parser.add_argument(
        "--glue",
        nargs="*",
        default=[],
        help="more checkpoints / run directories / glue.json files whose GLUE tables join the sweep's own",
    )
    args = parser.parse_args(argv)
    try:
        write_report(args.sweep_dir, args.output, glue=args.glue)
    except ReportError as err:
        sys.exit(f"lightning_cqk report: {err}")
