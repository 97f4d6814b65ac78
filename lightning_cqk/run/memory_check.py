"""Will this training run fit in memory? An analytic estimate, checked before anything is prepared or trained.

`lightning_cqk fit` calls `check_memory` before `trainer.fit` (so before shards are prepared and before the first
micro-batch): a configuration whose estimate exceeds the memory of the device it trains on is refused with the
numbers and the way out, instead of starting and dying on its first micro-batch (issue 26: the full paper config on
a CPU). `--memory_check warn` prints the same and goes on; `off` skips it.

The estimate is a lower bound of the peak of one training step, per process, in bytes:
    parameters      the model's own parameter count x 4 (fp32 master weights; Lightning's mixed precision keeps them)
    gradients       the same again
    optimizer       AdamW's two moments: 8 bytes per parameter (Muon's one buffer for matrices is less; not refined)
    activations     per layer and token, the tensors a pre-norm GPT block saves for backward
                    (`block_activation_bytes`, measured: tests/e2e/test_memory_check.py): the two norm inputs (the
                    residual stream: fp32 under mixed precision), the two norm outputs (each cast once), q, k, v, the
                    attention output and the output projection's input, and the MLP's hidden tensors (2 F for GELU,
                    4 F for SwiGLU); 2 C r + (7 C + 2 F) w bytes for GELU (C = n_embd, F = mlp_hidden, w = 2 under
                    16-bit precision and 4 otherwise, r = 4 unless the weights themselves are 16-bit): 38 C at
                    bf16-mixed with F = 4 C (the earlier 9 C + 2 F elements at w, 34 C, was 12% low); attention
                    scores are not counted (SDPA's fused kernels keep none; the math fallback's B H T^2 makes the real
                    peak higher), nor per-token statistics (norm and softmax: under 1% at C >= 256)
    logits          micro-batch x seq_len x vocabulary: the logits at the activation width, plus the fp32 copy and
                    its gradient that the loss makes (8 bytes)
With `--model.activation_checkpointing true` a layer keeps only its input (C elements per token, at the residual
stream's r bytes) and one block's activations are rebuilt at a time: n_layer C r + one block per token. With
`--model.loss_chunk N` the logits, their fp32 copy and gradient exist for N tokens at a time (`model/loss.py`), not
the whole micro-batch.
Sharded strategies (FSDP / ModelParallelStrategy) divide the first three by the world size; processes that share one
host's memory (DDP on CPU) multiply the whole by their number. Backends with other shapes (MLA latents, differential
pairs, hybrid MLP layers) are estimated as standard attention: the parameter count is always the model's own.

Validation is estimated too (`estimate_validation`), when the trainer validates at all (`limit_val_batches` not 0):
its batches are `data.val_batch_size` windows of `data.val_seq_len` tokens (each defaulting to the training ones),
scored in `block_size` chunks when longer, and once more per `model.eval_contexts` length (sliding windows of that
many tokens). Its peak is what training leaves resident (parameters, gradients and optimizer state) plus the largest
of those forwards: no tensor is kept for backward, so one block's activations (as above, per token) and the
logits with their fp32 copy and loss (the loss chunk applies to the plain windows only). A run whose validation does
not fit is refused the same way, naming the validation's numbers, instead of training `val_check_interval` steps and
dying at its first validation.

On a resume (`--ckpt_path`) the advice names only what a resume may change (`run_dir.RESUME_POLICY`): the trainer's
precision, the evaluation contexts, validation off; a smaller micro-batch is another experiment, a new run.

Available memory: on a GPU, the device's total memory (`torch.cuda.mem_get_info`); on a CPU, what the OS reports
as available (`MemAvailable` of /proc/meminfo, else the physical memory) plus what this process already holds (its
resident set: the model is built by then).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
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


def residual_bytes_per_element(precision: str | int | None) -> int:
    """The residual stream's width: 4 under mixed precision (autocast keeps it fp32), 2 when the weights are 16-bit
    (`bf16-true`, `16-true`)."""
    return 2 if "16" in str(precision) and "true" in str(precision) else 4


def block_activation_bytes(
    n_embd: int, mlp_hidden: int, precision: str | int | None, gated: bool = False, kv_fraction: float = 1.0
) -> float:
    """Bytes one pre-norm block saves for backward per token (module docstring): 2 C r for the norm inputs, then at
    the activation width w the two norm outputs (2 C), q (C), k and v (2 C x kv_fraction: grouped or shared keys and
    values are narrower), the attention output and the output projection's input (2 C), and the MLP's hidden tensors
    (GELU: pre-activation and activation, 2 F; SwiGLU `gated`: gate, its activation, up and the product, 4 F)."""
    w, r = activation_bytes_per_element(precision), residual_bytes_per_element(precision)
    attention = (2 + 1 + 2 * kv_fraction + 2) * n_embd
    mlp = (4 if gated else 2) * mlp_hidden
    return 2 * n_embd * r + (attention + mlp) * w


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
    gated: bool = False,
) -> MemoryEstimate:
    """The estimate of the module docstring for a model of these numbers (`gated`: a SwiGLU MLP)."""
    width = activation_bytes_per_element(precision)
    tokens = micro_batch * seq_len
    weights = 4.0 * n_params / shards
    per_block = block_activation_bytes(n_embd, mlp_hidden, precision, gated)  # bytes per token
    kept_input = n_embd * residual_bytes_per_element(precision)
    per_token = n_layer * kept_input + per_block if activation_checkpointing else n_layer * per_block
    logit_tokens = min(tokens, loss_chunk) if loss_chunk else tokens
    return MemoryEstimate(
        parameters=weights,
        gradients=weights,
        optimizer=2 * weights,
        activations=float(tokens * per_token),
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


@dataclass(frozen=True)
class ValidationEstimate:
    """Bytes of a validation's peak: what training leaves resident plus its largest forward (module docstring)."""

    resident: float  # parameters, gradients and optimizer state
    activations: float
    logits: float
    batch: int
    seq_len: int
    forward: str  # which of the validation's forwards is the largest
    precision: str

    @property
    def total(self) -> float:
        return self.resident + self.activations + self.logits

    def describe(self) -> str:
        return (
            f"parameters, gradients and optimizer state {self.resident / GB:.2f} GB, then {self.forward} at "
            f"{self.batch} x {self.seq_len} tokens: activations {self.activations / GB:.2f} GB, logits and loss "
            f"{self.logits / GB:.2f} GB; precision {self.precision}"
        )


def validation_forwards(
    val_seq_len: int, block_size: int, eval_contexts: Sequence[int] = ()
) -> list[tuple[str, int, bool]]:
    """(what, tokens per sequence, whether the loss chunk applies) of each forward a validation batch makes."""
    if val_seq_len > block_size:
        plain = [(f"the {val_seq_len}-token validation windows in {block_size}-token chunks", block_size, False)]
    else:
        plain = [("the validation windows", val_seq_len, True)]
    contexts = [(f"the eval context {c}", min(c, val_seq_len), False) for c in eval_contexts]
    return plain + contexts


def estimate_validation(
    n_params: int,
    n_embd: int,
    mlp_hidden: int,
    vocab_rows: int,
    val_batch: int,
    val_seq_len: int,
    block_size: int,
    eval_contexts: Sequence[int] = (),
    precision: str | int | None = "32-true",
    shards: int = 1,
    loss_chunk: int = 0,
    gated: bool = False,
) -> ValidationEstimate:
    """The peak of a validation batch (module docstring): resident state plus its largest forward."""
    width = activation_bytes_per_element(precision)
    resident = 4 * (4.0 * n_params / shards)  # parameters, gradients, AdamW's two moments
    per_token = block_activation_bytes(n_embd, mlp_hidden, precision, gated)  # one block's tensors alive at a time
    estimates = []
    for forward, length, chunked in validation_forwards(val_seq_len, block_size, eval_contexts):
        tokens = val_batch * length
        logit_tokens = min(tokens, loss_chunk) if chunked and loss_chunk else tokens
        estimates.append(
            ValidationEstimate(
                resident=resident,
                activations=float(tokens * per_token),
                logits=float(logit_tokens * vocab_rows * (width + 8)),
                batch=val_batch,
                seq_len=length,
                forward=forward,
                precision=str(precision),
            )
        )
    return max(estimates, key=lambda est: est.total)


def _needs(total: float, processes: int, what: str) -> str:
    each = f" ({processes} processes on this host, {total / GB:.2f} GB each)" if processes > 1 else ""
    return f"at least {total * processes / GB:.1f} GB for {what}{each}"


def refusal(
    est: MemoryEstimate,
    available: float,
    where: str,
    processes: int = 1,
    fits_batch: int | None = None,
    resuming: bool = False,
    fits_in_bf16: bool = False,
    micro_batch: int | None = None,
    accumulate: int = 1,
) -> str:
    """The one-paragraph message of a run whose training step will not fit (`micro_batch`, `accumulate`: the run's
    data.batch_size and trainer.accumulate_grad_batches, so the advice keeps the tokens per optimizer step)."""
    if resuming:  # data.* cannot change on a resume (run_dir.RESUME_POLICY): a smaller micro-batch is a new run
        precision = "--trainer.precision bf16-mixed (a resume may change it), " if fits_in_bf16 else ""
        new_run = f" --data.batch_size {fits_batch}" if fits_batch else " and a smaller --data.batch_size"
        fixes = (
            f"{precision}a device with more memory, or --memory_check warn (the estimate is a lower bound; "
            "lightning_cqk/run/memory_check.py). A resume keeps the micro-batch (data.* cannot change on a resume); "
            "for a "
            f"smaller one start a new run: leave out --ckpt_path and add --on_unfinished new{new_run}"
        )
    else:
        if fits_batch and micro_batch and micro_batch % fits_batch == 0:
            kept = accumulate * micro_batch // fits_batch
            smaller = (
                f"a smaller micro-batch with the same tokens per optimizer step (--data.batch_size {fits_batch} "
                f"--trainer.accumulate_grad_batches {kept})"
            )
        elif fits_batch:
            smaller = f"a smaller micro-batch (--data.batch_size {fits_batch})"
        else:
            smaller = "a smaller micro-batch (--data.batch_size) or --data.seq_len"
        fixes = (
            f"{smaller}, a smaller model, or a device with more memory; or start it anyway with --memory_check warn "
            "(the estimate is a lower bound; lightning_cqk/run/memory_check.py)"
        )
    return (
        f"this configuration needs {_needs(est.total, processes, 'one training step')} ({est.describe()}), but the "
        f"{where} is {available / GB:.1f} GB, so it would run out of memory on its first micro-batch. Use {fixes}."
    )


def validation_refusal(
    est: ValidationEstimate,
    available: float,
    where: str,
    processes: int = 1,
    fits_val_batch: int | None = None,
    fitting_contexts: list[int] | None = None,
    resuming: bool = False,
) -> str:
    """The one-paragraph message of a run whose validation will not fit (every fix named is one that fits)."""
    fixes = []
    if fits_val_batch and not resuming:
        fixes.append(f"--data.val_batch_size {fits_val_batch}")
    if fitting_contexts is not None:  # the contexts that fit, or none of them
        contexts = f"'[{','.join(str(c) for c in fitting_contexts)}]'" if fitting_contexts else "null"
        fixes.append(f"--model.eval_contexts {contexts}")
    fixes.append("--trainer.limit_val_batches 0 (no validation during training)")
    kept = " (a resume keeps data.val_batch_size and data.val_seq_len: data.* cannot change on a resume)"
    return (
        f"this configuration's validation needs {_needs(est.total, processes, 'one validation batch')} "
        f"({est.describe()}), but the {where} is {available / GB:.1f} GB, so the run would train until its first "
        f"validation and run out of memory there. Use {' or '.join(fixes)}{kept if resuming else ''}, a device with "
        "more memory, or --memory_check warn (the estimate is a lower bound; lightning_cqk/run/memory_check.py)."
    )


def largest_fitting_batch(fits: Any, micro_batch: int) -> int | None:
    """The largest power-of-two divisor of `micro_batch` below it for which `fits(batch)` holds, else None."""
    batch = micro_batch // 2
    while batch >= 1:
        if micro_batch % batch == 0 and fits(batch):
            return batch
        batch //= 2
    return None


def check_memory(
    model: Any, datamodule: Any, trainer: Any, mode: str = "refuse", resuming: bool = False
) -> MemoryEstimate | None:
    """Refuse (`refuse`) or warn about (`warn`) a run whose training step or validation exceeds the memory of its
    device (module docstring); `off`: nothing. `resuming`: the run resumes a checkpoint, so the advice names only
    what a resume may change. Returns the training step's estimate (None when there is nothing to estimate)."""
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
    shape = dict(
        n_params=sum(p.numel() for p in model.parameters()),
        n_embd=config.n_embd,
        mlp_hidden=config.mlp_hidden,
        vocab_rows=config.padded_vocab_size,
        precision=trainer.precision,
        shards=shards,
        loss_chunk=int(getattr(model, "loss_chunk", 0) or 0),
        gated=getattr(config, "ffn", "gelu") == "swiglu",
    )
    numbers = dict(
        shape,
        n_layer=config.n_layer,
        seq_len=seq_len,
        activation_checkpointing=bool(getattr(model, "activation_checkpointing", False)),
    )
    est = estimate(micro_batch=micro_batch, **numbers)
    available, where = available_bytes(device)
    problems = []
    if est.total * processes > available:
        fits_batch = largest_fitting_batch(
            lambda b: estimate(micro_batch=b, **numbers).total * processes <= available, micro_batch
        )
        in_bf16 = estimate(micro_batch=micro_batch, **dict(numbers, precision="bf16-mixed")).total * processes
        fits_in_bf16 = activation_bytes_per_element(trainer.precision) == 4 and in_bf16 <= available
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        problems.append(refusal(est, available, where, processes, fits_batch, resuming, fits_in_bf16,
                                micro_batch=micro_batch, accumulate=accumulate))  # fmt: skip
    if _validates(trainer):
        problems += _validation_problems(model, datamodule, config, shape, micro_batch, seq_len, available, where,
                                         processes, resuming)  # fmt: skip
    if not problems:
        return est
    message = " ".join(problems)
    if mode == "refuse":
        raise MemoryRefused(message)
    print(f"lightning_cqk fit: WARNING (--memory_check warn): {message}", file=sys.stderr, flush=True)
    return est


def _validates(trainer: Any) -> bool:
    """Whether the trainer validates during training at all (`limit_val_batches` 0 turns it off)."""
    limit = getattr(trainer, "limit_val_batches", 1.0)
    return limit is None or limit != 0


def _validation_problems(
    model: Any,
    datamodule: Any,
    config: Any,
    shape: dict[str, Any],
    micro_batch: int,
    seq_len: int,
    available: float,
    where: str,
    processes: int,
    resuming: bool,
) -> list[str]:
    """The validation's refusal, when its estimate exceeds `available` (else nothing)."""
    contexts = list(getattr(model, "eval_contexts", None) or [])
    numbers = dict(
        shape,
        val_seq_len=int(getattr(datamodule, "val_seq_len", None) or seq_len),
        block_size=config.block_size,
    )
    val_batch = int(getattr(datamodule, "val_batch_size", None) or micro_batch)

    def fits(batch: int, eval_contexts: Sequence[int]) -> bool:
        need = estimate_validation(val_batch=batch, eval_contexts=eval_contexts, **numbers).total * processes
        return need <= available

    if fits(val_batch, contexts):
        return []
    est = estimate_validation(val_batch=val_batch, eval_contexts=contexts, **numbers)
    fits_val_batch = largest_fitting_batch(lambda b: fits(b, contexts), val_batch)
    fitting = [c for c in contexts if fits(val_batch, [c])] if contexts and fits(val_batch, []) else None
    return [validation_refusal(est, available, where, processes, fits_val_batch, fitting, resuming)]
