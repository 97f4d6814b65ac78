"""NonFiniteGuard: catch a NaN or Inf in the loss or the gradients on the step it happens; skip the update or stop.

Detection, once per optimizer step, in `on_before_optimizer_step` (after the backward of every accumulated
micro-batch and Lightning's fp16 unscaling, before gradient clipping and `optimizer.step()`): the step is non-finite
when any micro-batch loss is NaN or +-Inf, or the global L2 norm of the gradients is: NaN or Inf exactly when a
gradient element is, or when finite gradients are so large that their norm overflows (norm clipping would then zero
them: no update is better). The norm is the step's one gradient-norm computation (`step_reads.StepReads`: one fused
`_foreach_norm`, shared with LossSpikeMonitor's `max_grad_norm` rule and GradNormMonitor); under DDP/FSDP the verdict
is reduced across ranks so every rank decides alike.

Cost: the update must be decided before it happens, so the verdict is read on the host once per step (one device
sync per step, shared with the other callbacks that decide there; on a GPU this stops the CPU from queueing the next
step's kernels while the backward drains). The per-parameter report that names the culprits (one read per
parameter) runs only on a bad step.

Policies:
    "skip" (default)  drop this step's update: every gradient is set to None (torch optimizers then leave every
                      parameter and its moments untouched), count it, and go on. The learning-rate schedule and
                      `trainer.global_step` advance, as for any step. After `max_consecutive_skips` bad steps in a row
                      the run is beyond saving by skipping and the guard stops as with "stop".
    "stop"            drop the update, then save `checkpoints/nonfinite-step{k}.ckpt` (the last good weights and
                      optimizer state: the bad update never happened) and stop training. `--ckpt_path last` after
                      lowering the learning rate resumes from the step after the bad batch.
What the guard can and cannot promise: it stops a *non-finite* update from reaching the weights, so after a NaN/Inf
step the weights and optimizer moments are exactly those before it. It cannot see a *finite but explosive* update
(a learning rate far too high: weights of 1e9 after one step, the loss finite or only later NaN): such a step passes
the check, and the "last good state" it keeps (the skipped step's weights, `nonfinite-step{k}.ckpt`, or last.ckpt)
may already be wrecked, so resuming from it diverges again. Two recoveries work:
    max_abs_weight    (off by default) also watch the weights: after every optimizer step (every
                      `weight_check_every` steps) the largest |weight| is read (one fused max-abs, one host read);
                      above the limit (or non-finite) the guard *rolls back* in place to the newest periodic checkpoint
                      of this run (`RunCheckpoint`'s `step=*.ckpt`, newest first) whose weights are finite and within
                      the limit: weights and optimizer state are loaded from it, the learning rate (and the schedule's
                      base rates) are multiplied by `rollback_lr_factor` (0.5), and training goes on from the current
                      step (the batches since that checkpoint are not revisited). After `max_rollbacks` (3), or with
                      no usable checkpoint, it stops as with "stop". Records: `rollbacks` in nonfinite.json.
    by hand           resume from a periodic checkpoint written before the divergence with a lower learning rate:
                      `lightning_cqk fit <same config> --ckpt_path <run dir>/checkpoints/step=<k>.ckpt
                      --model.optim.lr <lower>` (the learning rate is a setting a resume may change; see
                      docs/reliability.md). Keep old files with RunCheckpoint's `keep_every_n_steps` milestones.
Under fp16 mixed precision ("16-mixed") non-finite gradients are routine (the GradScaler skips those steps and lowers
its scale): there only a non-finite loss counts, and the guard leaves the gradients to the scaler.

Every bad step prints a warning naming the step, the loss and the first `report_params` parameters (in model order)
whose gradients are non-finite, and is recorded in `<run dir>/nonfinite.json`
({"steps": [{"step", "loss", "params", "num_params"}], "skipped", "stopped_at", "rollbacks", "settings"}). Metric:
`train/nonfinite_steps` (cumulative) on logging steps. Resumable: the records are in the callback's checkpoint state.

Place it after GradNormMonitor (so the bad step's norm is still logged) in a callbacks list.
Tests: `tests/e2e/reliability/test_nonfinite.py`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_cqk.callbacks.common import is_log_step, log_metrics, run_dir, step_index, write_json
from lightning_cqk.callbacks.step_reads import StepReads
from lightning_cqk.checkpoint.reading import load_checkpoint


class NonFiniteGuard(L.Callback):
    """Skip (or stop at) optimizer steps whose loss or gradients hold NaN/Inf (see the module docstring).

    Args:
        policy: "skip" the update and go on, or "stop" after saving a checkpoint of the last good state.
        max_consecutive_skips: with "skip", stop after this many non-finite steps in a row (None: never).
        report_params: how many non-finite parameters to name in the message and the record.
        every_n_steps: logging interval of `train/nonfinite_steps`; None uses `trainer.log_every_n_steps`.
        filename: name of the JSON record in the run directory.
        max_abs_weight: roll back when a weight's magnitude exceeds this (None: off; module docstring).
        weight_check_every: check the weights every this many optimizer steps.
        rollback_lr_factor: multiply the learning rate by this at each rollback (1.0: keep it).
        max_rollbacks: stop training after this many rollbacks.
    """

    def __init__(
        self,
        policy: Literal["skip", "stop"] = "skip",
        max_consecutive_skips: int | None = 20,
        report_params: int = 5,
        every_n_steps: int | None = None,
        filename: str = "nonfinite.json",
        max_abs_weight: float | None = None,
        weight_check_every: int = 1,
        rollback_lr_factor: float = 0.5,
        max_rollbacks: int = 3,
    ) -> None:
        if max_abs_weight is not None and not max_abs_weight > 0:
            raise ValueError(f"NonFiniteGuard: max_abs_weight must be positive or null (off), got {max_abs_weight}.")
        if weight_check_every < 1 or max_rollbacks < 0 or not 0 < rollback_lr_factor <= 1:
            raise ValueError(
                "NonFiniteGuard: weight_check_every must be >= 1, max_rollbacks >= 0 and rollback_lr_factor in (0, 1], "
                f"got {weight_check_every}, {max_rollbacks}, {rollback_lr_factor}."
            )
        self.max_abs_weight = max_abs_weight
        self.weight_check_every = weight_check_every
        self.rollback_lr_factor = rollback_lr_factor
        self.max_rollbacks = max_rollbacks
        self.rollbacks: list[dict[str, Any]] = []
        self._checked_step = -1
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
        StepReads.reset(trainer)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        value = loss.detach().float()
        if self._scaler is not None and getattr(self._scaler, "_scale", None) is not None:
            value = value / self._scaler._scale.to(value)  # fp16: the hook sees the scaled loss (device tensor)
        finite = torch.isfinite(value)
        self._loss_finite = finite if self._loss_finite is None else self._loss_finite & finite
        self._loss = value if self._loss is None else self._loss + value
        StepReads.of(trainer, pl_module).put("loss_finite", self._loss_finite)  # read with the step's one read

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        step = step_index(trainer)
        loss_finite, loss = self._loss_finite, self._loss
        self._loss_finite, self._loss = None, None
        reads = StepReads.of(trainer, pl_module)
        grads = [] if self._scaler is not None else [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:
            reads.grad_norms()  # the shared norms: the L2 norm is NaN/Inf iff a gradient holds one (or overflows)
        if loss_finite is None and not grads:
            return
        values = reads.read()  # the one host read per step, shared with LossSpikeMonitor
        ok = values.get("loss_finite", 1.0) == 1.0 and math.isfinite(values.get("grad_norm", 0.0) if grads else 0.0)
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
            else "no non-finite gradient element"
            + (", but the gradients' L2 norm overflows (clipping would zero them)" if grads and loss_value is not None
               and math.isfinite(loss_value) else "")
        )  # fmt: skip
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
        if self.max_abs_weight is not None and trainer.global_step != self._checked_step:
            self._checked_step = trainer.global_step  # an optimizer-step boundary (not an accumulation batch)
            if trainer.global_step % self.weight_check_every == 0:
                self._watch_weights(trainer, pl_module)
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
        if self.records or self.rollbacks:
            self._write(trainer)

    # ------------------------------------------------------------------------------- explosive updates
    def _watch_weights(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        largest = max_abs(pl_module.parameters())
        if trainer.world_size > 1:
            largest = float(trainer.strategy.reduce(torch.tensor(largest, device=pl_module.device), reduce_op="max"))
        if math.isfinite(largest) and largest <= self.max_abs_weight:
            return
        step = trainer.global_step
        source = None
        if len(self.rollbacks) < self.max_rollbacks:
            source = self._good_checkpoint(trainer, pl_module, before=step)
        if source is None:
            why = "no rollbacks left" if len(self.rollbacks) >= self.max_rollbacks else "no usable periodic checkpoint"
            rank_zero_warn(
                f"NonFiniteGuard: step {step}: the largest |weight| is {largest:.3g} > max_abs_weight "
                f"{self.max_abs_weight:g} and there is {why}; stopping. Resume from an earlier checkpoint with a lower "
                "learning rate (docs/reliability.md)."
            )
            self.stopped_at = step
            trainer.should_stop = True
            self._write(trainer)
            return
        path, checkpoint = source
        pl_module.load_state_dict(checkpoint["state_dict"])
        factor = self.rollback_lr_factor
        for optimizer, state in zip(trainer.optimizers, checkpoint.get("optimizer_states", [])):
            current = [group["lr"] for group in optimizer.param_groups]
            optimizer.load_state_dict(state)
            for group, lr in zip(optimizer.param_groups, current):
                group["lr"] = lr * factor
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
        record = {
            "step": step,
            "max_abs_weight": largest if math.isfinite(largest) else str(largest),
            "to_checkpoint": str(path),
            "to_step": int(checkpoint.get("global_step", -1)),
            "lr_factor": factor,
        }
        self.rollbacks.append(record)
        rank_zero_warn(
            f"NonFiniteGuard: step {step}: the largest |weight| is {largest:.3g} > max_abs_weight "
            f"{self.max_abs_weight:g} (an explosive update); rolled back the weights and optimizer state to {path} "
            f"(step {record['to_step']}) and multiplied the learning rate by {factor:g}."
        )
        self._write(trainer)

    def _good_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, before: int
    ) -> tuple[str, dict[str, Any]] | None:
        """The newest periodic checkpoint of this run before step `before` whose weights are finite and in bounds."""
        candidates: list[tuple[int, str]] = []
        for callback in trainer.checkpoint_callbacks:
            candidates += [(int(s), str(p)) for s, p in getattr(callback, "periodic", [])]
        for step, path in sorted(set(candidates), reverse=True):
            if step >= before:
                continue
            try:
                checkpoint = load_checkpoint(path, map_location=pl_module.device)
            except (OSError, RuntimeError, ValueError):  # missing, damaged or untrusted: not a rollback target
                continue
            weights = [v for v in checkpoint.get("state_dict", {}).values() if torch.is_floating_point(v)]
            largest = max_abs(weights)
            if weights and math.isfinite(largest) and largest <= self.max_abs_weight:
                return path, checkpoint
        return None

    def summary(self) -> dict[str, Any]:
        """What nonfinite.json holds."""
        settings = {"policy": self.policy, "max_consecutive_skips": self.max_consecutive_skips}
        settings["max_abs_weight"] = self.max_abs_weight
        return {
            "steps": self.records,
            "skipped": self.skipped,
            "stopped_at": self.stopped_at,
            "rollbacks": self.rollbacks,
            "settings": settings,
        }

    def _write(self, trainer: L.Trainer) -> None:
        write_json(run_dir(trainer) / self.filename, self.summary())

    # ---------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        state = {"records": list(self.records), "skipped": self.skipped, "consecutive": self.consecutive}
        return {**state, "rollbacks": list(self.rollbacks)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = list(state_dict.get("records", []))
        self.skipped = int(state_dict.get("skipped", 0))
        self.consecutive = int(state_dict.get("consecutive", 0))
        self.rollbacks = list(state_dict.get("rollbacks", []))


def max_abs(tensors: Any) -> float:
    """The largest |element| over tensors (NaN if any is NaN): one fused reduction and one host read."""
    tensors = [t.detach() for t in tensors if t.numel()]
    if not tensors:
        return 0.0
    norms = torch._foreach_norm(tensors, math.inf)  # max |x| per tensor (NaN propagates)
    return float(torch.stack([n.float() for n in norms]).max())
