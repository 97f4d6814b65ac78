"""Will this training run fit in memory? An analytic estimate, checked before anything is prepared or trained.

`lightning_cqk fit` calls `check_memory` before `trainer.fit` (so before shards are prepared and before the first
micro-batch): a configuration whose estimate exceeds the memory of the device it trains on is refused with the
numbers and the way out, instead of starting and dying on its first micro-batch (issue 26: the full paper config on
a CPU). `--memory_check warn` prints the same and goes on; `off` skips it.

The estimate is a lower bound of the peak of one training step, per process, in bytes:
    parameters      the model's own parameter count x 4 (fp32 master weights; Lightning's mixed precision keeps them)
    gradients       the same again
    optimizer       AdamW's two moments: 8 bytes per parameter (Muon's one buffer for matrices is less; not refined)
    activations     per layer and token, the tensors a pre-norm GPT block saves for backward: the two norm inputs,
                    q, k, v, the attention output, the two projection inputs and the MLP's input, hidden
                    pre-activation and activation: 9 C + 2 F elements (C = n_embd, F = mlp_hidden), at 2 bytes under
                    16-bit precision and 4 otherwise; attention scores are not counted (SDPA's fused kernels keep
                    none; the math fallback's B H T^2 makes the real peak higher)
    logits          micro-batch x seq_len x vocabulary: the logits at the activation width, plus the fp32 copy and
                    its gradient that the loss makes (8 bytes)
With `--model.activation_checkpointing true` a layer keeps only its input (C elements per token) and one block's
activations are rebuilt at a time: n_layer C + (9 C + 2 F) per token. With `--model.loss_chunk N` the logits, their
fp32 copy and gradient exist for N tokens at a time (`model/loss.py`), not the whole micro-batch.
Sharded strategies (FSDP / ModelParallelStrategy) divide the first three by the world size; processes that share one
host's memory (DDP on CPU) multiply the whole by their number. Backends with other shapes (MLA latents, differential
pairs, hybrid MLP layers) are estimated as standard attention: the parameter count is always the model's own.

Available memory: on a GPU, the device's total memory (`torch.cuda.mem_get_info`); on a CPU, what the OS reports
as available (`MemAvailable` of /proc/meminfo, else the physical memory) plus what this process already holds (its
resident set: the model is built by then).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from lightning_cqk.errors import UserError

MEMORY_CHECKS = ("refuse", "warn", "off")
GB = 1e9


class MemoryRefused(UserError, MemoryError):
    """A configuration whose training step will not fit in the memory of the device it runs on."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one training step's peak, by part (module docstring)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    micro_batch: int
    seq_len: int
    precision: str

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.logits

    def describe(self) -> str:
        return (
            f"parameters {self.parameters / GB:.2f} GB, gradients {self.gradients / GB:.2f} GB, optimizer state "
            f"{self.optimizer / GB:.2f} GB, activations at the micro-batch of {self.micro_batch} x {self.seq_len} "
            f"tokens {self.activations / GB:.2f} GB, logits and loss {self.logits / GB:.2f} GB; precision "
            f"{self.precision}"
        )


def activation_bytes_per_element(precision: str | int | None) -> int:
    """2 under 16-bit precision (`bf16-mixed`, `16-mixed`, `bf16-true`, ...), else 4."""
    return 2 if "16" in str(precision) else 4


def estimate(
    n_params: int,
    n_layer: int,
    n_embd: int,
    mlp_hidden: int,
    vocab_rows: int,
    micro_batch: int,
    seq_len: int,
    precision: str | int | None = "32-true",
    shards: int = 1,
    activation_checkpointing: bool = False,
    loss_chunk: int = 0,
) -> MemoryEstimate:
    """The estimate of the module docstring for a model of these numbers."""
    width = activation_bytes_per_element(precision)
    tokens = micro_batch * seq_len
    weights = 4.0 * n_params / shards
    per_block = 9 * n_embd + 2 * mlp_hidden  # elements a block saves per token for backward
    per_token = n_layer * n_embd + per_block if activation_checkpointing else n_layer * per_block
    logit_tokens = min(tokens, loss_chunk) if loss_chunk else tokens
    return MemoryEstimate(
        parameters=weights,
        gradients=weights,
        optimizer=2 * weights,
        activations=float(tokens * per_token * width),
        logits=float(logit_tokens * vocab_rows * (width + 8)),
        micro_batch=micro_batch,
        seq_len=seq_len,
        precision=str(precision),
    )


def available_bytes(device: Any) -> tuple[float, str]:
    """(bytes, what they are) of the memory a run on `device` (a torch.device) can use (module docstring)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        _, total = torch.cuda.mem_get_info(device)
        return float(total), f"GPU memory ({torch.cuda.get_device_name(device)})"
    available = _meminfo("MemAvailable")
    if available is None:
        try:
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return float("inf"), "host memory (unknown)"
    return float(available + (_resident_bytes() or 0)), "host memory available"


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def refusal(
    est: MemoryEstimate, available: float, where: str, processes: int = 1, fits_batch: int | None = None
) -> str:
    """The one-paragraph message of a run that will not fit."""
    need = est.total * processes
    each = f" ({processes} processes on this host, {est.total / GB:.2f} GB each)" if processes > 1 else ""
    smaller = (
        f"a smaller micro-batch (--data.batch_size {fits_batch}, with --trainer.accumulate_grad_batches scaled up "
        "to keep the tokens per optimizer step)"
        if fits_batch
        else "a smaller micro-batch (--data.batch_size) or --data.seq_len"
    )
    return (
        f"this configuration needs at least {need / GB:.1f} GB for one training step{each} ({est.describe()}), but "
        f"the {where} is {available / GB:.1f} GB, so it would run out of memory on its first micro-batch. Use "
        f"{smaller}, a smaller model, or a device with more memory; or start it anyway with --memory_check warn "
        "(the estimate is a lower bound; lightning_cqk/memory_check.py)."
    )


def largest_fitting_batch(fits: Any, micro_batch: int) -> int | None:
    """The largest power-of-two divisor of `micro_batch` below it for which `fits(batch)` holds, else None."""
    batch = micro_batch // 2
    while batch >= 1:
        if micro_batch % batch == 0 and fits(batch):
            return batch
        batch //= 2
    return None


def check_memory(model: Any, datamodule: Any, trainer: Any, mode: str = "refuse") -> MemoryEstimate | None:
    """Refuse (`refuse`) or warn about (`warn`) a run whose estimate exceeds the memory of its device (module
    docstring); `off`: nothing. Returns the estimate (None when there is nothing to estimate)."""
    if mode not in MEMORY_CHECKS:
        raise MemoryRefused(f"--memory_check must be one of {', '.join(MEMORY_CHECKS)}, got {mode!r}.")
    config = getattr(model, "config", None)
    micro_batch = getattr(datamodule, "batch_size", None)
    if mode == "off" or config is None or not isinstance(micro_batch, int):
        return None
    seq_len = int(getattr(datamodule, "seq_len", None) or config.block_size)
    strategy = type(trainer.strategy).__name__
    shards = trainer.world_size if ("FSDP" in strategy or "ModelParallel" in strategy) else 1
    device = trainer.strategy.root_device
    processes = trainer.num_devices if device.type == "cpu" else 1
    numbers = dict(
        n_params=sum(p.numel() for p in model.parameters()),
        n_layer=config.n_layer,
        n_embd=config.n_embd,
        mlp_hidden=config.mlp_hidden,
        vocab_rows=config.padded_vocab_size,
        seq_len=seq_len,
        precision=trainer.precision,
        shards=shards,
        activation_checkpointing=bool(getattr(model, "activation_checkpointing", False)),
        loss_chunk=int(getattr(model, "loss_chunk", 0) or 0),
    )
    est = estimate(micro_batch=micro_batch, **numbers)
    available, where = available_bytes(device)
    if est.total * processes <= available:
        return est
    fits_batch = largest_fitting_batch(
        lambda b: estimate(micro_batch=b, **numbers).total * processes <= available, micro_batch
    )
    message = refusal(est, available, where, processes, fits_batch)
    if mode == "refuse":
        raise MemoryRefused(message)
    print(f"lightning_cqk fit: WARNING (--memory_check warn): {message}", file=sys.stderr, flush=True)
    return est
