"""Report of a sweep: verdicts, tables (Markdown and CSV) and figures (PNG) from the runs' TensorBoard scalars.

    lightning_cqk report runs/coupling-cpu [--output DIR]

Reads `<sweep>/manifest.json` (written by `lightning_cqk sweep`: the spec, the groups and seeds of the runs) and,
for every run, its TensorBoard event files, `budget.json` and `val_windows.json`, and writes into `<sweep>/report/`
(or `--output`):

    <study>.md   verdicts first: per claim of the spec (`claims:`) the paper's change beside ours with its 95%
                 interval, the test (paired t over seeds, Welch where runs do not pair; Holm-adjusted over the study),
                 the minimum detectable effect at 80% power and the computed verdict (lightning_cqk/sweep/verdict.py);
                 the positive control (`control:`), without which the verdicts are void; then one row per group.
    <study>.csv  the group table (every number of the rows, floats in full).
    claims.csv   the verdict table.
    figures      val_curves.png (absolute curves, and the change vs the baseline per seed pair, small multiples),
                 stability.png (gradient norm, loss spikes), ppl_vs_tokens.png (lightning_cqk/sweep/figures.py).

Finished runs only: a run counts when it wrote `budget.json` and its last validation is at its last training step
(a run killed during its final validation, or resumed without redoing it, is listed as unfinished, never scored with
an older validation). A run whose final metric is NaN or inf is counted as diverged: it is named, it never enters a
mean or a test, and a comparison uses the seeds finite in all of its groups.

Per group the table also says how much the metric still moved over the last 20% of training (from the last
validation at or before 80% of the steps to the final one, mean over seeds): a reader sees whether runs had settled.
The validation set's own sampling error is the bootstrap standard error over its windows (`val_windows.json`,
written at the final validation by `lightning_cqk.callbacks.ValWindowLosses`), as a % of the metric; per compared
group also that of its difference from the baseline on the same windows (what the set alone makes of a change).

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

from lightning_cqk.sweep.stats import bootstrap_se_of_mean_loss, contrast, mean, n_diverged, std, variance_ratio
from lightning_cqk.sweep.verdict import VOID, Judgement, judge

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
VAL_WINDOWS = "val_windows.json"
SETTLE_FRACTION = 0.8  # "still moving": the change of the metric over the last 20% of training


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


def unfinished_reason(scalars: dict[str, list[tuple[int, float]]], budget: dict[str, Any], metric: str) -> str:
    """'' for a finished run, else why it is not: no budget.json, no validation, or a last validation that is not
    after the last training step (budget.json `steps`)."""
    if not budget:
        return "no budget.json (training did not end)"
    series = scalars.get(metric) or []
    if not series:
        return f"no {metric} logged"
    steps = budget.get("steps")
    # TensorBoard step s is logged after s + 1 optimizer steps (the validation after step N is at index N - 1)
    if steps is not None and series[-1][0] + 1 < int(steps):
        return f"last validation after step {series[-1][0] + 1}, training ended at step {int(steps)}"
    return ""


def collect(sweep_dir: str | Path) -> dict[str, Any]:
    """Everything the tables and figures need: per group, per finished run, the scalars and budget."""
    sweep_dir = Path(sweep_dir)
    manifest = _read_manifest(sweep_dir)
    metric = manifest["spec"].get("metric", "val/ppl")
    groups: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    unfinished: dict[str, str] = {}
    for run in manifest["runs"]:
        group = groups.setdefault(run["group"], {"levels": run["levels"], "runs": []})
        run_dir = sweep_dir / run["name"]
        if not run_dir.is_dir():
            missing.append(run["name"])
            continue
        scalars = read_scalars(run_dir, set(CURVE_TAGS) | {metric})
        budget_file = run_dir / "budget.json"
        budget = json.loads(budget_file.read_text()) if budget_file.is_file() else {}
        reason = unfinished_reason(scalars, budget, metric)
        if reason:
            unfinished[run["name"]] = reason
            continue
        windows_file = run_dir / VAL_WINDOWS
        windows = json.loads(windows_file.read_text()) if windows_file.is_file() else None
        group["runs"].append(
            {"name": run["name"], "seed": run["seed"], "scalars": scalars, "budget": budget, "windows": windows}
        )
    return {"manifest": manifest, "groups": groups, "missing": missing, "unfinished": unfinished}


# ---------------------------------------------------------------------------------------------------- tables
def final(run: dict[str, Any], tag: str) -> float:
    series = run["scalars"].get(tag) or []
    return series[-1][1] if series else math.nan


def settle_pct(run: dict[str, Any], tag: str, fraction: float = SETTLE_FRACTION) -> float:
    """% change of `tag` from its last value at or before `fraction` of the run's last step to its final value."""
    series = run["scalars"].get(tag) or []
    if len(series) < 2:
        return math.nan
    last_step, last = series[-1]
    earlier = [v for s, v in series if s <= fraction * last_step]
    if not earlier or not (math.isfinite(earlier[-1]) and math.isfinite(last)) or earlier[-1] == 0:
        return math.nan
    return 100.0 * (last / earlier[-1] - 1.0)


def group_values(data: dict[str, Any], tag: str) -> dict[str, dict[int, float]]:
    """group -> {seed: final value of tag} over the finished runs (non-finite values kept: they count as diverged)."""
    return {name: {r["seed"]: final(r, tag) for r in g["runs"]} for name, g in data["groups"].items()}


def baseline_group(levels: dict[str, str], baseline: dict[str, str], groups: dict[str, Any]) -> str | None:
    target = dict(levels, **baseline)
    for name, group in groups.items():
        if group["levels"] == target:
            return name
    return None


def _published_delta(name: str, base: str | None, published: dict[str, Any]) -> float:
    values, deltas = published.get("values") or {}, published.get("deltas") or {}
    if name in deltas:
        return float(deltas[name])
    pub, pub_base = values.get(name), values.get(base) if base else None
    return 100.0 * (float(pub) / float(pub_base) - 1.0) if pub is not None and pub_base else math.nan


def table_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group (floats; nan where not defined)."""
    spec = data["manifest"]["spec"]
    metric = spec.get("metric", "val/ppl")
    published = spec.get("published") or {}
    groups = data["groups"]
    values = group_values(data, metric)
    rows = []
    for name, group in groups.items():
        runs = group["runs"]
        base = baseline_group(group["levels"], spec["baseline"], groups)
        own = list(values[name].values())
        row: dict[str, Any] = {"group": name, "baseline": base or "", "seeds": len(runs), "diverged": n_diverged(own)}
        for tag in VAL_METRICS:
            xs = [final(r, tag) for r in runs]
            row[f"{tag}_mean"], row[f"{tag}_std"] = mean(xs), std(xs)
        row["settle_pct"] = mean([settle_pct(r, metric) for r in runs])
        if base and base != name:
            eff = contrast(values, [name], [base])
            var = variance_ratio(values[name], values[base])
            row.update(
                test=eff.test,
                n_used=eff.n,
                delta_pct=eff.delta_pct,
                ci_low_pct=eff.ci_low_pct,
                ci_high_pct=eff.ci_high_pct,
                p=eff.p,
                mde_pct=eff.mde_pct,
                seed_var_ratio=var.ratio,
            )
        else:
            row.update(
                test="",
                n_used=0,
                delta_pct=math.nan,
                ci_low_pct=math.nan,
                ci_high_pct=math.nan,
                p=math.nan,
                mde_pct=math.nan,
                seed_var_ratio=math.nan,
            )
        row["val_se_delta_pct"] = paired_window_se(runs, groups[base]["runs"]) if base and base != name else math.nan
        for key in ("tokens", "flops", "wallclock"):
            row[key] = mean([float(r["budget"].get(key, math.nan)) for r in runs])
        row["published_delta_pct"] = _published_delta(name, base, published)
        rows.append(row)
    return rows


def val_sampling_error(data: dict[str, Any]) -> tuple[float, int, int]:
    """(bootstrap SE of the validation loss over windows, in % of the metric; windows; runs it is the median of).

    For val/ppl, a standard error s of the loss (nats) is a relative error of about 100 s % of the perplexity; for
    val/bpb and val/loss likewise relative to the loss. Median over the runs that wrote `val_windows.json`."""
    metric = data["manifest"]["spec"].get("metric", "val/ppl")
    errs, windows = [], 0
    for group in data["groups"].values():
        for run in group["runs"]:
            w = run.get("windows")
            if not w or not w.get("nll"):
                continue
            se = bootstrap_se_of_mean_loss(w["nll"], w["tokens"])
            loss = sum(w["nll"]) / max(sum(w["tokens"]), 1.0)
            if not math.isfinite(se):
                continue
            errs.append(100.0 * se if metric == "val/ppl" else 100.0 * se / loss)
            windows = len(w["nll"])
    if not errs:
        return math.nan, 0, 0
    errs.sort()
    return errs[len(errs) // 2], windows, len(errs)


def paired_window_se(runs: list[dict[str, Any]], base_runs: list[dict[str, Any]]) -> float:
    """How much of a difference the validation set alone makes between two groups: the bootstrap SE over windows of
    the difference of their validation losses (same seed, same windows), as % of the metric; median over seeds."""
    base_by_seed = {r["seed"]: r.get("windows") for r in base_runs}
    errs = []
    for run in runs:
        a, b = run.get("windows"), base_by_seed.get(run["seed"])
        if not a or not b or len(a["nll"]) != len(b["nll"]) or a["tokens"] != b["tokens"]:
            continue
        diff = [x - y for x, y in zip(a["nll"], b["nll"], strict=True)]
        se = bootstrap_se_of_mean_loss(diff, a["tokens"])
        if math.isfinite(se):
            errs.append(100.0 * se)
    errs.sort()
    return errs[len(errs) // 2] if errs else math.nan


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


def _ci(d: float, lo: float, hi: float) -> str:
    if math.isnan(d):
        return "–"
    return f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]" if not math.isnan(lo) else f"{d:+.2f}"


def verdicts(data: dict[str, Any]) -> list[Judgement]:
    """The spec's claims (and its positive control) judged on the finished runs."""
    spec = data["manifest"]["spec"]
    values = group_values(data, spec.get("metric", "val/ppl"))
    return judge(values, spec.get("claims") or [], spec.get("control"))


def _claim_lines(judgements: list[Judgement], spec: dict[str, Any]) -> list[str]:
    if not judgements:
        return ["No claims in the spec (`claims:`): no verdicts.", ""]
    lines = [
        "| claim | expects | paper Δ % | our Δ % [95% CI] | test (seeds) | Holm p | detectable Δ % (80% power) "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for j in judgements:
        label = f"**control** {j.name}" if j.is_control else j.name
        if len(j.plus) > 1:  # a contrast: the log-metric of the plus groups minus that of the minus groups
            what = f"({' + '.join(j.plus)}) − ({' + '.join(j.minus)})"
        else:
            what = f"{j.plus[0]} vs {j.minus[0]}"
        expects = j.expect + (f" (±{j.margin_pct:g}%)" if j.expect == "same" else "")
        if j.variance is not None:
            v = j.variance
            paper = f"var ×{j.published_ratio:g}" if math.isfinite(j.published_ratio) else "–"
            ours = f"var ×{v.ratio:.2f} [{v.ci_low:.2f}, {v.ci_high:.2f}]" if math.isfinite(v.ratio) else "–"
            test, mde = f"{v.test} ({v.n_a})", "–"
        else:
            e = j.effect
            paper = _fmt(j.published_pct, "+.1f")
            ours = _ci(e.delta_pct, e.ci_low_pct, e.ci_high_pct)
            div = f", {e.diverged} diverged" if e.diverged else ""
            test, mde = f"{e.test} ({e.n}{div})", _fmt(e.mde_pct, ".2f")
        verdict = f"**{j.verdict}**" + (f" ({j.why})" if j.verdict == VOID else "")
        lines.append(
            f"| {label}: {what} | {expects} | {paper} | {ours} | {test} | {_fmt(j.p_holm, '.3g')} | {mde} | {verdict} |"
        )
    lines.append("")
    noted = [(j.name, j.published_note) for j in judgements if j.published_note]
    one_note = len({note for _, note in noted}) == 1  # one setting for every claim: said once, inline
    lines.append(
        "Δ % is the change of the geometric mean of the metric over seeds (paired by seed: every level of a seed sees "
        "the same batches and starts from the same shared weights). The paper's Δ % comes from another scale and "
        "corpus" + (f" ({noted[0][1]})" if one_note else "") + ": compare direction and size, not the "
        "absolute numbers. Verdicts are computed (lightning_cqk/sweep/verdict.py): supports / contradicts need Holm p "
        "< 0.05 in the paper's / the opposite direction; `same` needs the 95% CI inside the margin."
    )
    if noted and not one_note:
        lines.append("The paper's side, per claim: " + "; ".join(f"{name}: {note}" for name, note in noted) + ".")
    skipped = spec.get("claims_not_in_profile") or []
    if skipped:
        lines.append(f"Not tested at this profile (a group it leaves out): {', '.join(skipped)}.")
    control = [j for j in judgements if j.is_control]
    if control:
        c = control[0]
        if c.verdict == "supports":
            lines.append(
                f"Positive control `{c.plus[0]}` detected (Holm p {_fmt(c.p_holm, '.3g')}): the study has power."
            )
        else:
            lines.append(
                f"**Positive control `{c.plus[0]}` NOT detected ({c.why}): the study has no power; every verdict is "
                "void.** Train longer, add seeds or enlarge the validation set."
            )
    lines.append("")
    return lines


def code_line(manifest: dict[str, Any]) -> str:
    """Which code made the runs: one revision, or each revision with its runs when they differ (a sweep resumed
    after the code changed). Runs record their attempts' revisions (`revisions` in the manifest); a sweep written
    before they did gives the revision of its last invocation, said as such."""
    per_run = [tuple(r.get("revisions") or ()) for r in manifest.get("runs", []) if r.get("status") == "done"]
    recorded = [revs for revs in per_run if revs]

    def short(rev: str) -> str:
        if rev == "unknown":  # Ledger.code_revision outside a git checkout
            return "unknown (not a git checkout; the package version is in manifest.json)"
        return rev[:12] + (" (dirty)" if rev.endswith("-dirty") else "")

    if not recorded:
        git = manifest.get("git") or {}
        if not git.get("revision"):
            return ""
        dirty = " (dirty)" if git.get("dirty") else ""
        return f"Code: git {git['revision'][:12]}{dirty} (the sweep's last invocation; its runs record no revision)."
    counts: dict[tuple[str, ...], int] = {}
    for revs in per_run:
        counts[revs] = counts.get(revs, 0) + 1
    if len(counts) == 1 and len(recorded[0]) == 1:
        return f"Code: {'' if recorded[0][0] == 'unknown' else 'git '}{short(recorded[0][0])}."
    parts = []
    for revs, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        what = " then ".join(short(r) for r in revs) if revs else "not recorded"
        parts.append(f"{what}: {n} run{'s' if n != 1 else ''}")
    return "Code: **runs from more than one revision** (" + "; ".join(parts) + ")."


def markdown(data: dict[str, Any], rows: list[dict[str, Any]], judgements: list[Judgement]) -> str:
    """The study's Markdown report (header, verdicts, group table, notes)."""
    manifest = data["manifest"]
    spec = manifest["spec"]
    metric = spec.get("metric", "val/ppl")
    published = spec.get("published") or {}
    lines = [f"## {spec.get('title', manifest['study'])} ({manifest['study']}, {manifest['profile']} profile)", ""]
    if spec.get("paper") or spec.get("claim"):
        lines += [f"{spec.get('paper', '')}: {spec.get('claim', '')}".strip(": "), ""]
    code = code_line(manifest)
    if code:
        lines += [code, ""]
    lines += ["### Verdicts", ""] + _claim_lines(judgements, spec)
    lines += ["### Groups", ""]
    lines.append(
        f"| group | seeds (diverged) | val ppl | val bpb | Δ {metric} % [95% CI] | p | test | detectable Δ % | "
        "val-set SE of Δ % | seed-var ratio | moved over last 20% | tokens | train s | paper Δ % |"
    )
    lines.append("|" + "---|" * 14)
    for r in rows:
        is_base = r["group"] == r["baseline"]
        cells = [
            f"{r['group']}{' (baseline)' if is_base else ''}",
            f"{r['seeds']}" + (f" ({r['diverged']})" if r["diverged"] else ""),
            _pm(r["val/ppl_mean"], r["val/ppl_std"], 2),
            _pm(r["val/bpb_mean"], r["val/bpb_std"], 4),
            "–" if is_base else _ci(r["delta_pct"], r["ci_low_pct"], r["ci_high_pct"]),
            _fmt(r["p"], ".3g"),
            r["test"] or "–",
            _fmt(r["mde_pct"], ".2f"),
            _fmt(r["val_se_delta_pct"], ".2f"),
            "–" if is_base else _fmt(r["seed_var_ratio"], ".2f"),
            _fmt(r["settle_pct"], "+.2f") + ("%" if not math.isnan(r["settle_pct"]) else ""),
            _si(r["tokens"]),
            _fmt(r["wallclock"], ".0f"),
            "–" if is_base else _fmt(r["published_delta_pct"], "+.1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    se, windows, n_runs = val_sampling_error(data)
    notes = [
        f"Mean ± sample std over the finite seeds of the last validation; Δ, p (unadjusted) and the detectable Δ "
        f"compare {metric} with the baseline group ({', '.join(f'{k}={v}' for k, v in spec['baseline'].items())}, "
        "same other levels). 'moved over last 20%': the change of the metric from the validation at 80% of the "
        "steps to the last (near 0: settled).",
        f"Validation-set sampling error: ±{se:.2f}% of {metric} (bootstrap SE over {windows} windows, median of "
        f"{n_runs} runs); of a difference between two groups on the same windows: 'val-set SE of Δ' (bootstrap of "
        "the per-window differences, same seed: the windows' difficulty cancels)."
        if n_runs
        else "Validation-set sampling error: not recorded (no run wrote val_windows.json; "
        "add lightning_cqk.callbacks.ValWindowLosses, as callbacks/sweep.yaml does).",
    ]
    if published:
        notes.append(
            f"Paper Δ %: {published.get('source', 'the paper')}; its absolute numbers "
            f"({published.get('metric', metric)}"
            ") are at another scale, corpus and tokenizer and are not comparable with ours."
        )
    diverged = [r["name"] for g in data["groups"].values() for r in g["runs"] if not math.isfinite(final(r, metric))]
    if diverged:
        notes.append(f"Diverged (non-finite final {metric}; counted, never averaged): {', '.join(diverged)}.")
    if data["unfinished"]:
        notes.append(
            "Unfinished runs (left out): "
            + "; ".join(f"{name}: {why}" for name, why in data["unfinished"].items())
            + "."
        )
    if data["missing"]:
        notes.append(f"Runs not started (left out): {', '.join(data['missing'])}.")
    lines += notes
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "group",
    "baseline",
    "seeds",
    "diverged",
    "val/ppl_mean",
    "val/ppl_std",
    "val/bpb_mean",
    "val/bpb_std",
    "delta_pct",
    "ci_low_pct",
    "ci_high_pct",
    "p",
    "test",
    "n_used",
    "mde_pct",
    "val_se_delta_pct",
    "seed_var_ratio",
    "settle_pct",
    "tokens",
    "flops",
    "wallclock",
    "published_delta_pct",
)
CLAIM_FIELDS = (
    "claim",
    "control",
    "expect",
    "plus",
    "minus",
    "published_pct",
    "published_ratio",
    "delta_pct",
    "ci_low_pct",
    "ci_high_pct",
    "var_ratio",
    "var_ci_low",
    "var_ci_high",
    "test",
    "n",
    "diverged",
    "p",
    "p_holm",
    "mde_pct",
    "verdict",
    "why",
)


def _cell(value: Any) -> Any:
    """A CSV cell: floats (numpy's included, whose repr is `np.float64(...)`) at full precision as plain numbers."""
    return repr(float(value)) if isinstance(value, float) else value


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _cell(v) for k, v in r.items() if k in CSV_FIELDS})
    return buf.getvalue()


def claims_csv(judgements: list[Judgement]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CLAIM_FIELDS, lineterminator="\n")
    writer.writeheader()
    for j in judgements:
        e, v = j.effect, j.variance
        row = {
            "claim": j.name,
            "control": j.is_control,
            "expect": j.expect,
            "plus": " ".join(j.plus),
            "minus": " ".join(j.minus),
            "published_pct": j.published_pct,
            "published_ratio": j.published_ratio,
            "delta_pct": e.delta_pct if e else math.nan,
            "ci_low_pct": e.ci_low_pct if e else math.nan,
            "ci_high_pct": e.ci_high_pct if e else math.nan,
            "var_ratio": v.ratio if v else math.nan,
            "var_ci_low": v.ci_low if v else math.nan,
            "var_ci_high": v.ci_high if v else math.nan,
            "test": (e or v).test,
            "n": e.n if e else v.n_a,
            "diverged": e.diverged if e else "",
            "p": (e or v).p,
            "p_holm": j.p_holm,
            "mde_pct": e.mde_pct if e else math.nan,
            "verdict": j.verdict,
            "why": j.why,
        }
        writer.writerow({k: _cell(x) for k, x in row.items()})
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------- command
def write_report(
    sweep_dir: str | Path, output: str | Path | None = None, quiet: bool = False, glue: list[str] | None = None
) -> dict[str, Path]:
    """Write `<study>.md`, `<study>.csv`, `claims.csv` and the figures; print the Markdown. Returns the paths.

    GLUE: the `glue.json` tables (`lightning_cqk glue`) of the sweep's checkpoints, and of the extra checkpoints or
    directories in `glue`, are put side by side in a "GLUE" section of the Markdown and in `glue.md`.
    """
    from lightning_cqk.sweep.figures import figures

    sweep_dir = Path(sweep_dir)
    data = collect(sweep_dir)
    if not any(g["runs"] for g in data["groups"].values()):
        raise ReportError(
            f"{sweep_dir}: none of the {len(data['manifest']['runs'])} runs has finished (budget.json and a last "
            "validation at its last step); run the sweep first."
            + (
                f" Unfinished: {'; '.join(f'{k}: {v}' for k, v in data['unfinished'].items())}."
                if data["unfinished"]
                else ""
            )
        )
    out = Path(output) if output is not None else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    study = data["manifest"]["study"]
    rows = table_rows(data)
    judgements = verdicts(data)
    md = markdown(data, rows, judgements)
    glue_md = _glue_section(sweep_dir, glue or [])
    if glue_md:
        (out / "glue.md").write_text(glue_md)
        md = f"{md.rstrip()}\n\n## GLUE (fine-tuned checkpoints, `lightning_cqk glue`)\n\n{glue_md}"
    paths = {"markdown": out / f"{study}.md", "csv": out / f"{study}.csv", "claims": out / "claims.csv"}
    paths["markdown"].write_text(md)
    paths["csv"].write_text(to_csv(rows))
    paths["claims"].write_text(claims_csv(judgements))
    for fig in figures(data, out, judgements):
        paths[fig.stem] = fig
    if not quiet:
        print(md)
        pngs = ", ".join(p.name for p in paths.values() if p.suffix == ".png")
        print(f"Report: {paths['markdown']}, {paths['csv']}, {paths['claims']}; figures ({out}): {pngs}")
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
        prog="lightning_cqk report", description="Verdicts, tables and figures of a sweep from its runs' scalars."
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
