"""The Lightning side of a run directory's record (`lightning_cqk/run_dir.py`): added by `lightning_cqk fit`.

When training really starts (`on_train_start`: the checkpoint, if any, is restored), `RunSession`
    - applies the optimizer settings a resume deliberately changed (learning rate, betas, eps, weight decay, warmup,
      schedule floor/length): Lightning restores the optimizer's and scheduler's saved hyper-parameters, which would
      silently win over the command line; here every parameter group gets the values of a freshly configured
      optimizer (moments and step counts stay restored) and the scheduler its new base learning rates, at the
      restored step;
    - writes the resolved configuration (`config.yaml` for the first attempt, `config.resume-<n>.yaml` after) and
      starts the attempt in `run.json` (run_dir.py), so nothing is recorded for a launch that never trained;
    - makes the first Ctrl-C (SIGINT) behave like SIGTERM: training stops at the end of the batch in progress and
      `RunCheckpoint` saves (`save_on_sigterm`); a second Ctrl-C stops at once, without saving.
How the attempt ended (finished / interrupted / failed) is recorded by the CLI, after every callback has run.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lightning_cqk.run_dir import RunDirectory, next_config_name


class RunSession(L.Callback):
    """Record the attempt, apply changed optimizer settings and turn Ctrl-C into a clean stop (module docstring).

    Args:
        run: the run directory this process owns (None on ranks other than zero).
        config_text: the resolved configuration (YAML) to keep for this attempt.
        resumed_from: the checkpoint this attempt resumes from, or None.
        changes: {setting: (before, now)} that this resume changes (all of them allowed; see run_dir.MAY_CHANGE).
        apply_optimizer: re-apply the optimizer's hyper-parameters after the restore (a changed model.optim.*).
        notes: what the run-directory resolution decided, recorded with the attempt.
    """

    def __init__(
        self,
        run: RunDirectory | None,
        config_text: str,
        resumed_from: str | None = None,
        changes: dict[str, tuple[Any, Any]] | None = None,
        apply_optimizer: bool = False,
        notes: list[str] | None = None,
    ) -> None:
        self.run = run
        self.config_text = config_text
        self.resumed_from = resumed_from
        self.changes = dict(changes or {})
        self.apply_optimizer = apply_optimizer
        self.notes = list(notes or [])
        self.signal_name: str | None = None  # "SIGINT" once Ctrl-C asked for a clean stop
        self._previous_sigint: Any = None
        self._trainer: L.Trainer | None = None

    @property
    def state_key(self) -> str:
        return "RunSession"  # nothing is saved in checkpoints

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.apply_optimizer:
            apply_optimizer_settings(trainer, pl_module)
        if self.run is not None and trainer.is_global_zero:
            name = next_config_name(self.run.path)
            (self.run.path / name).write_text(self.config_text)
            changed = {k: [a, b] for k, (a, b) in self.changes.items()}
            self.run.start_attempt(
                config=name, ckpt_path=self.resumed_from, from_step=trainer.global_step, changed=changed,
                notes=self.notes,
            )  # fmt: skip
            what = f"resumed from {self.resumed_from} at step {trainer.global_step}" if self.resumed_from else "new"
            if self.changes:
                what += "; changed and applied: " + "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items())
            rank_zero_info(f"run: {self.run.path} ({what}); resolved configuration: {self.run.path / name}")
        if threading.current_thread() is threading.main_thread():
            self._trainer = trainer
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.signal_name = "SIGINT"
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts at once
        print(
            "\nCtrl-C: stopping at the end of this batch and saving a checkpoint (press Ctrl-C again to stop at once, "
            "without saving).",
            flush=True,
        )
        if self._trainer is not None:
            self._trainer._signal_connector.received_sigterm = True  # Lightning's clean stop at the batch boundary

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_sigint()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore_sigint()


def apply_optimizer_settings(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
    """Give the restored optimizers and schedulers the hyper-parameters of a freshly configured optimizer.

    Keeps what must survive a resume (moments, step counts, the scheduler's position) and replaces what the command
    line set (every parameter group's hyper-parameters, the schedulers' base learning rates and lambdas); the current
    learning rate is recomputed at the restored step.
    """
    from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers

    fresh_optimizers, fresh_schedulers = _init_optimizers_and_lr_schedulers(pl_module)
    for restored, fresh in zip(trainer.optimizers, fresh_optimizers, strict=True):
        for group, new in zip(restored.param_groups, fresh.param_groups, strict=True):
            group.update({k: v for k, v in new.items() if k != "params"})
    for config, fresh in zip(trainer.lr_scheduler_configs, fresh_schedulers, strict=True):
        scheduler, new = config.scheduler, fresh.scheduler
        if hasattr(new, "base_lrs"):
            scheduler.base_lrs = list(new.base_lrs)
        if hasattr(new, "lr_lambdas"):
            scheduler.lr_lambdas = list(new.lr_lambdas)
            lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
            for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
            scheduler._last_lr = lrs
    rank_zero_info(
        "run: optimizer settings applied to the restored optimizer: "
        + ", ".join(
            f"lr {g['lr']:.4g} (peak {g.get('initial_lr', g['lr']):.4g})"
            for g in trainer.optimizers[0].param_groups[:1]
        )
    )
