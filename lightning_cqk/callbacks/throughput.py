"""Throughput: tokens/s, analytic FLOPs/s and model-FLOPs utilisation, after a warm-up.

Metrics (every `every_n_steps`, default `trainer.log_every_n_steps`, over the steps since the previous log):
    train/tokens_per_sec   trained tokens per second, all ranks together
    train/flops_per_sec    analytic training FLOPs per second, all ranks together (`lightning_cqk.model.flops`: what
                           the model requires, PaLM convention; recomputation is not credited)
    train/mfu              flops_per_sec / (world_size * peak), only when the peak is known
The first `warmup_steps` optimizer steps are never timed (compilation, allocator and cache warm-up), validation time is
excluded, and on CUDA the device is synchronised at the two ends of every timed window (only on logging steps), so
the window measures finished work. Counts come from the module's `tokens_seen`/`flops_seen` (LitLM), else from the
batch shape (a (B, T + 1) token batch) and the model config.

Peak FLOPs: `peak_flops` if given (per device, FLOP/s), else the dense bf16 tensor-core peak of the CUDA device looked
up by name in `PEAK_FLOPS` (fp16 for GPUs without bf16), else none: on CPU or an unknown GPU without `peak_flops`
there is no `train/mfu` key. The table holds dense (not 2:4 sparse) numbers from NVIDIA's datasheets; MFU is always
relative to that bf16/fp16 peak, whatever the training precision (fp32 runs therefore show a low MFU).

Tests (`tests/callbacks/test_throughput.py`): keys appear only after the warm-up, no MFU on CPU without a peak, MFU =
FLOPs/s / peak with an override, the device-name lookup.
"""

from __future__ import annotations

import re
import time
from typing import Any

import lightning as L
import torch

from lightning_cqk.callbacks.common import is_log_step, log_metrics, step_index

#: (regex on the lower-cased CUDA device name, dense bf16 FLOP/s per GPU); first match wins, so specific names first.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    (r"gh200", 989e12),
    (r"h200.*nvl", 835e12),
    (r"h200", 989e12),  # SXM
    (r"h100.*nvl", 835e12),
    (r"h100.*(pcie|hbm2e)", 756e12),
    (r"h100", 989e12),  # SXM (reported as "H100 80GB HBM3")
    (r"b200", 2250e12),
    (r"a100", 312e12),  # SXM and PCIe
    (r"l40s", 362e12),
    (r"l40\b", 181e12),
    (r"\bl4\b", 121e12),
    (r"a10g", 125e12),  # as Lightning's table; AWS states less for some SKUs
    (r"\ba10\b", 125e12),
    (r"a6000", 155e12),
    (r"\ba40\b", 150e12),
    (r"rtx 4090", 165e12),  # bf16 with fp32 accumulation
    (r"rtx 3090", 71e12),
    (r"v100", 125e12),  # fp16 (no bf16)
    (r"\bt4\b", 65e12),  # fp16 (no bf16)
)


def peak_flops_for(device_name: str) -> float | None:
    """Dense bf16 (fp16 where bf16 is absent) peak FLOP/s of a CUDA device by its name, None when unknown."""
    name = device_name.lower()
    for pattern, flops in PEAK_FLOPS:
        if re.search(pattern, name):
            return flops
    return None


def device_peak_flops(device: torch.device) -> float | None:
    """Peak FLOP/s of `device` from the table (None on CPU or for an unknown GPU)."""
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device))


class Throughput(L.Callback):
    """Log tokens/s, FLOPs/s and MFU over windows of optimizer steps, after `warmup_steps` (module docstring).

    Args:
        every_n_steps: logging interval in optimizer steps; None uses `trainer.log_every_n_steps`.
        warmup_steps: optimizer steps excluded before the first timed window.
        peak_flops: peak FLOP/s of one device, overriding the table (also enables MFU on CPU).
    """

    def __init__(
        self, every_n_steps: int | None = None, warmup_steps: int = 10, peak_flops: float | None = None
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"Throughput.warmup_steps must be >= 0, got {warmup_steps}.")
        self.every_n_steps = every_n_steps
        self.warmup_steps = warmup_steps
        self.peak_flops = peak_flops
        self.latest: dict[str, float] = {}
        self._peak: float | None = None
        self._mark: tuple[float, float, float] | None = None  # (time, tokens, flops) at the window start
        self._paused = 0.0
        self._val_start: float | None = None
        self._last_step = -1
        self._tokens = 0.0  # own counts when the module keeps none
        self._flops = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._peak = self.peak_flops if self.peak_flops is not None else device_peak_flops(pl_module.device)
        self._mark, self._last_step, self._paused = None, trainer.global_step, 0.0
        self._start_step = trainer.global_step

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_start is not None and self._mark is not None:
            self._paused += time.perf_counter() - self._val_start
        self._val_start = None

    def _counts(self, pl_module: L.LightningModule) -> tuple[float, float]:
        tokens = getattr(pl_module, "tokens_seen", None)
        flops = getattr(pl_module, "flops_seen", None)
        return (
            float(self._tokens if tokens is None else tokens),
            float(self._flops if flops is None else flops),
        )

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not hasattr(pl_module, "tokens_seen") and isinstance(batch, torch.Tensor) and batch.dim() == 2:
            B, T = batch.size(0), batch.size(1) - 1
            self._tokens += B * T * trainer.world_size
            if hasattr(pl_module, "config"):
                from lightning_cqk.model.flops import training_flops_per_batch

                self._flops += training_flops_per_batch(pl_module.config, B, T) * trainer.world_size
        if trainer.global_step == self._last_step:
            return  # accumulating: not an optimizer-step boundary
        self._last_step = trainer.global_step
        step = step_index(trainer)
        done = trainer.global_step - self._start_step  # optimizer steps finished in this fit
        if self._mark is None:
            if done >= self.warmup_steps:
                self._sync(pl_module)
                self._mark = (time.perf_counter(), *self._counts(pl_module))
                self._paused = 0.0
            return
        if not is_log_step(trainer, self.every_n_steps, step):
            return
        self._sync(pl_module)
        now = time.perf_counter()
        tokens, flops = self._counts(pl_module)
        t0, tokens0, flops0 = self._mark
        seconds = max(now - t0 - self._paused, 1e-9)
        metrics = {"train/tokens_per_sec": (tokens - tokens0) / seconds}
        if flops > 0:
            metrics["train/flops_per_sec"] = (flops - flops0) / seconds
            if self._peak:
                metrics["train/mfu"] = metrics["train/flops_per_sec"] / (self._peak * trainer.world_size)
        self.latest = log_metrics(trainer, metrics, step)
        self._mark, self._paused = (now, tokens, flops), 0.0
