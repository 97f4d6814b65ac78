"""A profile's learning-rate grid as runs (spec `tuning:`; the choice itself:
lightning_cqk/study/design/tuned_rate.py): its
check, the grid runs of every tuned level at every grid seed, and the tuned runs set to wait for them."""

from __future__ import annotations

import copy
from typing import Any

from lightning_cqk.study.design.plan import Run, as_list, config_path, fill_placeholders
from lightning_cqk.study.design.spec_checks import SpecError


def check_tuning(tuning: Any, spec: dict[str, Any], profile: dict[str, Any], where: str) -> None:
    """A profile's `tuning:` (lightning_cqk/study/design/tuned_rate.py): a grid of >= 3 rates per level, unused seed(s),
    held-out windows after the verdicts' validation set; or `{fixed: <why>}` where one rate is the design."""
    example = "tuning: {axis: attention, lrs: [1.0e-3, 2.0e-3, 4.0e-3], seed: 0, held_out: [256, 512]}"
    if not isinstance(tuning, dict):
        raise SpecError(f"{where}: tuning is a mapping, e.g. `{example}`, or `{{fixed: <why one rate is by design>}}`.")
    if "fixed" in tuning:
        if set(tuning) != {"fixed"} or not str(tuning["fixed"]).strip():
            raise SpecError(f"{where}: `tuning: {{fixed: <why>}}` takes only a non-empty reason.")
        return
    axes = dict(spec["axes"], **(profile.get("axes") or {}))
    axis = tuning.get("axis")
    if axis not in axes:
        raise SpecError(f"{where}: tuning axis {axis!r} is not an axis ({list(axes)}); e.g. `{example}`.")
    unknown = [lv for lv in tuning.get("levels") or [] if lv not in axes[axis]]
    if unknown:
        raise SpecError(f"{where}: tuning levels {unknown} are not levels of axis {axis!r} ({list(axes[axis])}).")
    tuned = tuning.get("levels") or list(axes[axis])
    same_as = tuning.get("same_as") or {}
    bad = {k: v for k, v in same_as.items() if k not in axes[axis] or v not in tuned or k in tuned}
    if bad:
        raise SpecError(
            f"{where}: tuning same_as maps an untuned level of {axis!r} to a tuned one whose rate it takes; "
            f"{bad} is not that (tuned: {tuned})."
        )
    for a, level in (tuning.get("at") or {}).items():
        if a not in axes or a == axis or level not in axes[a]:
            raise SpecError(f"{where}: tuning at {{{a}: {level}}} is not a level of another axis.")
    lrs = tuning.get("lrs")
    if not isinstance(lrs, list) or len(lrs) < 3 or not all(isinstance(x, (int, float)) and x > 0 for x in lrs):
        raise SpecError(f"{where}: tuning lrs is a list of 3 or more positive rates, got {lrs!r}.")
    if len(set(lrs)) != len(lrs):
        raise SpecError(f"{where}: tuning lrs must be distinct, got {lrs}.")
    if ("seed" in tuning) == ("seeds" in tuning):
        raise SpecError(
            f"{where}: tuning takes one of `seed: 0` (the grid at one seed) and `seeds: [0, 1000, 1001]` (each "
            f"rate's mean over several); got {'both' if 'seed' in tuning else 'neither'}."
        )
    grid_seeds = tuning["seeds"] if "seeds" in tuning else [tuning["seed"]]
    used = [int(x) for x in profile.get("seeds", [1337])]
    for seed in grid_seeds if isinstance(grid_seeds, list) and grid_seeds else [None]:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed in used:
            raise SpecError(
                f"{where}: tuning seeds are integers no verdict run uses (not in seeds {used}), got {grid_seeds!r}."
            )
    if len(set(grid_seeds)) != len(grid_seeds):
        raise SpecError(f"{where}: tuning seeds must be distinct, got {grid_seeds}.")
    held = tuning.get("held_out")
    ints = isinstance(held, list) and len(held) == 2 and all(isinstance(x, int) for x in held)
    if not (ints and 0 <= held[0] < held[1]):
        raise SpecError(f"{where}: tuning held_out is [first, end) of the validation windows, e.g. [256, 512].")
    over = profile.get("overrides") or {}
    verdict_windows = int(over.get("trainer.limit_val_batches", 0)) * int(
        over.get("data.val_batch_size", over.get("data.batch_size", 0))
    )
    verdict_windows = int(over.get("data.final_val_windows") or 0) or verdict_windows  # the final set (val_sets.py)
    if not verdict_windows:
        raise SpecError(
            f"{where}: tuning needs the verdicts' validation set fixed in the profile's overrides "
            "(trainer.limit_val_batches and data.val_batch_size) to keep the held-out windows apart from it."
        )
    if held[0] < verdict_windows:
        raise SpecError(
            f"{where}: tuning held_out {held} overlaps the verdicts' validation windows [0, {verdict_windows}): the "
            f"choice must never read them; start it at {verdict_windows} or later."
        )
    t_over = dict(over, **(tuning.get("overrides") or {}))
    per_batch = int(t_over.get("data.val_batch_size", t_over.get("data.batch_size", 0)))
    tune_windows = int(t_over.get("trainer.limit_val_batches", 0)) * per_batch
    tune_windows = int(t_over.get("data.final_val_windows") or 0) or tune_windows  # val_windows.json: the final set
    if tune_windows < held[1]:
        need = -(-held[1] // max(per_batch, 1))
        fix = f"data.final_val_windows: {held[1]}" if t_over.get("data.final_val_windows") else None
        raise SpecError(
            f"{where}: the grid runs validate on {tune_windows} windows, fewer than held_out's end {held[1]}; give "
            f"the tuning `overrides: {{{fix or f'trainer.limit_val_batches: {need}'}}}`."
        )


def tuning_runs(
    tuning: dict[str, Any],
    spec: dict[str, Any],
    axes: dict[str, dict],
    runs: list[Run],
    configs: list[str],
    prof: dict[str, Any],
    placeholders: dict[str, str | None],
    control_group: str | None,
    where: str,
) -> list[Run]:
    """The learning-rate grid runs of every tuned level (lightning_cqk/study/design/tuned_rate.py), and the runs of
    those
    levels set to wait for their grid and start at its choice ("{tuned_lr:<level>}"). Records the grid in
    spec["tuning"]."""
    from lightning_cqk.study.design.tuned_rate import grid_names, tuned_rate

    axis = tuning["axis"]
    levels = [str(lv) for lv in (tuning.get("levels") or list(axes[axis]))]
    seeds = [int(s) for s in tuning["seeds"]] if "seeds" in tuning else [int(tuning["seed"])]
    grid: dict[str, dict[str, str | list[str]]] = {}
    tune: list[Run] = []
    for level in levels:
        at = {a: spec["baseline"].get(a, next(iter(options))) for a, options in axes.items()}
        at.update({a: str(v) for a, v in (tuning.get("at") or {}).items()})
        at[axis] = level
        for lr in tuning["lrs"]:
            overrides: dict[str, Any] = {k: copy.deepcopy(v) for k, v in (prof.get("overrides") or {}).items()}
            run_configs = list(configs)
            for a in axes:
                for key, value in (axes[a][at[a]] or {}).items():
                    if key == "config":
                        run_configs += [config_path(c, where) for c in as_list(value)]
                        continue
                    if isinstance(value, str) and "{run:" in value:
                        raise SpecError(f"{where}: tuning: level {a}.{at[a]} waits for another run; tune another.")
                    overrides.pop(key, None)
                    overrides[key] = fill_placeholders(copy.deepcopy(value), placeholders)
            for key, value in (tuning.get("overrides") or {}).items():
                overrides.pop(key, None)
                overrides[key] = fill_placeholders(copy.deepcopy(value), placeholders)
            overrides.pop("model.optim.lr", None)
            overrides["model.optim.lr"] = float(lr)
            group = f"tune-{level}-lr{float(lr):g}"
            names = [f"{group}-s{seed}" for seed in seeds]
            # one name per rate for a grid at one seed (as committed studies record it), a list for several
            grid.setdefault(level, {})[repr(float(lr))] = names if "seeds" in tuning else names[0]
            run_configs = [fill_placeholders(c, placeholders) for c in run_configs]
            for name, seed in zip(names, seeds, strict=True):
                tune.append(Run(name, group, seed, dict(at), run_configs, copy.deepcopy(overrides), [], "tuning"))
    by_name = {r.name: r for r in tune}
    grid_hashes = {
        lv: {lr: _point_hash([by_name[n].config_hash() for n in grid_names(point)]) for lr, point in g.items()}
        for lv, g in grid.items()
    }
    base_level = spec["baseline"].get(axis)
    same_as = {str(k): str(v) for k, v in (tuning.get("same_as") or {}).items()}
    for run in runs:
        level = run.levels.get(axis)
        level = same_as.get(level, level)  # a level that takes another's rate (e.g. the baseline at more tokens)
        scale = None
        if run.group == control_group:
            if "model.optim.lr" in spec["control"]["overrides"]:
                continue  # a control that sets its own rate keeps it
            if axis == next(iter(spec["baseline"])):
                level = base_level  # the control stands in this axis for its baseline level: that level's rate
            scale = spec["control"].get("lr_scale")
        if level not in grid or "model.optim.lr" in _level_overrides(run, axes, axis):
            continue
        run.overrides.pop("model.optim.lr", None)
        if scale == "auto":  # the grid chooses the scale at launch (tuning.auto_scale)
            rate = tuned_rate(level, auto_target_pct=float(spec["control"]["expected_pct"]))
        else:
            rate = tuned_rate(level, None if scale is None else float(scale))
        run.overrides["model.optim.lr"] = rate
        run.depends_on = [*run.depends_on, *(n for point in grid[level].values() for n in grid_names(point))]
        run.tuned_by = {level: {"held_out": [int(x) for x in tuning["held_out"]], "grid": grid_hashes[level]}}
    spec["tuning"] = {
        "axis": axis,
        "levels": levels,
        "lrs": [float(x) for x in tuning["lrs"]],
        **({"seeds": seeds} if "seeds" in tuning else {"seed": seeds[0]}),
        "held_out": [int(x) for x in tuning["held_out"]],
        "overrides": dict(tuning.get("overrides") or {}),
        "same_as": same_as,
        "at": dict(tuning.get("at") or {}),
        "grid": grid,
    }
    return tune + runs


def _point_hash(hashes: list[str]) -> str | list[str]:
    """The config hash a tuned run records for one grid point: its run's (a grid at one seed), else its runs' list."""
    return hashes[0] if len(hashes) == 1 else hashes


def _level_overrides(run: Run, axes: dict[str, dict], tuned_axis: str) -> dict[str, Any]:
    """The overrides the run's levels on the other axes set (a level that sets the rate itself is never tuned)."""
    out: dict[str, Any] = {}
    for a, level in run.levels.items():
        if a != tuned_axis and level in axes.get(a, {}):
            out.update(axes[a][level] or {})
    return out
