"""Reading a study's runs for its report: the manifest (or committed results), each finished run's TensorBoard
scalars, budget.json, val_windows.json and recorded learning rate, the runs that were shared rather than computed
again, and the runs not finished and why (the report's first stage: lightning_cqk/study/report/report_command.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lightning_cqk.study.design.tuned_rate import all_grid_runs
from lightning_cqk.study.judge.group_estimates import run_stability, tuning_table
from lightning_cqk.study.results_model import Group, ReportError, StudyData
from lightning_cqk.study.run.run_scalars import read_scalars

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


def _read_manifest(sweep_dir: Path) -> dict[str, Any]:
    path = sweep_dir / "manifest.json"
    if not path.is_file():
        raise ReportError(
            f"{sweep_dir}: no manifest.json. `lightning_cqk report` reads a sweep directory written by "
            "`lightning_cqk sweep configs/ablations/<study>.yaml` (default runs/<study>-<profile>)."
        )
    from lightning_cqk.study.report.results import read_manifest

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


def collect(sweep_dir: str | Path) -> StudyData:
    """Everything the tables and figures need: per group, per finished run, the scalars and budget.

    `sweep_dir` is a sweep directory (manifest.json and run directories) or a folder of committed results
    (study.json, runs.csv, curves.csv: lightning_cqk/study/report/results.py); both give the same structure. The runs
    of a
    learning-rate grid (spec `tuning:`) are kept apart, under "tuning_runs", with their held-out loss.
    """
    from lightning_cqk.study.design import tuned_rate as tuning
    from lightning_cqk.study.report import results

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
    groups: dict[str, Group] = {}
    tuning_runs: list[dict[str, Any]] = []
    missing: list[str] = []
    unfinished: dict[str, str] = {}
    adopted: dict[str, dict[str, Any]] = {}  # committed folder -> its finished runs
    for run in manifest["runs"]:
        is_tune = run["name"] in tune_names
        if not is_tune:
            group = groups.setdefault(run["group"], Group(run["levels"]))
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
        elif run.get("adopted_from"):  # numbers of a committed twin, adopted by the runner (study/run/adopt.py)
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
        (tuning_runs if is_tune else group.runs).append(entry)
    data = StudyData(manifest, groups, missing, unfinished, tuning_runs, committed, sweep_dir)
    data.tuning = tuning_table(data)
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


def _adoption_evidence(run: dict[str, Any]) -> str:
    """What made an adopted run's committed twin trustworthy, or that its record names nothing (hand-written)."""
    probe = run.get("probe")
    if probe:
        return f" (adopted: {probe} reproduced its committed twin to the last digit)"
    return " (adopted, but its record names no probe run that reproduced the twin: treat it as unchecked)"


def computed_once(manifest: dict[str, Any]) -> list[str]:
    """`<run> = <the run whose numbers it has>` for every run the runner did not compute again."""
    return [
        f"{r['name']} = {r.get('same_as') or r.get('reused_from') or r.get('adopted_from')}"
        + (_adoption_evidence(r) if r.get("adopted_from") else "")
        for r in manifest.get("runs", [])
        if r.get("same_as") or r.get("reused_from") or r.get("adopted_from")
    ]
