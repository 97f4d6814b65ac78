"""LossSpikeMonitor: detect loss spikes against a running statistic; log, skip the update, or stop with a checkpoint.

Detection, once per optimizer step (the loss of a step is the mean over its accumulated micro-batches, averaged over
ranks under DDP, so every rank takes the same decision). With m the running statistic of past non-spike losses:
    mode="ratio"   spike if loss > threshold * m                     (default threshold 1.5: docs/papers.md §6 item 15)
    mode="zscore"  spike if (loss - m) / s > threshold               (default threshold 6; s the running std)
    statistic="ema"     m, s: exponential moving mean/variance of the losses (decay `ema_decay`; the mean starts at the
                        first loss, the variance is bias-corrected by 1 - decay^(n - 1) like Adam's moments)
    statistic="window"  m, s: mean/std of the last `window` non-spike losses
A non-finite loss is always a spike. Spikes never enter the statistic (one spike does not hide the next). No spike is
flagged during the first `warmup_steps` steps (the statistic needs data; the loss falls fast early on).

Actions:
    "log" (default)  count and record. Everything stays on the device until a logging step: no host sync.
    "skip"   skip this step's optimizer update: every gradient is set to None in `on_before_optimizer_step` (after the
             backward, before clipping and `optimizer.step()`), and `torch.optim` optimizers leave a parameter without
             a gradient untouched (no moment update, no weight decay, no step count). Works with automatic
             optimization under fp32 and bf16-mixed; refused under "16-mixed" (the fp16 GradScaler asserts on a step
             without gradients; "log" works there, unscaling the loss). The learning-rate schedule and
             `trainer.global_step` still advance.
    "stop"   skip the update (as "skip"), then at the end of the batch save `checkpoints/spike-step{k}.ckpt` in the run
             directory (the weights before the spike) and stop training.
    "skip" and "stop" need the decision on the host before the update: one scalar read per step.
Grad-norm rule (arXiv 2606.04032, whose code skips steps with a grad norm above 100; off unless `max_grad_norm` is
set): skip the update when the pre-clip global gradient norm exceeds `max_grad_norm` (the norm and its host read are
the step's shared ones, `step_reads.StepReads`, with NonFiniteGuard; put this callback before the guard).

Metrics (every `every_n_steps`, default `trainer.log_every_n_steps`): `train/spikes` (cumulative count) and, when
updates can be skipped, `train/skipped_updates` (cumulative, either reason). The run directory gets `spikes.json`:
{"spikes": [{"step", "loss", "reference", "score"}], "skipped": [{"step", "reason", ...}], "settings": {...}}, where
step is the 0-based optimizer step whose batch spiked (= `trainer.global_step` before that step), reference the
statistic it was compared with and score the ratio or z-score. Written on logging steps that found something new and
when training ends; resumable (the statistic and the records are in the callback's checkpoint state).

Put a GradNormMonitor before this callback in the callbacks list: a skipped update drops the gradients in the hook
both use.

Tests (`tests/e2e/callbacks/test_loss_spike.py`): a loss planted at step k is reported exactly once, at k, in the metric
and in spikes.json (ratio and z-score, EMA and window); "skip" leaves every parameter and optimizer state unchanged at
step k and only there; "stop" stops at k with a checkpoint; the grad-norm rule skips and counts.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch

from lightning_cqk.callbacks.common import is_log_step, log_metrics, run_dir, step_index, write_json
from lightning_cqk.callbacks.step_reads import StepReads

_RECORD = ("spike_flag", "spike_loss", "spike_reference", "spike_score")

DEFAULT_THRESHOLDS = {"ratio": 1.5, "zscore": 6.0}


class LossSpikeMonitor(L.Callback):
    """Detect loss spikes against a running statistic (see the module docstring).

    Args:
        mode: "ratio" (loss / mean) or "zscore" ((loss - mean) / std).
        threshold: spike above this ratio or z-score; None gives 1.5 (ratio) or 6 (zscore).
        statistic: "ema" (exponential moving mean and variance) or "window" (last `window` losses).
        ema_decay: decay of the EMA statistic.
        window: length of the window statistic.
        warmup_steps: steps during which the statistic is built and nothing is flagged (non-finite losses excepted).
        action: "log", "skip" (skip the optimizer update of a spiking step) or "stop" (skip, checkpoint and stop).
        max_grad_norm: also skip any update whose pre-clip gradient norm exceeds this (None: off).
        every_n_steps: logging interval; None uses `trainer.log_every_n_steps`.
        filename: name of the JSON record in the run directory.
    """

    def __init__(
        self,
        mode: Literal["ratio", "zscore"] = "ratio",
        threshold: float | None = None,
        statistic: Literal["ema", "window"] = "ema",
        ema_decay: float = 0.99,
        window: int = 100,
        warmup_steps: int = 20,
        action: Literal["log", "skip", "stop"] = "log",
        max_grad_norm: float | None = None,
        every_n_steps: int | None = None,
        filename: str = "spikes.json",
    ) -> None:
        if mode not in DEFAULT_THRESHOLDS:
            raise ValueError(f"LossSpikeMonitor: mode={mode!r} is not 'ratio' or 'zscore'.")
        if statistic not in ("ema", "window"):
            raise ValueError(f"LossSpikeMonitor: statistic={statistic!r} is not 'ema' or 'window'.")
        if action not in ("log", "skip", "stop"):
            raise ValueError(f"LossSpikeMonitor: action={action!r} is not 'log', 'skip' or 'stop'.")
        if not 0.0 < ema_decay < 1.0:
            raise ValueError(f"LossSpikeMonitor: ema_decay must be in (0, 1), got {ema_decay}.")
        if window < 2:
            raise ValueError(f"LossSpikeMonitor: window must be >= 2, got {window}.")
        self.mode = mode
        self.threshold = float(DEFAULT_THRESHOLDS[mode] if threshold is None else threshold)
        self.statistic = statistic
        self.ema_decay = ema_decay
        self.window = window
        self.warmup_steps = warmup_steps
        self.action = action
        self.max_grad_norm = max_grad_norm
        self.every_n_steps = every_n_steps
        self.filename = filename
        self.spikes: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self._reset_state()

    def _reset_state(self) -> None:
        self._acc: torch.Tensor | None = None  # loss summed over this step's micro-batches
        self._state: dict[str, torch.Tensor] | None = None  # the running statistic, on the device
        self._pending: list[tuple[int, torch.Tensor]] = []  # (step, stacked [flag, loss, reference, score]) unread
        self._stop_at: int | None = None
        self._scaler = None
        self._dirty = False

    # --------------------------------------------------------------------------------------- statistic
    def _init_state(self, device: torch.device) -> dict[str, torch.Tensor]:
        zero = torch.zeros((), dtype=torch.float64, device=device)
        state = {"count": zero.clone(), "mean": zero.clone(), "var": zero.clone()}
        if self.statistic == "window":
            state["buffer"] = torch.zeros(self.window, dtype=torch.float64, device=device)
        return state

    def _reference(self, s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the statistic so far (device tensors)."""
        if self.statistic == "ema":
            # The EW variance starts at 0 after the first loss; divide by 1 - d^(n-1), as Adam's bias correction.
            correction = 1 - torch.pow(self.ema_decay, s["count"] - 1)
            return s["mean"], (s["var"] / correction.clamp_min(1e-12)).clamp_min(0).sqrt()
        n = s["count"].clamp(max=self.window)
        filled = torch.arange(self.window, device=n.device) < n
        buf = s["buffer"]
        mean = torch.where(filled, buf, 0).sum() / n.clamp_min(1)
        var = torch.where(filled, (buf - mean) ** 2, 0).sum() / (n - 1).clamp_min(1)
        return mean, var.sqrt()

    def _update(self, loss: torch.Tensor) -> torch.Tensor:
        """Test `loss` (0-dim fp64) against the statistic, then add it if it is no spike: [flag, loss, ref, score]."""
        s = self._state
        mean, std = self._reference(s)
        if self.mode == "ratio":
            score = loss / mean.clamp_min(1e-12)
        else:
            score = (loss - mean) / std.clamp_min(1e-12)
        ready = s["count"] >= self.warmup_steps
        finite = torch.isfinite(loss)
        flag = ~finite | (ready & (score > self.threshold))
        keep = ~flag
        if self.statistic == "ema":
            d = self.ema_decay
            first = s["count"] == 0
            delta = loss - s["mean"]
            new_mean = torch.where(first, loss, s["mean"] + (1 - d) * delta)
            new_var = torch.where(first, torch.zeros_like(loss), d * (s["var"] + (1 - d) * delta * delta))
            s["mean"] = torch.where(keep, new_mean, s["mean"])
            s["var"] = torch.where(keep, new_var, s["var"])
        else:
            slot = torch.remainder(s["count"], self.window).long()
            write = (torch.arange(self.window, device=loss.device) == slot) & keep
            s["buffer"] = torch.where(write, loss, s["buffer"])
        s["count"] = s["count"] + keep.to(s["count"].dtype)
        return torch.stack((flag.to(loss.dtype), loss, mean, score))

    # ------------------------------------------------------------------------------------------- hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        StepReads.reset(trainer)
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)  # fp16 ("16-mixed") only
        if self._scaler is not None and self.action != "log":
            raise ValueError(
                f"LossSpikeMonitor(action={self.action!r}) cannot skip updates under fp16 mixed precision (the "
                "GradScaler refuses a step without gradients); use precision bf16-mixed or 32-true, or action='log'."
            )

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        # Lightning passes the micro-batch loss divided by accumulate_grad_batches: the sum is the step's mean loss.
        value = loss.detach().to(torch.float64)
        if self._scaler is not None and getattr(self._scaler, "_scale", None) is not None:
            value = value / self._scaler._scale.to(value)  # fp16: the hook sees the scaled loss (device tensor)
        self._acc = value if self._acc is None else self._acc + value

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        step = step_index(trainer)
        reads = StepReads.of(trainer, pl_module)  # decisions needed now: the step's one shared host read
        loss, self._acc = self._acc, None
        record = None
        if loss is not None:  # None: no backward this step (training_step returned None)
            if trainer.world_size > 1:
                loss = trainer.strategy.reduce(loss, reduce_op="mean")
            if self._state is None:
                self._state = self._init_state(loss.device)
            record = self._update(loss)  # [flag, loss, reference, score] on the device
            if self.action != "log":
                for name, value in zip(_RECORD, record, strict=True):
                    reads.put(name, value)
        skipped = False
        if self.max_grad_norm is not None:
            skipped = self._grad_norm_rule(trainer, pl_module, step)  # reads the record above in the same read
        if record is None:
            return
        if self.action == "log":
            self._pending.append((step, record))
        else:
            values = reads.read()
            flag, value, reference, score = (values[name] for name in _RECORD)
            if flag:
                self._add_spike(step, value, reference, score)
                if not skipped:
                    self._skip(pl_module, step, "spike", loss=value)
                if self.action == "stop":
                    self._stop_at = step
        if is_log_step(trainer, self.every_n_steps, step):
            self._flush()
            metrics: dict[str, float] = {"train/spikes": float(len(self.spikes))}
            if self.action != "log" or self.max_grad_norm is not None:
                metrics["train/skipped_updates"] = float(len(self.skipped))
            log_metrics(trainer, metrics, step)
            self._write(trainer)

    def _grad_norm_rule(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> bool:
        reads = StepReads.of(trainer, pl_module)  # the step's one norm computation, shared with the guard
        if reads.grad_norms() is None:
            return False
        value = reads.read()["grad_norm"]  # host read (shared): the rule decides before the update
        if not value > self.max_grad_norm:
            return False
        self._skip(pl_module, step, "grad_norm", grad_norm=value)
        return True

    def _skip(self, pl_module: L.LightningModule, step: int, reason: str, **info: float) -> None:
        for p in pl_module.parameters():
            p.grad = None  # optimizers skip parameters without a gradient: no update at all
        self.skipped.append({"step": step, "reason": reason, **info})
        self._dirty = True

    def _add_spike(self, step: int, loss: float, reference: float, score: float) -> None:
        self.spikes.append({"step": step, "loss": loss, "reference": reference, "score": score})
        self._dirty = True

    def _flush(self) -> None:
        """Read the pending records (one host read) and keep the spikes."""
        if not self._pending:
            return
        steps = [s for s, _ in self._pending]
        rows = torch.stack([r for _, r in self._pending]).tolist()
        self._pending = []
        for step, (flag, loss, reference, score) in zip(steps, rows, strict=True):
            if flag:
                self._add_spike(step, loss, reference, score)

    def _write(self, trainer: L.Trainer) -> None:
        if not self._dirty:
            return
        path = run_dir(trainer) / self.filename
        write_json(path, self.summary())
        self._dirty = False

    def summary(self) -> dict[str, Any]:
        """What spikes.json holds (after `_flush`)."""
        settings = {
            "mode": self.mode,
            "threshold": self.threshold,
            "statistic": self.statistic,
            "ema_decay": self.ema_decay,
            "window": self.window,
            "warmup_steps": self.warmup_steps,
            "action": self.action,
            "max_grad_norm": self.max_grad_norm,
        }
        clean = [
            {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in s.items()}
            for s in self.spikes
        ]
        return {"spikes": clean, "skipped": self.skipped, "settings": settings}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._stop_at is None:
            return
        step, self._stop_at = self._stop_at, None
        path = run_dir(trainer) / "checkpoints" / f"spike-step{step}.ckpt"
        trainer.save_checkpoint(str(path))
        trainer.should_stop = True
        self._dirty = True
        self._write(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush()
        self._dirty = True
        self._write(trainer)

    # ---------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        state = {k: v.cpu() for k, v in self._state.items()} if self._state is not None else None
        return {"state": state, "spikes": list(self.spikes), "skipped": list(self.skipped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.spikes = list(state_dict.get("spikes", []))
        self.skipped = list(state_dict.get("skipped", []))
        state = state_dict.get("state")
        self._state = {k: v.clone() for k, v in state.items()} if state is not None else None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._state is not None:  # restored from a checkpoint: move the statistic to the training device
            self._state = {k: v.to(pl_module.device) for k, v in self._state.items()}
