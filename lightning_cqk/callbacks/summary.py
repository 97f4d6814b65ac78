"""End-of-run summary: what a researcher wants to read when `fit` returns."""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from lightning_cqk.callbacks.budget import BUDGET_FILE, TokenBudget, budget_record
from lightning_cqk.callbacks.common import run_dir, write_json


class RunSummary(L.Callback):
    """Times training (excluding validation) and prints a short summary when fit ends.

    Also writes `budget.json` (tokens, FLOPs, training seconds, steps; what `TokenBudget(match_to=...)` reads) into
    the run directory when no TokenBudget callback does it.

    Printed: final validation loss / perplexity / bits per byte, tokens seen, training tokens per second, the
    run directory, the last checkpoint and the TensorBoard command.
    """

    def __init__(self) -> None:
        self._start = 0.0
        self._val_time = 0.0
        self._val_start = 0.0
        self._tokens_at_start = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        self._val_time = 0.0
        self._tokens_at_start = getattr(pl_module, "tokens_seen", 0)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._start:
            self._val_time += time.perf_counter() - self._val_start

    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, object]:
        """The numbers that the printed summary shows."""
        train_seconds = max(time.perf_counter() - self._start - self._val_time, 1e-9)
        tokens = getattr(pl_module, "tokens_seen", 0)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        ckpt = trainer.checkpoint_callback
        return {
            **metrics,
            "steps": trainer.global_step,
            "tokens_seen": tokens,
            "tokens_per_sec": (tokens - self._tokens_at_start) / train_seconds,
            "train_seconds": train_seconds,
            "log_dir": trainer.log_dir,
            "last_checkpoint": getattr(ckpt, "last_model_path", "") or getattr(ckpt, "best_model_path", ""),
        }

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not any(isinstance(cb, TokenBudget) for cb in trainer.callbacks):  # TokenBudget writes a richer one
            seconds = max(time.perf_counter() - self._start - self._val_time, 0.0) if self._start else 0.0
            write_json(run_dir(trainer) / BUDGET_FILE, budget_record(trainer, pl_module, seconds))
        self._print(trainer, pl_module)

    @rank_zero_only
    def _print(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        s = self.summary(trainer, pl_module)
        lines = ["", "=" * 72, "Run summary"]
        if "val/loss" in s:
            val = f"  val loss {s['val/loss']:.4f} nats/token | ppl {s.get('val/ppl', float('nan')):.2f}"
            if "val/bpb" in s:
                val += f" | bpb {s['val/bpb']:.4f}"
            lines.append(val)
        lines.append(
            f"  steps {s['steps']:,} | tokens seen {s['tokens_seen']:,} | "
            f"{s['tokens_per_sec']:,.0f} tokens/s over {s['train_seconds']:.1f} s of training"
        )
        if s["log_dir"]:
            lines.append(f"  logs        {s['log_dir']}")
        if s["last_checkpoint"]:
            lines.append(f"  checkpoint  {s['last_checkpoint']}")
        root = trainer.logger.save_dir if trainer.logger is not None else None
        if root:
            lines.append(f"  curves      tensorboard --logdir {root}   (or: make tensorboard)")
        lines.append("=" * 72)
        print("\n".join(lines), flush=True)
