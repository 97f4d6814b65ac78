"""Throughput: tokens/s, analytic FLOPs/s and model-FLOPs utilisation, after a warm-up.

Metrics (every `every_n_steps`, default `trainer.log_every_n_steps`, over the steps since the previous log):
    train/tokens_per_sec   trained tokens per second, all ranks together
    train/flops_per_sec    analytic training FLOPs per second, all ranks together (`lightning_cqk.model.flops`: what
                           the model requires, PaLM convention; recomputation is not credited)
    train/mfu              flops_per_sec / (world_size * peak), only when the peak is known
The first `warmup_steps` optimizer steps are never timed (compilation, allocator and cache warm-up); time is read from
the run's `TrainingClock` (validation and checkpoint writing excluded, as for TokenBudget and RunSummary), and on CUDA
the device is synchronised at the two ends of every timed window (only on logging steps), so the window measures
finished work. Counts come from the module's `tokens_seen`/`flops_seen` (LitLM), else from the batch shape (a
(B, T + 1) token batch) and the model config.

Peak FLOPs: `peak_flops` if given (per device, FLOP/s), else the dense peak of the CUDA device (looked up by name in
`PEAK_FLOPS`) for the dtype the trainer's precision runs its matmuls in: the 16-bit tensor-core peak for bf16/fp16
(mixed or true), the TF32 tensor-core peak for fp32 when TF32 is allowed (`torch.backends.cuda.matmul.allow_tf32`,
e.g. `torch.set_float32_matmul_precision("high")`), else the fp32 CUDA-core peak; none for fp64. On CPU or an unknown
GPU without `peak_flops` there is no `train/mfu` key. FLOPs are the analytic counts of the model's actual backends
(`lightning_cqk.model.flops`: coupled's dynamics, MLA's latent projections, ... each counted; recomputation and a
fast path's duplicated work are not credited), so MFU compares backends on the work they require.

Tests (`tests/e2e/callbacks/test_throughput.py`): keys appear only after the warm-up, no MFU on CPU without a peak, MFU
=
FLOPs/s / peak with an override, the device-name lookup.
"""

from __future__ import annotations

import re
from typing import Any

import lightning as L
import torch

from lightning_cqk.callbacks.clock import TrainingClock
from lightning_cqk.callbacks.common import is_log_step, log_metrics, step_index

#: (regex on the lower-cased CUDA device name, dense FLOP/s per GPU: (bf16, tf32, fp32)); first match wins, so specific
#: names first. bf16 is the 16-bit tensor-core peak (fp16 on GPUs without bf16, fp32 accumulation on GeForce cards);
#: tf32 the tensor-core peak for fp32 matmuls with TF32 allowed; fp32 the plain CUDA-core peak. NVIDIA datasheets, dense
#: (not 2:4 sparse); None where no tensor-core TF32 exists.
PEAK_FLOPS: tuple[tuple[str, tuple[float, float | None, float]], ...] = (
    (r"gh200", (989e12, 495e12, 67e12)),
    (r"h200.*nvl", (835e12, 418e12, 60e12)),
    (r"h200", (989e12, 495e12, 67e12)),  # SXM
    (r"h100.*nvl", (835e12, 418e12, 60e12)),
    (r"h100.*(pcie|hbm2e)", (756e12, 378e12, 51e12)),
    (r"h100", (989e12, 495e12, 67e12)),  # SXM (reported as "H100 80GB HBM3")
    (r"b200", (2250e12, 1100e12, 75e12)),
    (r"a100", (312e12, 156e12, 19.5e12)),  # SXM and PCIe
    (r"l40s", (362e12, 183e12, 91.6e12)),
    (r"l40\b", (181e12, 90.5e12, 90.5e12)),
    (r"\bl4\b", (121e12, 60e12, 30.3e12)),
    (r"a10g", (125e12, 62.5e12, 31.2e12)),  # as Lightning's table; AWS states less for some SKUs
    (r"\ba10\b", (125e12, 62.5e12, 31.2e12)),
    (r"a6000", (155e12, 77.4e12, 38.7e12)),
    (r"\ba40\b", (150e12, 74.8e12, 37.4e12)),
    (r"rtx 4090", (165e12, 82.6e12, 82.6e12)),  # bf16 with fp32 accumulation
    (r"rtx 3090", (71e12, 35.6e12, 35.6e12)),
    (r"v100", (125e12, None, 15.7e12)),  # fp16 (no bf16, no TF32)
    (r"\bt4\b", (65e12, None, 8.1e12)),  # fp16 (no bf16, no TF32)
)

#: Lightning precision flags -> the dtype its matmuls run in (None: no peak to compare with, e.g. fp64).
PRECISION_DTYPES: dict[str, torch.dtype | None] = {
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "bf16": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
    "16": torch.float16,
    "32-true": torch.float32,
    "32": torch.float32,
    "64-true": None,
    "64": None,
}


def peak_flops_for(device_name: str, dtype: torch.dtype = torch.bfloat16, tf32: bool = True) -> float | None:
    """Dense peak FLOP/s of a CUDA device by its name for matmuls in `dtype`, None when unknown.

    bf16 / fp16: the 16-bit tensor-core peak. fp32: the TF32 tensor-core peak when `tf32` (matmuls allowed to use
    TF32), else the CUDA-core fp32 peak. Other dtypes (fp64, ...): None.
    """
    name = device_name.lower()
    for pattern, (half, tf32_peak, fp32) in PEAK_FLOPS:
        if re.search(pattern, name):
            if dtype in (torch.bfloat16, torch.float16):
                return half
            if dtype == torch.float32:
                return tf32_peak if tf32 and tf32_peak is not None else fp32
            return None
    return None


def tf32_allowed() -> bool:
    """Whether fp32 matmuls on CUDA may use TF32 tensor cores (`torch.backends.cuda.matmul.allow_tf32`)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def device_peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Peak FLOP/s of `device` for matmuls in `dtype` from the table (None on CPU or for an unknown GPU)."""
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device), dtype, tf32=tf32_allowed())


def precision_dtype(precision: object) -> torch.dtype | None:
    """The matmul dtype of a Lightning precision flag ("bf16-mixed", "32-true", ...); None when it has no peak."""
    return PRECISION_DTYPES.get(str(precision), torch.float32)


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
        self._mark: tuple[float, float, float] | None = None  # (clock seconds, tokens, flops) at the window start
        self._clock: TrainingClock | None = None
        self._last_step = -1
        self._tokens = 0.0  # own counts when the module keeps none
        self._flops = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._clock = TrainingClock.of(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.peak_flops is not None:
            self._peak = self.peak_flops
        else:
            dtype = precision_dtype(trainer.precision)
            self._peak = device_peak_flops(pl_module.device, dtype) if dtype is not None else None
        self._mark, self._last_step = None, trainer.global_step
        self._start_step = trainer.global_step

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
                self._mark = (self._clock.seconds(), *self._counts(pl_module))
            return
        if not is_log_step(trainer, self.every_n_steps, step):
            return
        self._sync(pl_module)
        now = self._clock.seconds()
        tokens, flops = self._counts(pl_module)
        t0, tokens0, flops0 = self._mark
        seconds = now - t0
        if seconds <= 0:
            return  # no training time measured in this window: no rate (never a division by zero)
        metrics = {"train/tokens_per_sec": (tokens - tokens0) / seconds}
        if flops > 0:
            metrics["train/flops_per_sec"] = (flops - flops0) / seconds
            if self._peak:
                metrics["train/mfu"] = metrics["train/flops_per_sec"] / (self._peak * trainer.world_size)
        self.latest = log_metrics(trainer, metrics, step)
        self._mark = (now, tokens, flops)
