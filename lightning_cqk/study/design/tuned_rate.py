"""Tuning parity: each mechanism's own learning rate, chosen on validation windows the verdicts never read.

A profile's `tuning:` block (lightning_cqk/study/design/spec.py) adds, per tuned level of one axis, one run per learning
rate of a grid (3 or more values) and grid seed (seeds that no verdict uses):

    tuning:
      axis: attention                 # whose levels get their own learning rate
      levels: [standard, coupled]     # default: every level of the axis
      lrs: [1.0e-3, 2.0e-3, 4.0e-3]
      seed: 0                         # the grid's seed (not among the profile's or the control's seeds), or
      # seeds: [0, 1000, 1001]        # several: each rate's loss is the mean over them (default: one seed)
      held_out: [256, 512]            # the validation windows the choice reads: [first, end) of val_windows.json
      overrides: {trainer.limit_val_batches: 32}   # e.g. validate on enough windows to reach the held-out ones

The verdicts read the first `trainer.limit_val_batches x data.val_batch_size` windows of the validation split (the
profile's fixed validation set); the held-out windows start at or after its end (the spec refuses an overlap), so
the choice and the verdicts share no validation text. The choice is the learning rate with the lowest loss (summed
NLL / tokens) over the held-out windows of the grid run's final validation; with several grid seeds, the lowest mean
of those losses over the seeds, and a rate with any seed's loss not finite is never chosen (a rate that diverged, or
has not finished, at one seed). One seed cannot see a rate that is unstable over seeds: the coupling study's
standard arm won its one-seed grid at 8e-3 by 0.01%, then varied widely over its 26 seeds (val ppl 8.47 +- 0.69),
and 0.3x that rate was 10% better (issue 31's first rerun); that study's grid runs at three seeds.

Every run of a tuned level (and the control built on it) waits for its grid and is started
with the chosen rate: its override `model.optim.lr: "{tuned_lr:<level>}"` is filled in when it is launched. A
control with `lr_scale: s` (the baseline at s times its rate) gets "{tuned_lr:<level>*s}": the chosen rate times s.

A control with `lr_scale: auto` gets "{tuned_lr:<level>*auto(<expected_pct>)}": its scale is an output of the
level's grid, not an input. The grid's held-out loss L(lr), interpolated linearly in log(lr) between grid points,
predicts the control's change Δ(s) = exp(L(s·lr*) − L(lr*)) − 1 of perplexity (L(s·lr*) / L(lr*) − 1 of a loss
metric); `auto_scale` picks the s < 1 with Δ(s) = expected_pct (a lower rate: the gentler perturbation), else the
s > 1, both within the grid; where the grid is too flat for either, the grid end with the largest Δ (the report
prints the Δ it predicts beside the target, so a control smaller than planned is seen before its verdict).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_cqk.study.design.spec_checks import SpecError

# "{tuned_lr:<level>}", "{tuned_lr:<level>*0.5}" or "{tuned_lr:<level>*auto(4.0)}"
TUNED_LR = re.compile(r"^\{tuned_lr:([^}*]+)(?:\*(?:([0-9.eE+-]+)|auto\(([0-9.eE+-]+)\)))?\}$")
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


def grid_names(point: str | Sequence[str]) -> list[str]:
    """The run names of one grid point (a level at one rate) as the spec records them: one name (a grid at `seed`) or
    one per grid seed (`seeds:`)."""
    return [point] if isinstance(point, str) else [str(name) for name in point]


def all_grid_runs(tuning: Mapping[str, Any] | None) -> set[str]:
    """The names of every grid run of a spec's recorded `tuning` (its "grid": {level: {lr: name(s)}})."""
    grids = (tuning or {}).get("grid") or {}
    return {name for grid in grids.values() for point in grid.values() for name in grid_names(point)}


def mean_loss(losses: Sequence[float]) -> float:
    """One grid point's held-out loss over its seeds: their mean; nan when any is nan or there are none."""
    if not losses or not all(math.isfinite(x) for x in losses):
        return math.nan
    return float(sum(losses) / len(losses))


def choose(losses: Mapping[float, float]) -> float:
    """The learning rate of the lowest finite held-out loss (ties: the smaller rate); nan when none is finite."""
    finite = {lr: loss for lr, loss in losses.items() if math.isfinite(loss)}
    if not finite:
        return math.nan
    return min(finite, key=lambda lr: (finite[lr], lr))


TUNED_PREFIX = "{tuned_lr:"


@dataclasses.dataclass(frozen=True)
class TunedRate:
    """A learning rate still to be chosen by a level's grid: that choice, times `scale`, or times the scale the grid
    gives for a planted change of `auto_target_pct` (at most one of the two). Spelled in a run's overrides (and in
    the spec, manifest.json and study.json) as `text`; read back once, by `parse_tuned`."""

    level: str
    scale: float | None = None
    auto_target_pct: float | None = None

    @property
    def text(self) -> str:
        """ "{tuned_lr:<level>}", "{tuned_lr:<level>*0.5}" or "{tuned_lr:<level>*auto(3.0)}"."""
        if self.auto_target_pct is not None:
            times = f"*auto({float(self.auto_target_pct)!r})"
        else:
            times = "" if self.scale is None else f"*{float(self.scale)!r}"
        return TUNED_PREFIX + self.level + times + "}"


def tuned_rate(level: str, scale: float | None = None, auto_target_pct: float | None = None) -> str:
    """The override that starts a run at `level`'s grid choice: "{tuned_lr:<level>}", times `scale`
    ("{tuned_lr:<level>*0.5}"), or at the scale that plants `auto_target_pct` ("{tuned_lr:<level>*auto(3.0)}")."""
    return TunedRate(level, scale, auto_target_pct).text


def is_tuned_rate(value: Any) -> bool:
    """Whether a learning-rate override is a grid's choice still to be filled in (`tuned_rate`)."""
    return isinstance(value, str) and value.startswith(TUNED_PREFIX)


def parse_tuned(value: Any) -> TunedRate | None:
    """The `TunedRate` a "{tuned_lr:...}" override spells; None for any other value."""
    match = TUNED_LR.match(value) if isinstance(value, str) else None
    if not match:
        return None
    level, scale, target = match.groups()
    return TunedRate(level, None if scale is None else float(scale), None if target is None else float(target))


def loss_at(points: Sequence[tuple[float, float]], lr: float) -> float:
    """The held-out loss at `lr`, interpolated linearly in log(lr) between the grid's (lr, loss) points (sorted by
    lr); nan outside the grid, and nan next to a grid point without a finite loss (never interpolated across a rate
    that diverged)."""
    if not lr > 0:
        return math.nan
    x = math.log(lr)
    for lr0, l0 in points:  # a grid point itself (also a grid of one point)
        if abs(x - math.log(lr0)) <= 1e-12:
            return l0
    for (lr0, l0), (lr1, l1) in zip(points, points[1:], strict=False):
        x0, x1 = math.log(lr0), math.log(lr1)
        if x0 <= x <= x1:
            return l0 + (l1 - l0) * (x - x0) / (x1 - x0)  # nan when either end is nan
    return math.nan


def predicted_change(points: Sequence[tuple[float, float]], chosen: float, scale: float, metric: str) -> float:
    """Δ (a fraction) of a run at `scale` x the chosen rate against the chosen rate, from the grid: exp(L(s·lr*) -
    L(lr*)) - 1 for perplexity, L(s·lr*) / L(lr*) - 1 for a loss metric; nan outside the grid."""
    low, high = loss_at(points, chosen), loss_at(points, chosen * scale)
    if not (math.isfinite(low) and math.isfinite(high)):
        return math.nan
    return math.expm1(high - low) if metric == "val/ppl" else high / low - 1.0


def auto_scale(points: Sequence[tuple[float, float]], chosen: float, target_pct: float, metric: str) -> float:
    """The scale s of `lr_scale: auto` (module docstring): Δ(s) = target on the low side of the chosen rate, else on
    the high side, else the grid end with the largest Δ. Raises TuningError when no other grid rate has a finite loss
    above the chosen one's (no rate control can be planted from this grid)."""
    points = sorted((float(lr), float(loss)) for lr, loss in points)
    base = loss_at(points, chosen)
    if not math.isfinite(base):
        raise TuningError(f"lr_scale auto: the chosen rate {chosen:g} has no finite held-out loss in its grid.")
    goal = base + math.log1p(target_pct / 100.0) if metric == "val/ppl" else base * (1.0 + target_pct / 100.0)
    below = _finite_run([p for p in points if p[0] <= chosen][::-1])  # from the chosen rate down, up to a divergence
    above = _finite_run([p for p in points if p[0] >= chosen])  # from the chosen rate up, likewise
    for side in (below, above):
        for (lr0, l0), (lr1, l1) in zip(side, side[1:], strict=False):
            if l0 < goal <= l1:
                x = math.log(lr0) + (goal - l0) / (l1 - l0) * (math.log(lr1) - math.log(lr0))
                return math.exp(x) / chosen
    ends = [side[-1] for side in (below, above) if len(side) > 1 and side[-1][1] > base]
    if not ends:
        raise TuningError(
            f"lr_scale auto: no grid rate reachable without crossing a diverged one has a higher held-out loss than "
            f"the chosen {chosen:g} "
            f"({', '.join(f'{lr:g}: {loss:.4f}' for lr, loss in points)}): a rate control cannot be planted from "
            "this grid; widen the grid or give the control a number (`lr_scale: 0.5`)."
        )
    return max(ends, key=lambda p: p[1])[0] / chosen


def _finite_run(side: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The leading points of `side` (ordered away from the chosen rate) up to the first without a finite loss."""
    out = []
    for point in side:
        if not math.isfinite(point[1]):
            break
        out.append(point)
    return out
