"""The runs.csv numbers a verdict, a grid choice or a control reads, recomputed from their second committed source.

A folder of committed results (lightning_cqk/study/report/results.py) is read as untrusted. Its runs.csv is published
with
the report, and some of its columns are read by the report itself; each such column of a finished run is recomputed
here from another committed file, and `disagreements` yields every row where the two differ (results.read_committed
refuses the first, naming the file and line):

    column            recomputed from
    spikes            the run's last train/spikes in curves.csv (its final cumulative loss-spike count)
    late_loss_sd_pct  the run's late train/loss window in curves.csv (estimators.run_stability; a report commits
                      that window: estimators.late_loss_points)
    heldout_loss      a grid run's held-out windows in val_windows.json (tuning.held_out_loss); nan for any other
    lr                the run's `model.optim.lr` in study.json: a number, or a tuned rate filled in with the grid's
                      choice from the held-out losses above (results.run_lr, as the runner filled it in at launch)
    steps             the step after the run's last validation in curves.csv (step index N - 1 after N steps)
    tokens            the run's last train/tokens_seen in curves.csv when logged at its last step; logged earlier,
                      that count plus the steps after it at `tokens_per_step`
    tokens_per_step   the rate of the run's train/tokens_seen in curves.csv, (step + 1) x rate at every committed
                      step (a token control's predicted size puts the baseline's validations at (step + 1) x it:
                      one run's doubled moved logit_control's from +13.23% to +2.02%); a run whose counts are at
                      no one rate (resumed at another, an epoch ending mid-accumulation) is not checked
    status            'done' only for a run with a validation in curves.csv (a finished run's last one is its result)
    val_loss/ppl/bpb  (results.py) the run's last value of the tag in curves.csv

The final validation values are checked by results.py. Not recomputed: wallclock and flops (shown, read by no
verdict), and the rate of a run whose study.json gives no `model.optim.lr` (its config files', which the folder
does not hold).

Folders committed before train/loss was (the nine of docs/results at issue 45, whose runs' event files were never
committed): no source holds their late train loss, so their late_loss_sd_pct is read as recorded and the report
says so (`unchecked_note`). Their other columns are recomputed as above.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning_cqk.study.design.tuned_rate import all_grid_runs, held_out_loss
from lightning_cqk.study.judge.group_estimates import STABILITY, run_stability, tuning_table
from lightning_cqk.study.report.results import LOSS_TAG, VAL_TAGS, run_lr
from lightning_cqk.study.results_model import StudyData

SPIKES_TAG, TOKENS_TAG = "train/spikes", "train/tokens_seen"


def run_windows(windows: dict[str, Any], name: str) -> dict[str, list[float]] | None:
    """A run's {"nll", "tokens"} of a committed val_windows.json (its tokens, or the ones most runs share, "*")."""
    if name not in (windows.get("nll") or {}):
        return None
    tokens = windows.get("tokens") or {}
    return {"nll": windows["nll"][name], "tokens": tokens[name] if name in tokens else tokens.get("*", [])}


def _value(text: str) -> float | None:
    """A runs.csv cell as a float (empty: nan); None when it is not a number (results.py refuses it by name)."""
    try:
        return float(text) if text != "" else math.nan
    except ValueError:
        return None


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _shown(x: float) -> str:
    """A count as a whole number (256000), anything else as repr."""
    return str(int(x)) if math.isfinite(x) and x == int(x) and abs(x) < 2**53 else repr(x)


def _late_sd(series: dict[str, list[tuple[int, float]]], unsourced: bool) -> tuple[float, str]:
    """(the run's late train-loss sd from curves.csv, what gives it); '' when it has no source there and may not
    (`unsourced`: a folder committed before train/loss was, or a run adopted from one)."""
    if series.get(LOSS_TAG):
        sd = run_stability(series)["late_loss_sd_pct"]
        steps = [s for s, v in series[LOSS_TAG] if math.isfinite(v)]
        where = f"steps {steps[0]}-{steps[-1]}" if steps else "no finite value"
        return sd, f"the sd of its late train/loss in curves.csv ({where}) is {sd!r} % of their mean"
    if unsourced:
        return math.nan, ""  # read unchecked, and said so (unchecked_note)
    return math.nan, "curves.csv holds no train/loss of this run (the source of its late sd), but does of others"


def _tokens_disagree(series: dict[str, list[tuple[int, float]]], tokens: float, steps: float, per_step: float) -> str:
    """Why a run's `tokens` is not what its train/tokens_seen in curves.csv gives ('' when it is)."""
    seen = series.get(TOKENS_TAG) or []
    if not seen:
        return "curves.csv holds no train/tokens_seen of this run" if math.isfinite(tokens) else ""
    step, value = seen[-1]
    if step + 1 == steps:
        why = f"its last train/tokens_seen in curves.csv (step {step}, its last step) is {_shown(value)}"
        return "" if _same(tokens, value) else why
    if math.isfinite(per_step) and math.isfinite(steps):  # logged before the last step: the steps after it
        later = steps - 1 - step
        total = value + later * per_step
        why = (
            f"its last train/tokens_seen in curves.csv ({_shown(value)} at step {step}) and {_shown(later)} more "
            f"steps of {_shown(per_step)} tokens give {_shown(total)}"
        )
        return "" if _same(tokens, total) else why
    # the rate changed over the run (no tokens_per_step) after its last logged count: at least that count
    return "" if tokens >= value else f"its train/tokens_seen in curves.csv is already {_shown(value)} at step {step}"


def _held_out(tuning: dict[str, Any]) -> tuple[int, int] | None:
    """The grid's held-out windows [first, end) as study.json records them; None when that is not two whole numbers."""
    bounds = tuning.get("held_out")
    if not isinstance(bounds, list) or len(bounds) != 2 or not all(type(b) is int for b in bounds):
        return None
    return bounds[0], bounds[1]


def _rate_disagrees(series: dict[str, list[tuple[int, float]]], per_step: float) -> str:
    """Why a run's `tokens_per_step` is not the one rate of its train/tokens_seen in curves.csv ('' when it is, or
    when its counts are at no one rate)."""
    seen = series.get(TOKENS_TAG) or []
    if not seen:
        return ""
    rate = seen[0][1] / (seen[0][0] + 1)
    if any(value != (step + 1) * rate for step, value in seen) or _same(per_step, rate):
        return ""
    return f"its train/tokens_seen in curves.csv is (step + 1) x {_shown(rate)} at each of its {len(seen)} steps"


def disagreements(
    rows: list[tuple[int, dict[str, str]]],
    scalars: dict[str, dict[str, list[tuple[int, float]]]],
    windows: dict[str, Any],
    manifest: dict[str, Any],
) -> Iterator[tuple[int | None, str]]:
    """(line, "run X's column is 'v', but <its source> gives w") for every finished run's column of runs.csv that
    differs from its recomputation (module docstring); the grid's held-out losses are checked before the rates
    chosen from them. Line None: study.json itself cannot be a source (a held-out range or rate that is not one)."""
    tuning = manifest.get("spec", {}).get("tuning") or {}
    grid_runs = all_grid_runs(tuning)
    held_out = _held_out(tuning)
    if grid_runs and held_out is None:
        yield None, f"its grid's held_out {tuning.get('held_out')!r} is not the [first, end) of the held-out windows"
        return
    any_loss = any(LOSS_TAG in tags for tags in scalars.values())
    adopted = {str(entry["name"]) for entry in manifest.get("runs") or [] if entry.get("adopted_from")}
    done = [(line, row) for line, row in rows if row["status"] == "done"]
    held: dict[str, float] = {}
    for line, row in done:
        name, series = row["run"], scalars.get(row["run"], {})
        given = {column: _value(row[column]) for column in (*STABILITY, "heldout_loss", "steps", "tokens")}
        checks: list[tuple[str, float, str]] = []
        last_val = max((series[tag][-1][0] for tag in VAL_TAGS if series.get(tag)), default=None)
        if last_val is None:  # a run counts as finished by its last validation (report_read.unfinished_reason)
            yield line, f"run {name} is listed as done, but curves.csv holds no validation of it"
            continue
        else:
            after = f"its last validation in curves.csv is at step index {last_val}, after {last_val + 1} steps"
            checks.append(("steps", last_val + 1.0, after))
        spikes = run_stability(series)["spikes"]
        logged = f"its last train/spikes in curves.csv is {spikes!r}"
        checks.append(("spikes", spikes, logged if series.get(SPIKES_TAG) else "curves.csv holds no train/spikes"))
        late, source = _late_sd(series, not any_loss or name in adopted)
        if source:
            checks.append(("late_loss_sd_pct", late, source))
        if name in grid_runs:
            first, end = held_out or (0, 0)
            held[name] = held_out_loss(run_windows(windows, name), (first, end))
            loss = repr(held[name]) if math.isfinite(held[name]) else "no finite loss (absent or not finite)"
            checks.append(
                ("heldout_loss", held[name], f"its windows {first}-{end - 1} in val_windows.json give {loss}")
            )
        else:
            checks.append(("heldout_loss", math.nan, "only a learning-rate grid run has a held-out loss"))
        for column, expected, why in checks:
            value = given[column]
            if value is not None and not _same(value, expected):
                yield line, f"run {name}'s {column} is {row[column]!r}, but {why}"
        per_step = _value(row["tokens_per_step"])
        if given["steps"] is not None and given["tokens"] is not None and per_step is not None:
            why = _tokens_disagree(series, given["tokens"], given["steps"], per_step)
            if why:
                yield line, f"run {name}'s tokens is {row['tokens']!r}, but {why}"
        why = _rate_disagrees(series, per_step) if per_step is not None else ""
        if why:
            yield line, f"run {name}'s tokens_per_step is {row['tokens_per_step']!r}, but {why}"
    yield from _rate_disagreements(done, manifest, held)


def _rate_disagreements(
    done: list[tuple[int, dict[str, str]]], manifest: dict[str, Any], held: dict[str, float]
) -> Iterator[tuple[int | None, str]]:
    """The recorded rate of every finished run whose study.json gives `model.optim.lr`, against that rate (a tuned
    one filled in with the grid's choice from the checked held-out losses `held`)."""
    grid = StudyData(manifest, tuning_runs=[{"name": name, "heldout_loss": loss} for name, loss in held.items()])
    grid.tuning = tuning_table(grid)
    entries = {str(entry["name"]): entry for entry in manifest.get("runs") or []}
    for line, row in done:
        entry = entries.get(row["run"], {})
        rate = (entry.get("overrides") or {}).get("model.optim.lr")
        given = _value(row["lr"])
        if rate is None or given is None:
            continue
        try:
            expected = run_lr(entry, grid, None)
        except (TypeError, ValueError):
            yield None, f"run {row['run']}'s model.optim.lr {rate!r} is not a learning rate"
            continue
        if not _same(given, expected):
            how = " (the grid's choice from the held-out losses)" if isinstance(rate, str) else ""
            yield (
                line,
                f"run {row['run']}'s lr is {row['lr']!r}, but its rate {rate} in study.json is {expected!r}{how}",
            )


def unchecked_note(data: StudyData) -> str:
    """'' unless a finished run's late_loss_sd_pct has no committed train/loss to be recomputed from (a folder
    committed before train/loss was, or runs adopted from one: module docstring); then a line naming them, the
    claims that read it, and how to give it a source."""
    runs = [r for g in data.groups.values() for r in g.runs] + list(data.tuning_runs)
    names = [
        r["name"]
        for r in runs
        if LOSS_TAG not in r["scalars"] and math.isfinite(float(r.get("stability", {}).get("late_loss_sd_pct", "nan")))
    ]
    if not names:
        return ""
    spec = data.manifest.get("spec", {})
    readers = [str(c.get("name")) for c in spec.get("claims") or [] if c.get("metric") in STABILITY]
    study, profile = data.manifest.get("study", "<study>"), data.manifest.get("profile", "cpu")
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    which = (
        f"all {len(runs)} runs" if len(names) == len(runs) else f"{len(names)} run{'s' * (len(names) > 1)} ({shown})"
    )
    where = f" of {Path(data.source) / 'runs.csv'}" if data.committed and data.source else " (adopted)"
    output = f" --output {data.source}" if data.committed and data.source else ""
    return (
        f"Note: late_loss_sd_pct{where}, {which}: no second source; their train/loss was never committed (a folder "
        f"committed before curves.csv held it, issue 45, whose runs' event files are gone), so it is read as "
        f"recorded, unchecked"
        + (f", by the claims {', '.join(readers)}" if readers else " (shown in the group table; no claim reads it)")
        + f". To check it, run the study again without --adopt and write its report from the runs: lightning_cqk "
        f"sweep configs/ablations/{study}.yaml --profile {profile}, then lightning_cqk report "
        f"runs/{study}-{profile}{output}."
    )
