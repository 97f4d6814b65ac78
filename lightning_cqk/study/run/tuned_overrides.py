"""A tuned run's learning rate filled in at launch: each `{tuned_lr:<level>}` override (design/tuned_rate.py)
replaced by the rate its level's grid runs chose, read from their run directories in the sweep."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_cqk.study.design.tuned_rate import (
    WINDOWS_FILE,
    TuningError,
    auto_scale,
    choose,
    grid_names,
    held_out_loss,
    mean_loss,
    parse_tuned,
)
from lightning_cqk.study.run.identity import result_dir


def grid_losses(
    sweep_dir: Path, grid: Mapping[str, str | Sequence[str]], held_out: Sequence[int]
) -> dict[float, float]:
    """{lr: held-out loss} of one level's grid runs ({lr as text: run name, or one per grid seed}) from their run
    directories: `mean_loss` over a rate's seeds."""
    out = {}
    for lr, point in grid.items():
        losses = []
        for name in grid_names(point):
            path = result_dir(sweep_dir, name) / WINDOWS_FILE  # a grid run shared with another is read where it is
            losses.append(held_out_loss(json.loads(path.read_text()) if path.is_file() else None, held_out))
        out[float(lr)] = mean_loss(losses)
    return out


def resolve_overrides(overrides: dict[str, Any], spec: Mapping[str, Any], sweep_dir: Path) -> dict[str, Any]:
    """`overrides` with every "{tuned_lr:<level>}" replaced by the level's chosen rate (read from the grid runs), times
    the scale ("*0.5") or the scale `auto_scale` takes from the grid ("*auto(4.0)")."""
    tuning = spec.get("tuning") or {}
    out = dict(overrides)
    for key, value in overrides.items():
        parsed = parse_tuned(value)
        if not parsed:
            continue
        level, scale, target = parsed.level, parsed.scale, parsed.auto_target_pct
        grid = (tuning.get("grid") or {}).get(level)
        if not grid:
            raise TuningError(f"{key}={value}: level {level!r} has no tuning grid in this sweep's spec.")
        losses = grid_losses(sweep_dir, grid, tuning["held_out"])
        lr = choose(losses)
        if not math.isfinite(lr):
            raise TuningError(
                f"no learning rate of level {level!r}'s grid "
                f"({', '.join(n for point in grid.values() for n in grid_names(point))}) has a finite loss on the "
                f"held-out windows {tuning['held_out']} (val_windows.json): rerun them, or change the grid."
            )
        if target is not None:
            scale = auto_scale(list(losses.items()), lr, target, spec.get("metric", "val/ppl"))
        out[key] = lr * scale if scale is not None else lr
    return out
