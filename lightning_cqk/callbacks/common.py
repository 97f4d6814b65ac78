"""Helpers shared by the instrument callbacks: step indexing, logging cadence, one host read per log, run directory.

Every instrument keeps its numbers on the device between logging steps and reads them (`.tolist()`, one host sync)
only on the steps it logs, then writes them to every logger of the trainer itself (as `LearningRateMonitor` does), so
its cadence (`every_n_steps`) does not depend on `trainer.log_every_n_steps`. Steps are the optimizer-step index that
Lightning uses for `self.log` in `training_step` (`_batches_that_stepped` before it is advanced), so instrument curves
line up with `train/loss`. A callback logs on the steps s with (s + 1) % every_n_steps == 0, the steps on which
Lightning writes `train/loss` when both intervals agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from lightning_cqk.files.atomic import write_json_atomically


def step_index(trainer: L.Trainer) -> int:
    """Index of the optimizer step in progress (0-based), valid from `on_train_batch_start` to `on_train_batch_end`."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def every_n(trainer: L.Trainer, every_n_steps: int | None) -> int:
    """The callback's interval: its own `every_n_steps`, else the trainer's `log_every_n_steps`."""
    return max(1, int(every_n_steps if every_n_steps is not None else trainer.log_every_n_steps))


def is_log_step(trainer: L.Trainer, every_n_steps: int | None, step: int | None = None) -> bool:
    """True on the steps s where (s + 1) is a multiple of the callback's interval."""
    step = step_index(trainer) if step is None else step
    return (step + 1) % every_n(trainer, every_n_steps) == 0


def to_floats(metrics: Mapping[str, torch.Tensor | float | int]) -> dict[str, float]:
    """Python floats of scalar tensors/numbers, with a single host read for all the tensors."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if keys:
        device = metrics[keys[0]].device
        stacked = torch.stack([metrics[k].detach().reshape(()).to(device, torch.float64) for k in keys])
        out.update(zip(keys, stacked.tolist(), strict=True))
    return out


def log_metrics(trainer: L.Trainer, metrics: Mapping[str, torch.Tensor | float | int], step: int) -> dict[str, float]:
    """Read `metrics` once and write them to every logger of `trainer` at `step`; returns the floats."""
    values = to_floats(metrics)
    if values:
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)
    return values


def run_dir(trainer: L.Trainer) -> Path:
    """The run's directory: the logger's log_dir (e.g. runs/<experiment>/<run>), else `default_root_dir`.

    Which directory that is (its name, suffix, lock, record and resume) is decided by `lightning_cqk/run/directory.py`
    before the trainer is built; callbacks only write into it.

    Collective under DDP (`trainer.log_dir` broadcasts): call it on every rank.
    """
    return Path(trainer.log_dir or trainer.default_root_dir)


@rank_zero_only
def write_json(path: Path, payload: Any) -> None:
    """Write `payload` as indented JSON on rank zero only (`run_dir.write_json_atomically`: never half a file)."""
    write_json_atomically(path, payload)


def is_sharded(trainer: L.Trainer) -> bool:
    """Whether parameters (and gradients) are sharded across ranks (FSDP, model parallel, DeepSpeed)."""
    name = type(trainer.strategy).__name__
    return any(key in name for key in ("FSDP", "ModelParallel", "DeepSpeed"))
