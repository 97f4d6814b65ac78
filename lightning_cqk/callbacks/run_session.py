"""The Lightning side of a run directory's record (`lightning_cqk/run/directory.py`): added by `lightning_cqk fit`.

When training really starts (`on_train_start`: the checkpoint, if any, is restored), `RunSession`
    - applies the optimizer settings a resume deliberately changed (learning rate, betas, eps, weight decay, warmup,
      schedule floor/length): Lightning restores the optimizer's and scheduler's saved hyper-parameters, which would
      silently win over the command line; here every parameter group gets the values of a freshly configured
      optimizer (moments and step counts stay restored) and the scheduler its new base learning rates, at the
      restored step;
    - writes the resolved configuration (`config.yaml` for the first attempt, `config.resume-<n>.yaml` after) and
      starts the attempt in `run.json` (run/directory.py), so nothing is recorded for a launch that never trained;
    - makes the first Ctrl-C (SIGINT) behave like SIGTERM: training stops at the end of the optimizer step in
      progress and `RunCheckpoint` saves (`save_on_sigterm`); a second Ctrl-C stops at once, without saving. With
      `accumulate_grad_batches` > 1 the stop waits for the step's last micro-batch (a save between micro-batches
      would lose the accumulated gradients and resume inexactly); before the first optimizer step nothing is
      lost, so the stop comes at the end of the micro-batch in progress and nothing is saved (the CLI then removes
      the run directory this launch created and prints the command that starts the run again);
    - makes SIGUSR1 (SLURM's warning before the time limit, `#SBATCH --signal=SIGUSR1@90`) the same clean stop,
      after which the CLI requeues the job (`run/slurm_preemption.py`: Lightning's own auto-requeue, which saved
      `hpc_ckpt_N.ckpt` into the working directory, is off);
    - with several processes, makes every rank stop at the same batch: Lightning's SIGTERM handler broadcasts from
      inside the handler (a collective at a random point, which can pair with another rank's gradient all-reduce)
      and each rank then stops when its own flag is set, possibly one batch apart (one rank saving while another
      trains: a hang). Here a stop signal only marks the stop as wanted (and is passed on to the processes
      Lightning's launcher started); rank zero's mark is made Lightning's `received_sigterm` at the start of the next
      training batch, just before Lightning broadcasts rank zero's flag to every rank (which it does each batch
      anyway), so all ranks raise the stop at the same batch boundary and save together. Every launcher (torchrun,
      srun, scancel, Lightning's) signals every rank; rank zero's signal decides.
How the attempt ended (finished / interrupted / failed) is recorded by the CLI, after every callback has run.
A fit that trains no step (a resume of a run already at its end: Lightning then skips `on_train_start`) is recorded
too, when fit ends, with `trained_no_step: true`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_cqk.run.directory import RunDirectory, next_config_name
from lightning_cqk.run.version_records import describe_device


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
        self._previous_sigterm: Any = None
        self._previous_sigusr1: Any = None
        self._stop_wanted = False
        self._agreed = False  # several processes stop at one batch boundary that rank zero decides
        self._trainer: L.Trainer | None = None
        self._recorded = False  # this attempt is in run.json

    @property
    def state_key(self) -> str:
        return "RunSession"  # nothing is saved in checkpoints

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.apply_optimizer:
            apply_optimizer_settings(trainer, pl_module)
        self._record(trainer)
        if threading.current_thread() is threading.main_thread():
            self._trainer = trainer
            self._stop_wanted = False
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)
            self._previous_sigusr1 = signal.signal(signal.SIGUSR1, self._on_sigusr1)
            loop = trainer.fit_loop.epoch_loop
            self._agreed = trainer.world_size > 1 and hasattr(loop, "_broadcast_sigterm_tensor")
            if trainer.world_size == 1 or self._agreed:  # Lightning's handler would stop between micro-batches
                self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            if self._agreed:
                broadcast = type(loop)._broadcast_sigterm_tensor

                def agreed_stop() -> None:  # runs at every training batch's start, on every rank
                    between_steps = loop.batch_progress.current.ready % trainer.accumulate_grad_batches == 0
                    if self._stop_wanted and trainer.is_global_zero and (between_steps or trainer.global_step == 0):
                        trainer._signal_connector.received_sigterm = True  # the flag Lightning broadcasts now
                    broadcast(loop)

                loop._broadcast_sigterm_tensor = agreed_stop

    def _record(self, trainer: L.Trainer, **extra: Any) -> None:
        """Keep this attempt's configuration and start its entry in run.json (once)."""
        if self.run is None or not trainer.is_global_zero or self._recorded:
            return
        self._recorded = True
        name = next_config_name(self.run.path)
        (self.run.path / name).write_text(self.config_text)
        changed = {k: [a, b] for k, (a, b) in self.changes.items()}
        device = describe_device(trainer.strategy.root_device)  # numbers agree to the last digit on one device kind
        threads = torch.get_num_threads()  # the 7th digit of a validation loss depends on it (study/run/identity.py)
        self.run.start_attempt(
            config=name, ckpt_path=self.resumed_from, from_step=trainer.global_step, changed=changed, notes=self.notes,
            device=device, threads=threads, **extra,
        )  # fmt: skip
        what = f"resumed from {self.resumed_from} at step {trainer.global_step}" if self.resumed_from else "new"
        if self.changes:
            what += "; changed and applied: " + "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items())
        rank_zero_info(f"run: {self.run.path} ({what}); resolved configuration: {self.run.path / name}")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        """One process: a wanted stop becomes Lightning's stop once this batch closed an optimizer step."""
        if self._stop_wanted and not self._agreed and not trainer.fit_loop.epoch_loop._should_accumulate():
            trainer._signal_connector.received_sigterm = True  # Lightning raises the stop after this batch

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A fit that never started training (already at its end) is an attempt too: record it."""
        self._record(trainer, trained_no_step=True)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.signal_name = "SIGINT"
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts at once
        trainer = self._trainer
        when = (
            "at the end of this batch; no optimizer step has been taken, so nothing is saved"
            if trainer is not None and trainer.global_step == 0
            else "at the end of this optimizer step and saving a checkpoint"
        )
        print(f"\nCtrl-C: stopping {when} (press Ctrl-C again to stop at once, without saving).", flush=True)
        self._want_stop(signal.SIGINT)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._want_stop(signal.SIGTERM)

    def _on_sigusr1(self, signum: int, frame: Any) -> None:
        """SLURM's warning before the time limit (`#SBATCH --signal=SIGUSR1@90`): the same clean stop as SIGTERM,
        saved into this run's checkpoints/; the CLI then requeues the job (`run/slurm_preemption.py`)."""
        if self.signal_name is None:
            self.signal_name = "SIGUSR1"
        self._want_stop(signal.SIGTERM)

    def _want_stop(self, signum: int) -> None:
        trainer = self._trainer
        if trainer is None:
            return
        if not self._agreed:  # one process: Lightning's clean stop, at the next optimizer-step boundary
            self._stop_wanted = True
            if trainer.global_step == 0 or trainer.world_size > 1:  # nothing trained yet: after this micro-batch
                trainer._signal_connector.received_sigterm = True
            return
        if not self._stop_wanted:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signal.SIGTERM)  # the processes Lightning's launcher started (none otherwise)
        self._stop_wanted = True  # decided at the next batch start, on every rank at once (module docstring)

    def _restore_sigint(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        if self._previous_sigusr1 is not None:
            signal.signal(signal.SIGUSR1, self._previous_sigusr1)
            self._previous_sigusr1 = None
        if self._trainer is not None:
            self._trainer.fit_loop.epoch_loop.__dict__.pop("_broadcast_sigterm_tensor", None)

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

    from lightning_cqk.optim.schedule import learning_rates_at_scheduler_step

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
    learning_rates_at_scheduler_step(config.scheduler for config in trainer.lr_scheduler_configs)
    rank_zero_info(
        "run: optimizer settings applied to the restored optimizer: "
        + ", ".join(
            f"lr {g['lr']:.4g} (peak {g.get('initial_lr', g['lr']):.4g})"
            for g in trainer.optimizers[0].param_groups[:1]
        )
    )
