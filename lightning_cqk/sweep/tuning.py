"""Tuning parity: each mechanism's own learning rate, chosen on validation windows the verdicts never read.

A profile's `tuning:` block (lightning_cqk/sweep/spec.py) adds, per tuned level of one axis, one run per learning
rate of a grid (3 or more values, one seed that no verdict uses):

    tuning:
      axis: attention                 # whose levels get their own learning rate
      levels: [standard, coupled]     # default: every level of the axis
      lrs: [1.0e-3, 2.0e-3, 4.0e-3]
      seed: 0                         # the grid's seed (not among the profile's seeds)
      held_out: [256, 512]            # the validation windows the choice reads: [first, end) of val_windows.json
      overrides: {trainer.limit_val_batches: 32}   # e.g. validate on enough windows to reach the held-out ones

The verdicts read the first `trainer.limit_val_batches x data.val_batch_size` windows of the validation split (the
profile's fixed validation set); the held-out windows start at or after its end (the spec refuses an overlap), so
the choice and the verdicts share no validation text. The choice is the learning rate with the lowest loss (summed
NLL / tokens) over the held-out windows of the grid run's final validation; a grid run without finite held-out
losses is never chosen. Every run of a tuned level (and the control built on it) waits for its grid and is started
with the chosen rate: its override `model.optim.lr: "{tuned_lr:<level>}"` is filled in when it is launched. A
control with `lr_scale: s` (the baseline at s times its rate) gets "{tuned_lr:<level>*s}": the chosen rate times s.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_cqk.sweep.spec import SpecError

TUNED_LR = re.compile(r"^\{tuned_lr:([^}*]+)(?:\*([0-9.eE+-]+))?\}$")  # "{tuned_lr:<level>}" or "...<level>*0.5}"
WINDOWS_FILE = "val_windows.json"


class TuningError(SpecError):
    """The grid of a tuned level has no usable run: the message names the runs and what they lack."""


def held_out_loss(windows: Mapping[str, Any] | None, held_out: Sequence[int]) -> float:
    """Loss (nats per token) over windows [first, end) of a val_windows.json record; nan when they are not all
    there or not finite. Only those windows are read."""
    if not windows:
        return math.nan
    first, end = int(held_out[0]), int(held_out[1])
    nll, tokens = windows.get("nll") or [], windows.get("tokens") or []
    if len(nll) < end or len(tokens) < end:
        return math.nan
    part_nll, part_tok = nll[first:end], tokens[first:end]
    total = sum(part_tok)
    if not total or not all(math.isfinite(x) for x in part_nll):
        return math.nan
    return float(sum(part_nll) / total)


def choose(losses: Mapping[float, float]) -> float:
    """The learning rate of the lowest finite held-out loss (ties: the smaller rate); nan when none is finite."""
    finite = {lr: loss for lr, loss in losses.items() if math.isfinite(loss)}
    if not finite:
        return math.nan
    return min(finite, key=lambda lr: (finite[lr], lr))


def grid_losses(sweep_dir: Path, grid: Mapping[str, str], held_out: Sequence[int]) -> dict[float, float]:
    """{lr: held-out loss} of one level's grid runs ({lr as text: run name}) from their run directories."""
    out = {}
    for lr, name in grid.items():
        path = Path(sweep_dir) / name / WINDOWS_FILE
        out[float(lr)] = held_out_loss(json.loads(path.read_text()) if path.is_file() else None, held_out)
    return out


def resolve_overrides(overrides: dict[str, Any], spec: Mapping[str, Any], sweep_dir: Path) -> dict[str, Any]:
    """`overrides` with every "{tuned_lr:<level>}" replaced by the level's chosen rate (read from the grid runs)."""
    tuning = spec.get("tuning") or {}
    out = dict(overrides)
    for key, value in overrides.items():
        match = TUNED_LR.match(value) if isinstance(value, str) else None
        if not match:
            continue
        level = match.group(1)
        grid = (tuning.get("grid") or {}).get(level)
        if not grid:
            raise TuningError(f"{key}={value}: level {level!r} has no tuning grid in this sweep's spec.")
        losses = grid_losses(sweep_dir, grid, tuning["held_out"])
        lr = choose(losses)
        if not math.isfinite(lr):
            raise TuningError(
                f"no learning rate of level {level!r}'s grid ({', '.join(grid.values())}) has a finite loss on the "
                f"held-out windows {tuning['held_out']} (val_windows.json): rerun them, or change the grid."
            )
        out[key] = lr * float(match.group(2)) if match.group(2) else lr
    return out
