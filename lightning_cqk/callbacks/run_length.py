"""`RunLengthCheck`: a run that would train for days on the machine at hand says so early, with what to do instead.

The card's `lightning_cqk fit --config configs/pubmed.yaml` is a GPU job; started on a laptop it sat at step 0 of
9,155 with no word of how long it would take. `lightning_cqk fit` adds this callback to every fit: it times the
second training micro-batch (the first pays for allocation and warm-up), once, and estimates the training time
left as seconds per micro-batch x `accumulate_grad_batches` x optimizer steps left. When that exceeds
`limit_hours` (default 24; `LIGHTNING_CQK_LONG_RUN_HOURS`, 0 turns the check off) it prints one paragraph: the
estimate with its parts, and the commands the CLI passes in (`advice`: the GPU/cluster launch and the CPU-size
recipe of the same command). Training goes on: the estimate informs, it does not refuse.

Validation, checkpoints and data preparation come on top of the estimate, so it is a lower bound. On CUDA the
measured micro-batch is bracketed by two device synchronisations (once per run). Runs whose length is not a number
of steps (`max_steps` -1 with epochs only) are not estimated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_cqk.environment import VARIABLES, env_number
from lightning_cqk.errors import ConfigError
from lightning_cqk.run.directory import command_line

LIMIT_ENV = "LIGHTNING_CQK_LONG_RUN_HOURS"
DEFAULT_LIMIT_HOURS = float(VARIABLES[LIMIT_ENV].default)
TIMED_MICRO_BATCH = 1  # the second micro-batch of this fit (0-based)


def limit_hours_from_env() -> float:
    """`LIGHTNING_CQK_LONG_RUN_HOURS` as hours (default 24; 0 or less: no check; not finite or not a number:
    refused, `environment.env_number`)."""
    return env_number(LIMIT_ENV)


def describe_duration(seconds: float) -> str:
    """'6.3 days', '31 hours', '45 minutes'."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    return f"{seconds / 60:.0f} minutes"


class RunLengthCheck(L.Callback):
    """Time one micro-batch and warn when the training left would exceed `limit_hours` (module docstring).

    Args:
        limit_hours: the training time above which the run says so; 0 or less turns the check off.
        advice: called with no argument when the warning is printed; returns the sentences that say what to do
            instead (the CLI's GPU and CPU-size commands). None: the estimate alone.
    """

    def __init__(self, limit_hours: float = DEFAULT_LIMIT_HOURS, advice: Callable[[], str] | None = None) -> None:
        if not math.isfinite(limit_hours):
            raise ConfigError(
                f"RunLengthCheck(limit_hours={limit_hours}): give a finite number of hours (0 turns it off)."
            )
        self.limit_hours = limit_hours
        self.advice = advice
        self._batches = 0
        self._started: float | None = None
        self.estimate_seconds: float | None = None  # the training time left, once measured

    @property
    def state_key(self) -> str:
        return "RunLengthCheck"  # nothing is saved in checkpoints

    def _sync(self, trainer: L.Trainer) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.limit_hours > 0 and self._batches == TIMED_MICRO_BATCH and self.estimate_seconds is None:
            self._sync(trainer)
            self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._batches += 1
        if self._started is None:
            return
        self._sync(trainer)
        per_micro_batch = time.perf_counter() - self._started
        self._started = None
        steps_left = trainer.max_steps - trainer.global_step if trainer.max_steps and trainer.max_steps > 0 else None
        if steps_left is None or steps_left <= 0:
            return
        accumulate = int(trainer.accumulate_grad_batches or 1)
        self.estimate_seconds = per_micro_batch * accumulate * steps_left
        if self.estimate_seconds <= self.limit_hours * 3600:
            return
        device = trainer.strategy.root_device
        where = "CPU" if device.type == "cpu" else str(device)
        steps = "steps" if accumulate == 1 else f"steps of {accumulate} micro-batches"
        message = (
            f"run: at this pace the training left takes about {describe_duration(self.estimate_seconds)} on this "
            f"machine ({where}: {per_micro_batch:.2f} s per micro-batch, {steps_left:,} optimizer {steps} left; "
            "validation and checkpoints come on top)."
        )
        if self.advice is not None:
            message += " " + self.advice()
        message += f" (This note appears above {self.limit_hours:g} hours of training: {LIMIT_ENV}.)"
        rank_zero_info(message)


#: The shape, data and length flags that shrink a recipe to a CPU (docs/configs-and-data.md, "A paper config at CPU
#: size"); every other setting of the recipe stays. `--data.data_dir` is added per run (the bytes shards' folder).
CPU_SIZE = {
    "--model.config.n_layer": "2",
    "--model.config.n_embd": "64",
    "--model.config.n_head": "4",
    "--model.config.mlp_hidden": "256",
    "--data.tokenizer": "bytes",
    "--data.seq_len": "128",
    "--data.batch_size": "8",
    "--budget.tokens": "null",
    "--trainer.max_steps": "200",
    "--model.optim.warmup_steps": "20",
    "--trainer.accumulate_grad_batches": "1",
    "--trainer.val_check_interval": "100",
    "--trainer.limit_val_batches": "8",
    "--trainer.accelerator": "cpu",
}


def long_run_advice(argv: list[str], data: Any) -> str:
    """What a run that would train for days here can do instead: the same command on GPUs, or at CPU size (`argv`:
    the fit's command line; `data`: its `data` settings, for the bytes shards' folder)."""
    init = data.get("init_args", data) if hasattr(data, "get") else {}
    corpus = init.get("corpus") if hasattr(init, "get") else None
    stem = str(corpus) if corpus else Path(str(init.get("data_dir") or "data")).name.split("-")[0] or "data"
    gpu_flags = ("--trainer.devices", "--trainer.strategy", "--trainer.accelerator", "--ckpt_path")
    gpu = command_line(argv, drop=gpu_flags, add=("--trainer.devices", "8", "--trainer.strategy", "ddp"))
    cpu_size = dict(CPU_SIZE, **{"--data.data_dir": f"data/{stem}-bytes-cpu"})
    cpu = command_line(argv, drop=(*cpu_size, "--ckpt_path"), add=tuple(x for kv in cpu_size.items() for x in kv))
    return (
        "Ctrl-C stops it (saved at the end of the step in progress). On a node with 8 GPUs (docs/scaling-out.md "
        f"for SLURM and several nodes): torchrun --standalone --nproc_per_node 8 -m {gpu}. At CPU size, the same "
        "recipe with a small shape, bytes and 200 steps (docs/configs-and-data.md#a-paper-config-at-cpu-size): "
        f"{cpu}."
    )
