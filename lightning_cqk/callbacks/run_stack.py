"""The callbacks every trainer command of `lightning_cqk` runs with, put in place once the Trainer exists.

First Lightning's SLURM auto-requeue is switched off (`run/slurm_preemption.py`; a stray `hpc_ckpt_*` is named). In
order: `AtomicCheckpointIO` for Lightning's plain checkpoint IO (atomic, fsynced, clear errors on load),
`RunSummary` first (it records a validation before a checkpoint saves), for `fit` `FinalValidation` (the last step
validated, before a checkpoint saves it), the run's `RunSession`, then `DataFolderGuard` (after it: a refused resume
is a recorded attempt), Lightning's model summary without its FLOPs column, TensorBoard's custom-scalars layout of
the charts these callbacks log, `RunLengthCheck` (a run that would train for days here says so), and line progress
for output that is not a terminal. A callback of the same kind given in the config is kept instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_cqk.callbacks.data_guard import DataFolderGuard
from lightning_cqk.callbacks.final_validation import FinalValidation
from lightning_cqk.callbacks.model_summary import without_flops_column
from lightning_cqk.callbacks.progress import use_line_progress
from lightning_cqk.callbacks.run_checkpoint import AtomicCheckpointIO
from lightning_cqk.callbacks.run_length import RunLengthCheck, limit_hours_from_env
from lightning_cqk.callbacks.run_session import RunSession
from lightning_cqk.callbacks.summary import RunSummary
from lightning_cqk.callbacks.tensorboard import TensorBoardLogger, layout_for
from lightning_cqk.run import slurm_preemption
from lightning_cqk.run.preflight import RunPlan


def add_run_callbacks(
    trainer: Trainer,
    subcommand: str | None,
    plan: RunPlan,
    long_run_advice: Callable[[], str],
    configured_callbacks: Any,
) -> RunSession | None:
    """Put the framework's callbacks (module docstring) into `trainer`, in their order; returns the fit's
    `RunSession` (the record of its run directory: `plan` from the run's preflight), None for other commands."""
    slurm_preemption.take_over(trainer)  # Lightning's SLURM requeue never writes nor restores hpc_ckpt_*
    strays = slurm_preemption.stray_hpc_checkpoints(trainer.default_root_dir, os.getcwd())
    if strays and trainer.is_global_zero:
        print(slurm_preemption.stray_note(strays), file=sys.stderr)
    session = None
    if plan.config_text is not None:  # a fit: its record of the run, kept once training has started
        session = RunSession(
            plan.directory,
            plan.config_text,
            resumed_from=plan.fit.ckpt_path,
            changes=plan.changes,
            apply_optimizer=plan.apply_optimizer,
            notes=None if plan.follower else plan.fit.notes,
        )
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()
    fit = subcommand == "fit"
    if not any(isinstance(cb, RunSummary) for cb in trainer.callbacks):
        trainer.callbacks.insert(0, RunSummary())
    if fit and not any(isinstance(cb, FinalValidation) for cb in trainer.callbacks):
        trainer.callbacks.insert(0, FinalValidation())
    if session is not None:
        trainer.callbacks.append(session)
    if fit and not any(isinstance(cb, DataFolderGuard) for cb in trainer.callbacks):
        trainer.callbacks.append(DataFolderGuard())
    without_flops_column(trainer.callbacks)  # Lightning's FLOPs column reads 0 for LitLM (model_summary.py)
    for logger in trainer.loggers:  # TensorBoard's Custom Scalars: only the charts this run's callbacks log
        if isinstance(logger, TensorBoardLogger):
            logger.layout = layout_for(trainer.callbacks)
    if fit and not any(isinstance(cb, RunLengthCheck) for cb in trainer.callbacks):
        trainer.callbacks.append(RunLengthCheck(limit_hours_from_env(), advice=long_run_advice))
    use_line_progress(trainer, configured_callbacks)
    return session
