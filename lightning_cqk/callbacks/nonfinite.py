"""NonFiniteGuard: catch a NaN or Inf in the loss or the gradients on the step it happens; skip the update or stop.

Detection, once per optimizer step, in `on_before_optimizer_step` (after the backward of every accumulated
micro-batch and Lightning's fp16 unscaling, before gradient clipping and `optimizer.step()`): the step is non-finite
when any micro-batch loss, or any element of any gradient, is NaN or +-Inf. The gradients are checked with
`torch._foreach_norm(grads, inf)` (the max-abs of each gradient, a fused multi-tensor kernel on CUDA: NaN or Inf
exactly when the gradient holds one) and one stacked `isfinite().all()`; under DDP/FSDP the verdict is reduced across
ranks so every rank decides alike.

Cost: the update must be decided before it happens, so the verdict is read on the host once per step (one device
sync and a few small kernels per step; on a GPU this stops the CPU from queueing the next step's kernels while the
backward drains). The per-parameter report that names the culprits (one read per parameter) runs only on a bad step.

Policies:
    "skip" (default)  drop this step's update: every gradient is set to None (torch optimizers then leave every
                      parameter and its moments untouched), count it, and go on. The learning-rate schedule and
                      `trainer.global_step` advance, as for any step. After `max_consecutive_skips` bad steps in a row
                      the run is beyond saving by skipping and the guard stops as with "stop".
    "stop"            drop the update, then save `checkpoints/nonfinite-step{k}.ckpt` (the last good weights and
                      optimizer state: the bad update never happened) and stop training. `--ckpt_path last` after
                      lowering the learning rate resumes from the step after the bad batch.
Under fp16 mixed precision ("16-mixed") non-finite gradients are routine (the GradScaler skips those steps and lowers
its scale): there only a non-finite loss counts, and the guard leaves the gradients to the scaler.

Every bad step prints a warning naming the step, the loss and the first `report_params` parameters (in model order)
whose gradients are non-finite, and is recorded in `<run dir>/nonfinite.json`
({"steps": [{"step", "loss", "params", "num_params"}], "skipped", "stopped_at", "settings"}). Metric:
`train/nonfinite_steps` (cumulative) on logging steps. Resumable: the records are in the callback's checkpoint state.

Place it after GradNormMonitor (so the bad step's norm is still logged) in a callbacks list.
Tests: `tests/reliability/test_nonfinite.py`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_cqk.callbacks.common import is_log_step, log_metrics, run_dir, step_index, write_json


class NonFiniteGuard(L.Callback):
    """Skip (or stop at) optimizer steps whose loss or gradients hold NaN/Inf (see the module docstring).

    Args:
        policy: "skip" the update and go on, or "stop" after saving a checkpoint of the last good state.
        max_consecutive_skips: with "skip", stop after this many non-finite steps in a row (None: never).
        report_params: how many non-finite parameters to name in the message and the record.
        every_n_steps: logging interval of `train/nonfinite_steps`; None uses `trainer.log_every_n_steps`.
        filename: name of the JSON record in the run directory.
    """

    def __init__(
        self,
        policy: Literal["skip", "stop"] = "skip",
        max_consecutive_skips: int | None = 20,
        report_params: int = 5,
        every_n_steps: int | None = None,
        filename: str = "nonfinite.json",
    ) -> None:
        if policy not in ("skip", "stop"):
            raise ValueError(f"NonFiniteGuard: policy={policy!r} is not 'skip' or 'stop'.")
        if max_consecutive_skips is not None and max_consecutive_skips < 1:
            raise ValueError(
                f"NonFiniteGuard: max_consecutive_skips must be >= 1 or null (never stop), got {max_consecutive_skips}."
            )
        self.policy = policy
        self.max_consecutive_skips = max_consecutive_skips
        self.report_params = max(1, int(report_params))
        self.every_n_steps = every_n_steps
        self.filename = filename
        self.records: list[dict[str, Any]] = []
        self.skipped = 0
        self.consecutive = 0
        self.stopped_at: int | None = None
        self._loss_finite: torch.Tensor | None = None
        self._loss: torch.Tensor | None = None
        self._stop_at: int | None = None
        self._scaler = None

    # ------------------------------------------------------------------------------------------- hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)  # fp16 ("16-mixed") only

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        value = loss.detach().float()
        if self._scaler is not None and getattr(self._scaler, "_scale", None) is not None:
            value = value / self._scaler._scale.to(value)  # fp16: the hook sees the scaled loss (device tensor)
        finite = torch.isfinite(value)
        self._loss_finite = finite if self._loss_finite is None else self._loss_finite & finite
        self._loss = value if self._loss is None else self._loss + value

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        step = step_index(trainer)
        loss_finite, loss = self._loss_finite, self._loss
        self._loss_finite, self._loss = None, None
        grads = [] if self._scaler is not None else [p.grad for p in pl_module.parameters() if p.grad is not None]
        checks = [] if loss_finite is None else [loss_finite.reshape(1)]
        if grads:
            norms = torch._foreach_norm(grads, math.inf)  # max |g| per gradient: NaN/Inf iff the gradient has one
            checks.append(torch.isfinite(torch.stack(norms)).all().reshape(1))
        if not checks:
            return
        ok = bool(torch.cat(checks).all())  # the one host read per step
        if trainer.world_size > 1:
            ok = trainer.strategy.reduce_boolean_decision(ok, all=True)
        if ok:
            self.consecutive = 0
        else:
            self._bad_step(trainer, pl_module, step, loss, grads)
        if is_log_step(trainer, self.every_n_steps, step):
            log_metrics(trainer, {"train/nonfinite_steps": float(len(self.records))}, step)

    def _bad_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, loss: torch.Tensor | None, grads: list
    ) -> None:
        names = [
            name
            for name, p in pl_module.named_parameters()
            if p.grad is not None and self._scaler is None and not bool(torch.isfinite(p.grad).all())
        ]
        loss_value = float(loss) if loss is not None else None
        record = {
            "step": step,
            "loss": loss_value if loss_value is None or math.isfinite(loss_value) else str(loss_value),
            "params": names[: self.report_params],
            "num_params": len(names),
        }
        self.records.append(record)
        self.consecutive += 1
        if self._scaler is None:
            for p in pl_module.parameters():
                p.grad = None  # optimizers skip parameters without a gradient: no update, no moment change
            self.skipped += 1
        stop = self.policy == "stop" or (
            self.max_consecutive_skips is not None and self.consecutive >= self.max_consecutive_skips
        )
        where = (
            f"non-finite gradients in {len(names)} parameter(s), first: {', '.join(names[: self.report_params])}"
            if names
            else "no non-finite gradient"
        )
        action = "update skipped; stopping after a checkpoint of the last good state" if stop else "update skipped"
        if self._scaler is not None:
            action = "left to the fp16 GradScaler" + ("; stopping" if stop else "")
        rank_zero_warn(
            f"NonFiniteGuard: step {step}: loss {loss_value}, {where}; {action} ({len(self.records)} non-finite "
            f"step(s) so far{', ' + str(self.consecutive) + ' in a row' if self.consecutive > 1 else ''}). Usual "
            "fixes: a lower learning rate, gradient clipping, QK-norm (attention_options qk_norm), bf16 instead of "
            "fp16."
        )
        if stop:
            self._stop_at = step
        self._write(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._stop_at is None:
            return
        step, self._stop_at = self._stop_at, None
        self.stopped_at = step
        folder = getattr(trainer.checkpoint_callback, "dirpath", None) or run_dir(trainer) / "checkpoints"
        path = f"{folder}/nonfinite-step{step}.ckpt"
        trainer.save_checkpoint(path)
        rank_zero_warn(f"NonFiniteGuard: saved the last good state to {path} and stopped training at step {step}.")
        trainer.should_stop = True
        self._write(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.records:
            self._write(trainer)

    def summary(self) -> dict[str, Any]:
        """What nonfinite.json holds."""
        settings = {"policy": self.policy, "max_consecutive_skips": self.max_consecutive_skips}
        return {"steps": self.records, "skipped": self.skipped, "stopped_at": self.stopped_at, "settings": settings}

    def _write(self, trainer: L.Trainer) -> None:
        write_json(run_dir(trainer) / self.filename, self.summary())

    # ---------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"records": list(self.records), "skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = list(state_dict.get("records", []))
        self.skipped = int(state_dict.get("skipped", 0))
        self.consecutive = int(state_dict.get("consecutive", 0))
