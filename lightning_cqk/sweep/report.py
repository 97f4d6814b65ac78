"""Report of a sweep: verdicts, tables (Markdown and CSV) and figures (PNG) from the runs' TensorBoard scalars.

    lightning_cqk report runs/coupling-cpu [--output DIR]

Reads `<sweep>/manifest.json` (written by `lightning_cqk sweep`: the spec, the groups and seeds of the runs) and,
for every run, its TensorBoard event files, `budget.json` and `val_windows.json`, and writes into `<sweep>/report/`
(or `--output`):

    <study>.md   verdicts first: per claim of the spec (`claims:`) the paper's change beside ours with its 95%
                 interval, the test (paired t over seeds, Welch where runs do not pair; Holm-adjusted over the study),
                 the minimum detectable effect at 80% power and the computed verdict (lightning_cqk/sweep/verdict.py);
                 the positive control (`control:`), which gates the null-type verdicts; then one row per group.
    <study>.csv  the group table (every number of the rows, floats in full).
    claims.csv   the verdict table.
    figures      val_curves.png (absolute curves, and the change vs the baseline per seed pair, small multiples),
                 stability.png (gradient norm, loss spikes), ppl_vs_tokens.png (lightning_cqk/sweep/figures.py).

The report is written whole into a hidden folder beside its destination and swapped in (`report_folder.py`): a
report killed or out of disk space leaves the previous complete report (or none), never a mix; files in the folder
that no report wrote (a README.md) are kept.

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
import errno
import io
import json
import math
import shlex
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning_cqk.sweep import report_folder
from lightning_cqk.sweep.stats import bootstrap_se_of_mean_loss, contrast, mean, n_diverged, std, variance_ratio
from lightning_cqk.sweep.tuning import all_grid_runs, grid_names
from lightning_cqk.sweep.verdict import DETECTED, INTERIM, Judgement, judge

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
    from lightning_cqk.sweep.results import read_manifest

    return read_manifest(path)  # one run per (group, seed), plain names


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
    """Everything the tables and figures need: per group, per finished run, the scalars and budget.

    `sweep_dir` is a sweep directory (manifest.json and run directories) or a folder of committed results
    (study.json, runs.csv, curves.csv: lightning_cqk/sweep/results.py); both give the same structure. The runs of a
    learning-rate grid (spec `tuning:`) are kept apart, under "tuning_runs", with their held-out loss.
    """
    from lightning_cqk.sweep import results, tuning

    sweep_dir = Path(sweep_dir)
    committed = results.is_committed(sweep_dir)
    if committed:
        manifest, finished, other = results.read_committed(sweep_dir)
    else:
        if (sweep_dir / "claims.csv").is_file() and not (sweep_dir / "manifest.json").is_file():
            raise ReportError(
                f"{sweep_dir}: results written before runs.csv was committed (no study.json / runs.csv): they cannot "
                f"be recomputed. Rerun the study and write its report here: `lightning_cqk sweep "
                f"configs/ablations/{sweep_dir.name}.yaml --profile cpu` then `lightning_cqk report "
                f"runs/{sweep_dir.name}-cpu --output {sweep_dir}`."
            )
        manifest = _read_manifest(sweep_dir)
    metric = manifest["spec"].get("metric", "val/ppl")
    tune_spec = manifest["spec"].get("tuning") or {}
    tune_names = all_grid_runs(tune_spec)
    groups: dict[str, dict[str, Any]] = {}
    tuning_runs: list[dict[str, Any]] = []
    missing: list[str] = []
    unfinished: dict[str, str] = {}
    adopted: dict[str, dict[str, Any]] = {}  # committed folder -> its finished runs
    for run in manifest["runs"]:
        is_tune = run["name"] in tune_names
        if not is_tune:
            group = groups.setdefault(run["group"], {"levels": run["levels"], "runs": []})
        if committed:
            record = finished.get(run["name"])
            if record is None:
                status = other.get(run["name"], "not started")
                if status == "not started":
                    missing.append(run["name"])
                else:
                    unfinished[run["name"]] = status
                continue
            entry = {"name": run["name"], **record}
        elif run.get("adopted_from"):  # numbers of a committed twin, adopted by the runner (sweep/adopt.py)
            folder, twin = str(run["adopted_from"]).rsplit("#", 1)
            if folder not in adopted:
                adopted[folder] = results.read_committed(folder)[1]
            if twin not in adopted[folder]:
                missing.append(run["name"])
                continue
            entry = {"name": run["name"], **adopted[folder][twin]}
        else:
            run_dir = shared_source(sweep_dir, run) or sweep_dir / run["name"]
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
            entry = {"name": run["name"], "seed": run["seed"], "scalars": scalars, "budget": budget, "windows": windows}
            entry["lr"] = recorded_lr(run_dir)
            entry["stability"] = run_stability(scalars)
            if is_tune:
                entry["heldout_loss"] = tuning.held_out_loss(windows, tune_spec["held_out"])
        (tuning_runs if is_tune else group["runs"]).append(entry)
    data = {
        "manifest": manifest,
        "groups": groups,
        "missing": missing,
        "unfinished": unfinished,
        "tuning_runs": tuning_runs,
        "committed": committed,
        "source": sweep_dir,
    }
    data["tuning"] = tuning_table(data)
    return data


def recorded_lr(run_dir: Path) -> float:
    """The learning rate a run trained at, as its config.yaml (written by the CLI at the start) records it: a
    grid-chosen rate as filled in at launch, never recomputed; nan without a record."""
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return math.nan
    lr = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("optim", {}).get("lr")
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else math.nan


def shared_source(sweep_dir: Path, run: dict[str, Any]) -> Path | None:
    """The directory holding the numbers of a run that was not computed again (issue 31): the run of this sweep with
    the same identity (`same_as`) or a sibling sweep's (`reused_from`), as the runner recorded it; None otherwise."""
    if run.get("same_as"):
        return sweep_dir / run["same_as"]
    if run.get("reused_from"):
        return Path(run["reused_from"])
    return None


def computed_once(manifest: dict[str, Any]) -> list[str]:
    """`<run> = <the run whose numbers it has>` for every run the runner did not compute again."""
    return [
        f"{r['name']} = {r.get('same_as') or r.get('reused_from') or r.get('adopted_from')}"
        + (f" (adopted: {r['probe']} reproduced its committed twin to the last digit)" if r.get("adopted_from") else "")
        for r in manifest.get("runs", [])
        if r.get("same_as") or r.get("reused_from") or r.get("adopted_from")
    ]


def tuning_table(data: dict[str, Any]) -> dict[str, Any]:
    """{"rows": [(level, lr, run(s), held-out loss)], "chosen": {level: lr}, "spread": {(level, lr): sd}} of the
    learning-rate grid (empty without): a rate's loss is the mean over its grid seeds (tuning.mean_loss), its
    spread their sample sd (nan at one seed); several runs are named joined by ", "."""
    from lightning_cqk.sweep.tuning import choose, mean_loss

    spec = data["manifest"]["spec"].get("tuning") or {}
    by_name = {r["name"]: r for r in data["tuning_runs"]}
    rows, chosen, spread = [], {}, {}
    for level, grid in (spec.get("grid") or {}).items():
        losses = {}
        for lr, point in grid.items():
            names = grid_names(point)
            per_seed = [by_name[n]["heldout_loss"] if n in by_name else math.nan for n in names]
            losses[float(lr)] = mean_loss(per_seed)
            spread[(level, float(lr))] = std(per_seed) if len(per_seed) > 1 else math.nan
            rows.append((level, float(lr), ", ".join(names), losses[float(lr)]))
        chosen[level] = choose(losses)
    return {"rows": rows, "chosen": chosen, "spread": spread}


def untuned_groups(data: dict[str, Any]) -> dict[str, str]:
    """group -> why its learning rate is not its own (tuning parity): every group when the profile has no grid."""
    from lightning_cqk.sweep.tuning import is_tuned_rate

    spec = data["manifest"]["spec"]
    tuning = spec.get("tuning") or {}
    if "fixed" in tuning:
        return {}
    control = (spec.get("control") or {}).get("group")
    if not tuning:
        return {g: "one learning rate for every arm (no tuning grid)" for g in data["groups"] if g != control}
    out = {}
    runs = {r["name"]: r for r in data["manifest"]["runs"]}
    grid_levels = {  # tuned level -> the levels its grid ran at
        level: runs[name]["levels"]
        for level, by_lr in (tuning.get("grid") or {}).items()
        for name in [grid_names(point)[0] for point in list(by_lr.values())[:1]]
        if name in runs
    }
    for name, group in data["groups"].items():
        entries = [runs[r["name"]] for r in group["runs"] if r["name"] in runs]
        rates = {str((e.get("overrides") or {}).get("model.optim.lr", "")) for e in entries}
        tuned = all(is_tuned_rate(rate) for rate in rates)
        if not entries or name == control:
            continue
        if not tuned:
            out[name] = f"level not in the tuning grid of axis {tuning['axis']}"
            continue
        inherited = _inherited_from(entries[0]["levels"], rates.pop(), grid_levels, tuning["axis"])
        if inherited:
            out[name] = inherited
    return out


def _inherited_from(levels: dict[str, str], rate: str, grid_levels: dict[str, dict[str, str]], axis: str) -> str:
    """Why a tuned group's rate is not its own: chosen by a grid run at other levels (another corpus, size,
    transform: the rate is inherited), or '' when the grid ran at the group's own levels."""
    from lightning_cqk.sweep.tuning import parse_tuned

    parsed = parse_tuned(rate)
    level = parsed[0] if parsed else None
    ran_at = grid_levels.get(level) if level else None
    if not ran_at:
        return ""
    other = {a: lv for a, lv in ran_at.items() if a != axis and levels.get(a) != lv}
    if not other and (not level or levels.get(axis) == level):
        return ""
    where = ", ".join(f"{a}={lv}" for a, lv in sorted(other.items())) or f"{axis}={level}"
    return f"rate chosen by the grid at {where}, inherited (not tuned at this level)"


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


STABILITY = ("spikes", "late_loss_sd_pct")  # per run: cumulative loss spikes; sd of train/loss over the last 20%


def run_stability(scalars: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """{"spikes": the run's final cumulative loss-spike count, "late_loss_sd_pct": the sd of train/loss over the last
    20% of its logged steps, in % of their mean} (nan where not logged)."""
    spikes = scalars.get("train/spikes") or []
    loss = [(s, v) for s, v in scalars.get("train/loss") or [] if math.isfinite(v)]
    late = [v for s, v in loss if loss and s >= SETTLE_FRACTION * loss[-1][0]]
    sd = std(late)
    return {
        "spikes": spikes[-1][1] if spikes else math.nan,
        "late_loss_sd_pct": 100.0 * sd / mean(late) if math.isfinite(sd) and mean(late) else math.nan,
    }


def group_values(data: dict[str, Any], tag: str) -> dict[str, dict[int, float]]:
    """group -> {seed: final value of tag} over the finished runs (non-finite values kept: they count as diverged).

    `tag` is a scalar (val/ppl, ...) or a stability measure of STABILITY (run_stability)."""
    if tag in STABILITY:
        return {
            name: {r["seed"]: float(r.get("stability", {}).get(tag, math.nan)) for r in g["runs"]}
            for name, g in data["groups"].items()
        }
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
        spikes = [float(r.get("stability", {}).get("spikes", math.nan)) for r in runs]
        row["spikes"] = sum(x for x in spikes if math.isfinite(x)) if any(map(math.isfinite, spikes)) else math.nan
        row["late_loss_sd_pct"] = mean([float(r.get("stability", {}).get("late_loss_sd_pct", math.nan)) for r in runs])
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
    metric = spec.get("metric", "val/ppl")
    values = dict(group_values(data, metric))
    untuned = untuned_groups(data)
    planned = planned_seeds(data)
    claims = []
    for claim in spec.get("claims") or []:
        on = claim.get("metric")
        if on and on != metric:  # a claim about another measure (a stability one): its groups as "<group>@<measure>"
            for name, by_seed in group_values(data, on).items():
                values[f"{name}@{on}"] = by_seed
                if name in planned:
                    planned[f"{name}@{on}"] = planned[name]
                if name in untuned:
                    untuned[f"{name}@{on}"] = untuned[name]
            claim = dict(claim)
            if "group" in claim:
                claim["group"], claim["vs"] = f"{claim['group']}@{on}", f"{claim['vs']}@{on}"
            else:
                claim["plus"] = [f"{g}@{on}" for g in claim["plus"]]
                claim["minus"] = [f"{g}@{on}" for g in claim["minus"]]
        claims.append(claim)
    corpora = training_corpora(data, claims)
    return judge(
        values, claims, spec.get("control"), metric=metric, untuned=untuned, planned=planned, train_corpus=corpora
    )


def training_corpora(data: dict[str, Any], claims: list[dict[str, Any]]) -> dict[str, str]:
    """claim name -> the corpus its baseline group's runs train on (units.BYTES_PER_UNIT key), from the runs' config
    files (found as `--config` finds them) and overrides; claims whose corpus is none of the measured ones are left
    out."""
    from lightning_cqk.resources import find_config
    from lightning_cqk.sweep.identity import resolved_settings
    from lightning_cqk.sweep.units import training_corpus

    def read(config: str) -> str | None:
        try:
            return find_config(config).read_text()
        except (FileNotFoundError, OSError, ValueError):
            return None

    by_group: dict[str, str | None] = {}
    for run in data["manifest"]["runs"]:
        if run["group"] not in by_group:
            settings = resolved_settings(list(run.get("configs") or []), dict(run.get("overrides") or {}), read)
            by_group[run["group"]] = training_corpus(settings)
    out = {}
    for claim in claims:
        base = str(claim.get("vs") or (claim.get("minus") or [""])[0]).split("@")[0]
        if by_group.get(base):
            out[str(claim["name"])] = str(by_group[base])
    return out


def planned_seeds(data: dict[str, Any]) -> dict[str, int]:
    """group -> the number of runs the study plans for it (its manifest: finished or not; the tuning grid left out)."""
    tune_spec = data["manifest"]["spec"].get("tuning") or {}
    tune_names = all_grid_runs(tune_spec)
    planned: dict[str, int] = {}
    for run in data["manifest"]["runs"]:
        if run["name"] not in tune_names:
            planned[run["group"]] = planned.get(run["group"], 0) + 1
    return planned


UNIT_NAMES = {"token_ppl": "token PPL", "word_ppl": "word PPL", "byte_ppl": "byte PPL"}


def _published_cell(j: Judgement) -> str:
    if j.variance is not None:
        return f"var ×{j.published_ratio:g}" if math.isfinite(j.published_ratio) else "–"
    if not math.isfinite(j.published_pct):
        return "–"
    unit = UNIT_NAMES.get(j.published_unit, "unit not declared")
    return f"{j.published_pct:+.1f} ({unit})"


def _claim_lines(judgements: list[Judgement], spec: dict[str, Any], data: dict[str, Any] | None = None) -> list[str]:
    if not judgements:
        return ["No claims in the spec (`claims:`): no verdicts.", ""]
    k, level = judgements[0].family, judgements[0].level
    lines = [
        "| claim | expects | paper Δ % (its unit) | E: paper in ours, Δ % | our Δ % [95% CI] "
        f"| [{100 * (1 - level):.2f}% CI] | test (seeds) | Holm p vs 0 / vs E | detectable Δ % at α/k "
        "| seeds for E | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for j in judgements:
        label = f"**control** {j.name}" if j.is_control else j.name
        if j.expect == "token_multiplier":  # Δ % is 100 (k - 1): k the tokens multiple worth the group
            what = f"{j.plus[0]} on the curve of {', '.join(j.minus)}"
        elif len(j.plus) > 1:  # a contrast: the log-metric of the plus groups minus that of the minus groups
            what = f"({' + '.join(j.plus)}) − ({' + '.join(j.minus)})"
        else:
            what = f"{j.plus[0]} vs {j.minus[0]}"
        margin = f" ({'±' if j.expect == 'same' else ''}{j.margin_pct:g}%)" if math.isfinite(j.margin_pct) else ""
        expects = j.expect + margin
        e_cell = _fmt(j.converted_pct, "+.2f")
        if j.is_control and math.isfinite(j.expected_pct):
            e_cell = f"{j.expected_pct:+.2f} (planted)"
        if j.variance is not None:
            v = j.variance
            ours = f"var ×{v.ratio:.2f} [{v.ci_low:.2f}, {v.ci_high:.2f}]" if math.isfinite(v.ratio) else "–"
            test, mde, vci = f"{v.test} ({v.n_a})", "–", "–"
        else:
            e = j.effect
            ours = _ci(e.delta_pct, e.ci_low_pct, e.ci_high_pct)
            div = f", {e.diverged} diverged" if e.diverged else ""
            test, mde = f"{e.test} ({e.n}{div})", _fmt(j.mde_pct, ".2f")
            vci = f"[{j.v_low_pct:+.2f}, {j.v_high_pct:+.2f}]" if math.isfinite(j.v_low_pct) else "–"
        ps = _fmt(j.p_holm, ".3g") + (f" / {_fmt(j.p_holm_effect, '.3g')}" if math.isfinite(j.p_holm_effect) else "")
        need = "–" if not j.seeds_needed else ("> 200" if j.seeds_needed > 200 else str(j.seeds_needed))
        verdict = f"**{j.verdict}**" + (f" ({j.why})" if j.why else "")
        if j.limited:
            verdict += f"; *configuration-limited*: {j.limited}"
        lines.append(
            f"| {label}: {what} | {expects} | {_published_cell(j)} | {e_cell} | {ours} | {vci} | {test} | {ps} | {mde} "
            f"| {need} | {verdict} |"
        )
    lines.append("")
    lines.append(
        "Δ % is the change of the geometric mean of the metric over seeds (paired by seed: every level of a seed sees "
        "the same batches and starts from the same shared weights). E is the paper's change in our unit (byte-level "
        "perplexity) by the rule *same nats per byte*: a ratio r of perplexity per unit of b bytes is r^(1/b) per "
        "byte, with b measured on the paper's corpus with its tokenizer (lightning_cqk/sweep/units.py); a claim "
        "without a published number uses its declared smallest effect of interest. Verdicts are computed "
        f"(lightning_cqk/sweep/verdict.py) from a family of k = {k} claims: their tests (against 0, against E, TOST, "
        "margins) Holm-adjusted together at α = 0.05, each step multiplied by the number of claims still open (a "
        "claim's two nulls cannot both be true: Shaffer); the detectable Δ (80% power) and the second interval are at "
        f"α/k = {level:.4g}, the level Holm gives a lone true effect. The control is outside the family: a one-sided "
        "paired t-test at α = 0.05, its own row's interval at 90%."
    )
    rules = [(j.name, j.converted_rule) for j in judgements if j.converted_rule and not j.is_control]
    if rules:
        lines.append("Conversions: " + "; ".join(f"{name}: {rule}" for name, rule in rules) + ".")
    lines += _corpus_lines(judgements)
    alt = [j for j in judgements if j.alt_verdict]
    if alt:
        lines.append(
            "Under the other rule (*same relative change of loss*) the verdict differs: "
            + "; ".join(f"{j.name}: E {j.alt_pct:+.2f}%, {j.alt_verdict}" for j in alt)
            + "."
        )
    noted = [(j.name, j.published_note) for j in judgements if j.published_note]
    if noted:
        lines.append("The paper's side, per claim: " + "; ".join(f"{name}: {note}" for name, note in noted) + ".")
    power = [j for j in judgements if not j.is_control and j.seeds_needed]
    if power:
        have = {j.name: (j.effect.n if j.effect else 0) for j in power}
        lines.append(
            f"Power: paired seeds that detect E at 80% power at α/k = {level:.4g} with the observed paired standard "
            "deviation: "
            + "; ".join(
                f"{j.name} {('more than 200' if j.seeds_needed > 200 else j.seeds_needed)} (ran {have[j.name]})"
                for j in power
            )
            + "."
        )
    skipped = spec.get("claims_not_in_profile") or []
    if skipped:
        lines.append(f"Not tested at this profile (a group it leaves out): {', '.join(skipped)}.")
    control = [j for j in judgements if j.is_control]
    if control:
        lines.append(_control_line(control[0], data))
    interim = [j for j in judgements if j.verdict.startswith(INTERIM)]
    if interim:
        lines.append(
            "**Interim report: no verdicts.** Not every planned seed has finished ("
            + "; ".join(f"{j.name} {j.seeds_done} of {j.seeds_planned}" for j in interim)
            + "). The number of seeds is fixed in the spec before the first run; a verdict after a look, with seeds "
            "added, would be optional stopping."
        )
    lines.append("")
    return lines


def _corpus_lines(judgements: list[Judgement]) -> list[str]:
    """What the runs train on and which corpus's bytes per unit convert E; where the two differ, E both ways and the
    verdict under the training corpus's when it differs (units.py: bytes per GPT-2 token and per word, measured)."""
    from lightning_cqk.sweep.units import CORPUS_NAMES

    with_e = [j for j in judgements if not j.is_control and j.e_corpus]
    trained = sorted({j.train_corpus for j in judgements if j.train_corpus})
    if not trained:
        return []
    names = ", ".join(CORPUS_NAMES.get(c, c) for c in trained)
    line = f"Corpus: the runs train on {names}."
    differ = [j for j in with_e if j.train_corpus and j.train_corpus != j.e_corpus]
    if with_e and not differ:
        line += " E converts each paper's change with the bytes per unit measured on that same corpus."
    if differ:
        line += (
            " E converts the paper's change with the bytes per unit of the paper's corpus; on the training corpus's "
            "own bytes per unit (lightning_cqk/sweep/units.py) it is: "
            + "; ".join(
                f"{j.name}: E {j.converted_pct:+.2f}% ({CORPUS_NAMES.get(j.e_corpus, j.e_corpus)}) vs "
                f"{j.train_pct:+.2f}% ({CORPUS_NAMES.get(j.train_corpus, j.train_corpus)})"
                + (f", verdict there: {j.train_verdict}" if j.train_verdict else ", same verdict")
                for j in differ
                if math.isfinite(j.train_pct)
            )
            + "."
        )
    return [line]


def _control_line(c: Judgement, data: dict[str, Any] | None) -> str:
    """The gate: the control's estimate and interval against its planted size, detected or not, and a miscalibration
    (the planted size outside the control's 95% interval) flagged."""
    predicted = _control_prediction(data, c) if data else ""
    planted = f"planted {c.expected_pct:+.2f}% (predicted before the run)" if math.isfinite(c.expected_pct) else ""
    size = ", ".join(x for x in (planted, predicted) if x)
    e = c.effect
    observed = _ci(e.delta_pct, e.ci_low_pct, e.ci_high_pct) if e else "–"
    line = f"Control `{c.plus[0]}` ({size or 'size not declared'}; observed {observed}%)"
    if c.verdict == DETECTED:
        line += f" detected ({c.why}, outside the family): the study sees an effect of that size."
    else:
        line += (
            f" **not detected** ({c.why}): the study did not show it can see an effect of that size, so the verdicts "
            "that rest on finding no effect (inconclusive, not replicated, equivalent) are marked *sensitivity not "
            "shown*; significant directional verdicts stand. Add seeds."
        )
    if e and math.isfinite(c.expected_pct) and not e.ci_low_pct <= c.expected_pct <= e.ci_high_pct:
        line += (
            f" **Miscalibrated:** the planted {c.expected_pct:+.2f}% lies outside the control's 95% interval, so its "
            "size was not what the plan assumed."
        )
    return line


def _control_prediction(data: dict[str, Any], control: Judgement) -> str:
    """The control's size predicted from the baseline's own validation curve, when the control trains on fewer tokens:
    log(metric) vs log(training tokens) fitted over the second half of the baseline's validations (mean over seeds),
    Δ = (tokens ratio)^slope - 1."""
    groups = data["groups"]
    ctrl, base = groups.get(control.plus[0]), groups.get(control.minus[0])
    if not ctrl or not base or not ctrl["runs"] or not base["runs"]:
        return ""
    scale = (data["manifest"]["spec"].get("control") or {}).get("lr_scale")
    if scale is not None:
        return _lr_control_prediction(data, None if scale == "auto" else float(scale))
    metric = data["manifest"]["spec"].get("metric", "val/ppl")
    t_ctrl = mean([float(r["budget"].get("tokens", math.nan)) for r in ctrl["runs"]])
    t_base = mean([float(r["budget"].get("tokens", math.nan)) for r in base["runs"]])
    if not (math.isfinite(t_ctrl) and math.isfinite(t_base)) or abs(t_ctrl / t_base - 1.0) < 1e-6:
        return ""
    xs, ys = [], []
    for run in base["runs"]:
        series = run["scalars"].get(metric) or []
        per_step = float(run["budget"].get("tokens_per_step") or 0) or t_base / max(series[-1][0] + 1, 1)
        half = series[len(series) // 2 :]
        for step, value in half:
            if value > 0 and math.isfinite(value):
                xs.append(math.log((step + 1) * per_step))
                ys.append(math.log(value))
    if len(set(xs)) < 2:
        return ""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return f"{100 * math.expm1(slope * math.log(t_ctrl / t_base)):+.2f}% from the baseline's own validation curve"


def _lr_control_prediction(data: dict[str, Any], scale: float | None) -> str:
    """The size of a control at `scale` times the baseline's tuned rate (None: `lr_scale: auto`, the scale its runs'
    "{tuned_lr:<level>*auto(<target>)}" takes from the grid), predicted from the grid of the level whose rate it
    scales: tuning.predicted_change, one seed, held-out windows; "" outside the grid."""
    from lightning_cqk.sweep.tuning import TuningError, auto_scale, parse_tuned, predicted_change

    spec = data["manifest"]["spec"]
    tuning = spec.get("tuning") or {}
    group = (spec.get("control") or {}).get("group")
    rates = [
        (r.get("overrides") or {}).get("model.optim.lr") for r in data["manifest"]["runs"] if r.get("group") == group
    ]
    found = [p for p in map(parse_tuned, rates) if p]
    if not found:
        return ""
    level, _, target = found[0]  # the level whose rate the control scales (e.g. `at: {mechanism: standard}`)
    points = sorted((lr, loss) for lv, lr, _, loss in data["tuning"]["rows"] if lv == level)  # a nan: never crossed
    chosen = data["tuning"]["chosen"].get(level, math.nan)
    metric = spec.get("metric", "val/ppl")
    if sum(math.isfinite(loss) for _, loss in points) < 2 or not math.isfinite(chosen):
        return ""
    how = ""
    if target is not None:
        try:
            scale = auto_scale(points, chosen, target, metric)
        except TuningError:
            return ""
        how = f" at lr_scale {scale:.3g}, which the grid chose for a target of {target:+.2f}%"
    change = predicted_change(points, chosen, float(scale), metric)
    if not math.isfinite(change):
        return ""
    return f"{100 * change:+.2f}% from the baseline's own learning-rate grid ({_grid_seeds(tuning)}){how}"


def _grid_seeds(tuning: dict[str, Any]) -> str:
    """'seed 0' (a grid at one seed), else 'mean of seeds 0, 1000, 1001'."""
    if "seeds" not in tuning:
        return f"seed {tuning.get('seed')}"
    return "mean of seeds " + ", ".join(str(x) for x in tuning["seeds"])


def tuning_lines(data: dict[str, Any]) -> list[str]:
    """The learning-rate grid per tuned level: the held-out loss of each rate and the choice (or why none)."""
    spec = data["manifest"]["spec"].get("tuning") or {}
    if "fixed" in spec:
        return ["### Tuning", "", f"One learning rate by design: {spec['fixed']}", ""]
    if not spec:
        return [
            "### Tuning",
            "",
            "No learning-rate grid in this profile: every arm shares one rate, so every verdict comparing mechanisms "
            "is configuration-limited.",
            "",
        ]
    table = data["tuning"]
    lines = [
        "### Tuning",
        "",
        f"Each level of `{spec['axis']}` got its own learning rate: a grid of {len(spec['lrs'])} rates at "
        f"{_grid_at(spec)}, chosen by the {'mean ' if 'seeds' in spec else ''}loss on validation windows "
        f"{spec['held_out'][0]}-{spec['held_out'][1] - 1}, which no verdict reads (lightning_cqk/sweep/tuning.py).",
        "",
        "| level | " + " | ".join(f"lr {lr:g}" for lr in spec["lrs"]) + " | chosen |",
        "|---|" + "---|" * (len(spec["lrs"]) + 1),
    ]
    order = [lv for lv in spec.get("levels") or [] if lv in spec["grid"]]  # the spec's order: a list survives the
    for level in order + [lv for lv in spec["grid"] if lv not in order]:  # sorted keys of study.json, a dict does not
        cells = {lr: loss for lv, lr, _, loss in table["rows"] if lv == level}
        chosen = table["chosen"].get(level, math.nan)
        row = [_grid_cell(cells.get(float(lr), math.nan), table, level, float(lr)) for lr in spec["lrs"]]
        lines.append(f"| {level} | " + " | ".join(row) + f" | {_fmt(chosen, 'g')} |")
    sd_note = " (the mean over the grid seeds ± their sd)" if "seeds" in spec else ""
    lines += ["", f"Held-out loss in nats per token{sd_note}; – where the grid run has not finished.", ""]
    return lines


def _grid_at(spec: dict[str, Any]) -> str:
    """'seed 0' (a grid at one seed) or 'each of seeds 0, 1000, 1001'."""
    if "seeds" not in spec:
        return f"seed {spec['seed']}"
    return "each of seeds " + ", ".join(str(x) for x in spec["seeds"])


def _grid_cell(loss: float, table: dict[str, Any], level: str, lr: float) -> str:
    """A grid point's held-out loss, with ± the sd over its seeds where it has several."""
    sd = table.get("spread", {}).get((level, lr), math.nan)
    return _fmt(loss, ".4f") + (f" ± {sd:.4f}" if math.isfinite(sd) and math.isfinite(loss) else "")


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
    lines += ["### Verdicts", ""] + _claim_lines(judgements, spec, data) + tuning_lines(data)
    lines += ["### Groups", ""]
    lines.append(
        f"| group | seeds (diverged) | val ppl | val bpb | Δ {metric} % [95% CI] | p | test | detectable Δ % | "
        "val-set SE of Δ % | seed-var ratio | moved over last 20% | loss spikes (all seeds) | late train-loss sd % | "
        "tokens | train s | paper Δ % (its unit) |"
    )
    lines.append("|" + "---|" * 16)
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
            _fmt(r["spikes"], ".0f"),
            _fmt(r["late_loss_sd_pct"], ".2f"),
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
            f"Paper Δ % (group table): {published.get('source', 'the paper')}, in the paper's own unit "
            f"({published.get('metric', metric)}; at another scale, corpus and tokenizer): the verdicts compare E, "
            "the same change converted to ours."
        )
    notes.append(
        "Stability: loss spikes are the runs' cumulative train/spikes (LossSpikeMonitor), summed over seeds; the late "
        "train-loss sd is the standard deviation of train/loss over the last 20% of the logged steps, in % of its mean "
        "(mean over seeds); diverged seeds are counted in the seeds column."
    )
    shared = data.get("shared") or {}
    if shared:
        notes.append(
            "Runs shared with other studies (identical configs, overrides and seed: the same run, counted in both): "
            + "; ".join(f"{study}: {', '.join(names)}" for study, names in shared.items())
            + "."
        )
    differs = [
        f"{r['name']} (vs {r['twin']})" for r in data["manifest"].get("runs", []) if r.get("reproduces") is False
    ]
    if differs:
        notes.append(
            "Committed runs not adopted: these probes did not reproduce their committed twins to the last digit on "
            "this machine (another CPU type, or other code), so their arms were computed here: "
            + "; ".join(differs)
            + "."
        )
    once = computed_once(data["manifest"])
    if once:
        notes.append(
            "Runs computed once and shared (the same resolved training configuration and seed, on the same code, "
            "packages and device: lightning_cqk/sweep/identity.py; each counted once per contrast): "
            + "; ".join(once)
            + "."
        )
    same = data.get("same_results") or {}
    if same:
        notes.append(
            "Runs with the same results as another study's runs under another name (seed, learning rate, tokens, "
            "steps and final validation perplexity and loss equal to the last digit: the same settings, "
            "deterministic training; counted in both): "
            + "; ".join(f"{study}: {', '.join(pairs)}" for study, pairs in same.items())
            + "."
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
    "spikes",
    "late_loss_sd_pct",
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
    "published_unit",
    "converted_pct",
    "converted_rule",
    "alt_pct",
    "alt_verdict",
    "p_effect",
    "p_holm_effect",
    "family",
    "level",
    "v_low_pct",
    "v_high_pct",
    "seeds_needed",
    "excluded_pct",
    "expected_pct",
    "limited",
    "e_corpus",
    "train_corpus",
    "train_pct",
    "train_verdict",
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
            "mde_pct": j.mde_pct,
            "verdict": j.verdict,
            "why": j.why,
            **{k: getattr(j, k) for k in CLAIM_FIELDS[CLAIM_FIELDS.index("published_unit") :] if k not in ("mde_pct",)},
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
    from lightning_cqk.sweep.results import COMMITTED, same_results, shared_runs, write_committed

    out = Path(output) if output is not None else (sweep_dir if data["committed"] else sweep_dir / "report")
    data["shared"] = shared_runs(out, data["manifest"])
    data["same_results"] = same_results(out, data)
    study = data["manifest"]["study"]
    rows = table_rows(data)
    judgements = verdicts(data)
    md = with_live_sweep_note(markdown(data, rows, judgements), data, output)
    glue_md = _glue_section(sweep_dir, glue or [])
    if glue_md:
        md = f"{md.rstrip()}\n\n## GLUE (fine-tuned checkpoints, `lightning_cqk glue`)\n\n{glue_md}"
    names = {"markdown": f"{study}.md", "csv": f"{study}.csv", "claims": "claims.csv"}
    in_place = data["committed"] and out.resolve() == sweep_dir.resolve()  # `report <results folder>`: its inputs
    try:  # the whole report is written beside `out` and swapped in: never half old, half new (report_folder.py)
        with report_folder.staged(out, owned=report_folder_owns(study)) as stage:
            if glue_md:
                (stage / "glue.md").write_text(glue_md)
            (stage / names["markdown"]).write_text(md)
            (stage / names["csv"]).write_text(to_csv(rows))
            (stage / names["claims"]).write_text(claims_csv(judgements))
            if in_place:  # the committed inputs go into the new folder unchanged (the swap replaces the folder)
                for name in COMMITTED:
                    if (out / name).is_file():
                        shutil.copy2(out / name, stage / name)
                        names[name] = name
            else:
                names.update({path.name: path.name for path in write_committed(data, stage)})
            drawn = figures(data, stage, judgements)
            if in_place:  # drawn from the runs' event files, which a results folder does not hold: kept as committed
                for fig in drawn:
                    if (out / fig.name).is_file():
                        shutil.copy2(out / fig.name, fig)
            names.update({fig.stem: fig.name for fig in drawn})
    except report_folder.NotAReportFolder as err:
        raise ReportError(
            f"{err}: the report replaces its folder as a whole, which would delete them. Write it into a new folder "
            f"or one that holds only an earlier report: lightning_cqk report {sweep_dir} --output <new folder>."
        ) from None
    except OSError as err:
        raise ReportError(write_failure(out, sweep_dir, err)) from None
    paths = {key: out / name for key, name in names.items()}
    if not quiet:
        print(md)
        pngs = ", ".join(p.name for p in paths.values() if p.suffix == ".png")
        print(f"Report: {paths['markdown']}, {paths['csv']}, {paths['claims']}; figures ({out}): {pngs}")
    return paths


def with_live_sweep_note(md: str, data: dict[str, Any], output: str | Path | None) -> str:
    """`md` with a line under its title when a sweep still runs in the sweep directory: the report is an interim one
    of an unfinished, live sweep (its unfinished runs are left out of every number), to be written again at the end."""
    from lightning_cqk.sweep.runner import live_owner

    source = Path(data["source"])
    owner = None if data["committed"] else live_owner(source)
    if owner is None:
        return md
    done = sum(len(g["runs"]) for g in data["groups"].values()) + len(data["tuning_runs"])
    again = shlex.join(["lightning_cqk", "report", str(source), *(["--output", str(output)] if output else [])])
    note = (
        f"**Interim report of a live sweep:** a sweep is still running in {source} ({owner.describe()}); "
        f"{done} of its {len(data['manifest']['runs'])} runs have finished, and only they are in these numbers. "
        f"Write the report again when the sweep has ended: `{again}`."
    )
    title, _, rest = md.partition("\n")
    return f"{title}\n\n{note}\n{rest}"


def report_folder_owns(study: str):
    """Whether a file name is one a report of `study` writes (recognises reports made before `.report.json`)."""
    tables = {f"{study}.md", f"{study}.csv", "claims.csv", "runs.csv", "glue.md", "study.json", "curves.csv"}
    tables |= {"val_windows.json"}
    return lambda name: name in tables or name.endswith(".png")


def write_failure(out: Path, sweep_dir: Path, err: OSError) -> str:
    """One paragraph for a report that could not be written (a full disk, a quota, a file-size limit)."""
    code = f", {errno.errorcode.get(err.errno, err.errno)}" if err.errno else ""
    what = f"{err.strerror or err}{code}" + (f", writing {Path(err.filename).name}" if err.filename else "")
    before = "The previous report there is unchanged" if out.exists() else "No report was left there"
    full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    fix = (
        f"Free space on that disk (`df -h {out.parent}`; the report needs a few MB) and run the same command again, "
        f"or write it elsewhere: lightning_cqk report {sweep_dir} --output <folder on another disk>."
        if full
        else f"Check that {out.parent} is writable (permissions, a mounted disk), or write it elsewhere: "
        f"lightning_cqk report {sweep_dir} --output <folder>."
    )
    return f"could not write the report into {out} ({what}). {before} (the partial new one was removed). {fix}"


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
