"""The report's estimators (its second stage, after reading: lightning_cqk/study/report/report_command.py): per group
the final
metrics, how far runs settled and how stable they were, the validation set's sampling error and the paired window
error, the learning-rate grid's table and choice, which arms lack a tuned rate of their own, the control's predicted
size, and the verdicts (study/judge/verdict.py on study/judge/stats.py)."""

from __future__ import annotations

import math
from typing import Any

from lightning_cqk.study.design.claim import Claim, measured_group, parse_claim
from lightning_cqk.study.design.tuned_rate import all_grid_runs, grid_names
from lightning_cqk.study.judge.stats import bootstrap_se_of_mean_loss, contrast, mean, n_diverged, std, variance_ratio
from lightning_cqk.study.judge.verdict import Judgement, judge
from lightning_cqk.study.results_model import Group, StudyData, TuningTable

VAL_METRICS = ("val/ppl", "val/bpb")

SETTLE_FRACTION = 0.8  # "still moving": the change of the metric over the last 20% of training


def tuning_table(data: StudyData) -> TuningTable:
    """The learning-rate grid's rows (level, lr, run(s), held-out loss), choice per level, and the spread and losses
    of each rate over its seeds (empty without a grid): a rate's loss is the mean over its grid seeds
    (tuned_rate.mean_loss), its spread their sample sd (nan at one seed); several runs are named joined by ", "."""
    from lightning_cqk.study.design.tuned_rate import choose, mean_loss

    spec = data.manifest["spec"].get("tuning") or {}
    by_name = {r["name"]: r for r in data.tuning_runs}
    rows, chosen, spread, seeds = [], {}, {}, {}
    for level, grid in (spec.get("grid") or {}).items():
        losses = {}
        for lr, point in grid.items():
            names = grid_names(point)
            per_seed = [by_name[n]["heldout_loss"] if n in by_name else math.nan for n in names]
            losses[float(lr)] = mean_loss(per_seed)
            spread[(level, float(lr))] = std(per_seed) if len(per_seed) > 1 else math.nan
            seeds[(level, float(lr))] = per_seed
            rows.append((level, float(lr), ", ".join(names), losses[float(lr)]))
        chosen[level] = choose(losses)
    return TuningTable(rows, chosen, spread, seeds)


def untuned_groups(data: StudyData) -> dict[str, str]:
    """group -> why its learning rate is not its own (tuning parity): every group when the profile has no grid."""
    from lightning_cqk.study.design.tuned_rate import is_tuned_rate

    spec = data.manifest["spec"]
    tuning = spec.get("tuning") or {}
    if "fixed" in tuning:
        return {}
    control = (spec.get("control") or {}).get("group")
    if not tuning:
        return {g: "one learning rate for every arm (no tuning grid)" for g in data.groups if g != control}
    out = {}
    runs = {r["name"]: r for r in data.manifest["runs"]}
    grid_levels = {  # tuned level -> the levels its grid ran at
        level: runs[name]["levels"]
        for level, by_lr in (tuning.get("grid") or {}).items()
        for name in [grid_names(point)[0] for point in list(by_lr.values())[:1]]
        if name in runs
    }
    for name, group in data.groups.items():
        entries = [runs[r["name"]] for r in group.runs if r["name"] in runs]
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
    from lightning_cqk.study.design.tuned_rate import parse_tuned

    parsed = parse_tuned(rate)
    level = parsed.level if parsed else None
    ran_at = grid_levels.get(level) if level else None
    if not ran_at:
        return ""
    other = {a: lv for a, lv in ran_at.items() if a != axis and levels.get(a) != lv}
    if not other and (not level or levels.get(axis) == level):
        return ""
    where = ", ".join(f"{a}={lv}" for a, lv in sorted(other.items())) or f"{axis}={level}"
    return f"rate chosen by the grid at {where}, inherited (not tuned at this level)"


def final(run: dict[str, Any], tag: str) -> float:
    series = run["scalars"].get(tag) or []
    return series[-1][1] if series else math.nan


def settle_pct(run: dict[str, Any], tag: str, subset: int | None = None, fraction: float = SETTLE_FRACTION) -> float:
    """% change of `tag` from its last value at or before `fraction` of the run's last step to its final value, on
    the same windows: where the final validation scored a larger set than the curve (`data.final_val_windows`), its
    value on the curve's `subset` (the first windows of the final set: data/val_sets.py) is recomputed from the
    run's per-window losses (val_windows.json), and is nan without them."""
    series = run["scalars"].get(tag) or []
    if len(series) < 2:
        return math.nan
    last_step, last = series[-1]
    earlier = [v for s, v in series if s <= fraction * last_step]
    if subset is not None:
        last = final_on_windows(run, tag, subset)
    if not earlier or not (math.isfinite(earlier[-1]) and math.isfinite(last)) or earlier[-1] == 0:
        return math.nan
    return 100.0 * (last / earlier[-1] - 1.0)


def final_on_windows(run: dict[str, Any], tag: str, n: int) -> float:
    """A run's final `tag` on the first `n` windows of its final validation (its summed NLL and tokens per window):
    loss = sum(nll) / sum(tokens); ppl = exp(loss); bits per byte scale with the loss (one bytes-per-token factor)."""
    windows = run.get("windows") or {}
    nll, tokens = list(windows.get("nll") or [])[:n], list(windows.get("tokens") or [])[:n]
    if len(nll) < n or len(tokens) < n or not sum(tokens):
        return math.nan
    loss = sum(nll) / sum(tokens)
    if tag == "val/loss":
        return loss
    if tag == "val/ppl":
        return math.exp(loss)
    if tag == "val/bpb":
        return loss * final(run, "val/bpb") / final(run, "val/loss")
    return math.nan


def curve_subset(entry: dict[str, Any]) -> int | None:
    """The windows a run's curve scored when its final validation scored more (`trainer.limit_val_batches` x the
    validation batch, under `data.final_val_windows`: data/val_sets.py), from its settings as the CLI resolves
    them; None when the curve and the final value score one set."""
    from lightning_cqk.study.design.cost_estimate import resolve
    from lightning_cqk.study.design.settings import ConfigUnresolvable

    try:
        settings = resolve(list(entry.get("configs") or []), dict(entry.get("overrides") or {}))
    except (ConfigUnresolvable, ValueError):
        return None
    data, trainer = settings["data"], settings["trainer"]
    final_windows, limit = data.get("final_val_windows"), trainer.get("limit_val_batches")
    if not final_windows or not isinstance(limit, int) or isinstance(limit, bool):
        return None
    subset = limit * int(data.get("val_batch_size") or data.get("batch_size") or 1)
    return subset if subset < int(final_windows) else None


STABILITY = ("spikes", "late_loss_sd_pct")  # per run: cumulative loss spikes; sd of train/loss over the last 20%


def late_loss_points(series: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The points of a train/loss series that `run_stability` reads: from SETTLE_FRACTION of its last finite step
    on (non-finite ones included; it skips them). A report commits them to curves.csv, its late sd's source."""
    finite = [s for s, v in series if math.isfinite(v)]
    if not finite:
        return []
    return [(s, v) for s, v in series if s >= SETTLE_FRACTION * finite[-1]]


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


def group_values(data: StudyData, tag: str) -> dict[str, dict[int, float]]:
    """group -> {seed: final value of tag} over the finished runs (non-finite values kept: they count as diverged).

    `tag` is a scalar (val/ppl, ...) or a stability measure of STABILITY (run_stability)."""
    if tag in STABILITY:
        return {
            name: {r["seed"]: float(r.get("stability", {}).get(tag, math.nan)) for r in g.runs}
            for name, g in data.groups.items()
        }
    return {name: {r["seed"]: final(r, tag) for r in g.runs} for name, g in data.groups.items()}


def baseline_group(levels: dict[str, str], baseline: dict[str, str], groups: dict[str, Group]) -> str | None:
    target = dict(levels, **baseline)
    for name, group in groups.items():
        if group.levels == target:
            return name
    return None


def _published_delta(name: str, base: str | None, published: dict[str, Any]) -> float:
    values, deltas = published.get("values") or {}, published.get("deltas") or {}
    if name in deltas:
        return float(deltas[name])
    pub, pub_base = values.get(name), values.get(base) if base else None
    return 100.0 * (float(pub) / float(pub_base) - 1.0) if pub is not None and pub_base else math.nan


def table_rows(data: StudyData) -> list[dict[str, Any]]:
    """One row per group (floats; nan where not defined)."""
    spec = data.manifest["spec"]
    metric = spec.get("metric", "val/ppl")
    published = spec.get("published") or {}
    groups = data.groups
    values = group_values(data, metric)
    rows = []
    for name, group in groups.items():
        runs = group.runs
        base = baseline_group(group.levels, spec["baseline"], groups)
        own = list(values[name].values())
        row: dict[str, Any] = {"group": name, "baseline": base or "", "seeds": len(runs), "diverged": n_diverged(own)}
        for tag in VAL_METRICS:
            xs = [final(r, tag) for r in runs]
            row[f"{tag}_mean"], row[f"{tag}_std"] = mean(xs), std(xs)
        entry = next((e for e in data.manifest.get("runs", []) if e.get("group") == name), {})
        subset = curve_subset(entry)  # the curve's windows, where the final value scored more
        row["settle_pct"] = mean([settle_pct(r, metric, subset) for r in runs])
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
        row["val_se_delta_pct"] = paired_window_se(runs, groups[base].runs) if base and base != name else math.nan
        for key in ("tokens", "flops", "wallclock"):
            row[key] = mean([float(r["budget"].get(key, math.nan)) for r in runs])
        row["published_delta_pct"] = _published_delta(name, base, published)
        rows.append(row)
    return rows


def val_sampling_error(data: StudyData) -> tuple[float, int, int]:
    """(bootstrap SE of the validation loss over windows, in % of the metric; windows; runs it is the median of).

    For val/ppl, a standard error s of the loss (nats) is a relative error of about 100 s % of the perplexity; for
    val/bpb and val/loss likewise relative to the loss. Median over the runs that wrote `val_windows.json`."""
    metric = data.manifest["spec"].get("metric", "val/ppl")
    errs, windows = [], 0
    for group in data.groups.values():
        for run in group.runs:
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


def verdicts(data: StudyData) -> list[Judgement]:
    """The spec's claims (and its positive control) judged on the finished runs."""
    spec = data.manifest["spec"]
    metric = spec.get("metric", "val/ppl")
    values = dict(group_values(data, metric))
    untuned = untuned_groups(data)
    planned = planned_seeds(data)
    claims = [parse_claim(c) for c in spec.get("claims") or []]  # parsed once; the verdicts read these
    judged = []
    for claim in claims:
        on = claim.measure
        if on and on != metric:  # a claim about another measure (a stability one): its groups' values on it
            for name, by_seed in group_values(data, on).items():
                values[measured_group(name, on)] = by_seed
                if name in planned:
                    planned[measured_group(name, on)] = planned[name]
                if name in untuned:
                    untuned[measured_group(name, on)] = untuned[name]
            claim = claim.on(on)
        judged.append(claim)
    corpora = training_corpora(data, claims)
    return judge(
        values, judged, spec.get("control"), metric=metric, untuned=untuned, planned=planned, train_corpus=corpora
    )


def training_corpora(data: StudyData, claims: list[Claim]) -> dict[str, str]:
    """claim name -> the corpus its baseline group's runs train on (units.BYTES_PER_UNIT key), from the runs' config
    files (found as `--config` finds them) and overrides; claims whose corpus is none of the measured ones are left
    out."""
    from lightning_cqk.study.design.cost_estimate import resolve
    from lightning_cqk.study.design.settings import ConfigUnresolvable
    from lightning_cqk.study.design.units import training_corpus

    by_group: dict[str, str | None] = {}
    for run in data.manifest["runs"]:
        if run["group"] not in by_group:
            try:
                settings = resolve(list(run.get("configs") or []), dict(run.get("overrides") or {}))["data"]
            except (ConfigUnresolvable, ValueError):
                settings = {}  # a config file that is gone: its corpus is not known
            by_group[run["group"]] = training_corpus({f"data.{k}": v for k, v in settings.items()})
    out = {}
    for claim in claims:
        if by_group.get(claim.baseline):
            out[claim.name] = str(by_group[claim.baseline])
    return out


def planned_seeds(data: StudyData) -> dict[str, int]:
    """group -> the number of runs the study plans for it (its manifest: finished or not; the tuning grid left out)."""
    tune_spec = data.manifest["spec"].get("tuning") or {}
    tune_names = all_grid_runs(tune_spec)
    planned: dict[str, int] = {}
    for run in data.manifest["runs"]:
        if run["name"] not in tune_names:
            planned[run["group"]] = planned.get(run["group"], 0) + 1
    return planned


def control_prediction(data: StudyData, control: Judgement) -> str:
    """The control's size predicted from the baseline's own validation curve, when the control trains on fewer tokens:
    log(metric) vs log(training tokens) fitted over the second half of the baseline's validations (mean over seeds),
    Δ = (tokens ratio)^slope - 1."""
    groups = data.groups
    ctrl, base = groups.get(control.plus[0]), groups.get(control.minus[0])
    if not ctrl or not base or not ctrl.runs or not base.runs:
        return ""
    scale = (data.manifest["spec"].get("control") or {}).get("lr_scale")
    if scale is not None:
        return lr_control_prediction(data, None if scale == "auto" else float(scale))
    metric = data.manifest["spec"].get("metric", "val/ppl")
    t_ctrl = mean([float(r["budget"].get("tokens", math.nan)) for r in ctrl.runs])
    t_base = mean([float(r["budget"].get("tokens", math.nan)) for r in base.runs])
    if not (math.isfinite(t_ctrl) and math.isfinite(t_base)) or abs(t_ctrl / t_base - 1.0) < 1e-6:
        return ""
    xs, ys = [], []
    for run in base.runs:
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


def lr_control_prediction(data: StudyData, scale: float | None) -> str:
    """The size of a control at `scale` times the baseline's tuned rate (None: `lr_scale: auto`, the scale its runs'
    "{tuned_lr:<level>*auto(<target>)}" takes from the grid), predicted from the grid of the level whose rate it
    scales: tuning.predicted_change, one seed, held-out windows; "" outside the grid."""
    from lightning_cqk.study.design.tuned_rate import TuningError, auto_scale, parse_tuned, predicted_change

    spec = data.manifest["spec"]
    tuning = spec.get("tuning") or {}
    group = (spec.get("control") or {}).get("group")
    rates = [(r.get("overrides") or {}).get("model.optim.lr") for r in data.manifest["runs"] if r.get("group") == group]
    found = [p for p in map(parse_tuned, rates) if p]
    if not found:
        return ""
    level, target = found[0].level, found[0].auto_target_pct  # the level whose rate the control scales
    points = sorted((lr, loss) for lv, lr, _, loss in data.tuning.rows if lv == level)  # a nan: never crossed
    chosen = data.tuning.chosen.get(level, math.nan)
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


def control_calibration(data: StudyData, control: Judgement) -> tuple[float, float, int]:
    """(the standard error of the planted size's prediction in %, the two-sided p of the control's observed change
    against it, the grid seeds it is predicted from) for a rate control planted from its baseline's grid: the
    prediction is made on each grid seed's own curve (`tuning.predicted_change` at the rate scale the control
    trains at), its error the sd of those over sqrt(seeds); observed minus planted over sqrt(se_obs^2 + se_pred^2)
    is normal. (nan, nan, seeds) where it cannot be known (one grid seed, not a rate control)."""
    from scipy import stats as scipy_stats

    from lightning_cqk.study.design.tuned_rate import TuningError, auto_scale, parse_tuned, predicted_change

    spec = data.manifest["spec"]
    scale_spec = (spec.get("control") or {}).get("lr_scale")
    group = (spec.get("control") or {}).get("group")
    rates = [(r.get("overrides") or {}).get("model.optim.lr") for r in data.manifest["runs"] if r.get("group") == group]
    found = [p for p in map(parse_tuned, rates) if p]
    e = control.effect
    if scale_spec is None or not found or e is None or not math.isfinite(control.expected_pct) or e.n < 2:
        return math.nan, math.nan, 0
    level, target = found[0].level, found[0].auto_target_pct
    metric = spec.get("metric", "val/ppl")
    chosen = data.tuning.chosen.get(level, math.nan)
    per_seed = {lr: xs for (lv, lr), xs in data.tuning.per_seed.items() if lv == level}
    n_seeds = min((len(xs) for xs in per_seed.values()), default=0)
    if n_seeds < 2 or not math.isfinite(chosen):
        return math.nan, math.nan, n_seeds
    points = sorted((lr, loss) for lv, lr, _, loss in data.tuning.rows if lv == level)
    try:
        scale = auto_scale(points, chosen, target, metric) if scale_spec == "auto" else float(scale_spec)
    except TuningError:
        return math.nan, math.nan, n_seeds
    predictions = [
        100.0 * predicted_change([(lr, xs[i]) for lr, xs in per_seed.items()], chosen, scale, metric)
        for i in range(n_seeds)
    ]
    if not all(math.isfinite(x) for x in predictions):
        return math.nan, math.nan, n_seeds
    se_pred = std(predictions) / math.sqrt(n_seeds)
    se_obs = (e.ci_high_pct - e.ci_low_pct) / (2.0 * scipy_stats.t.ppf(0.975, e.n - 1))
    z = (e.delta_pct - control.expected_pct) / math.hypot(se_obs, se_pred)
    return se_pred, float(2.0 * scipy_stats.norm.sf(abs(z))), n_seeds
