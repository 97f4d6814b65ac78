"""End-of-run summary: what a researcher wants to read when `fit` returns, and `summary.json` for programs.

`summary.json` (run directory; rewritten after every validation of `fit` and when fit ends, atomically):
    last_validation        {"step": k, "val/loss": ..., "val/ppl": ..., "val/bpb": ...}: the last *completed*
                           validation and the optimizer step it scored (null before the first). A run whose
                           `last_validation.step` is below its final step did not finish its last validation.
    nonfinite_validations  the steps whose validation had a NaN or Inf val/ metric (val/loss, or val/ppl overflowing:
                           a diverged model)
    steps, tokens_seen     where the run stands (optimizer steps, tokens trained, whole run)
    fit                    this fit only: {"steps", "tokens", "train_seconds", "tokens_per_sec", "rate_note"}
    train_seconds          training seconds of the whole run (resumes included; validation and checkpoints excluded)
    finished               true once fit has returned (written by `on_fit_end`)
Times and counts come from the run's `TrainingClock` (the same numbers as `budget.json` and `Throughput`). A fit
that trains no step (a resume of a finished run) has no rate: `tokens_per_sec` is NaN and `rate_note` says why.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from lightning_cqk.callbacks.budget import BUDGET_FILE, TokenBudget, budget_record
from lightning_cqk.callbacks.clock import TrainingClock, rate
from lightning_cqk.callbacks.common import run_dir, write_json
from lightning_cqk.callbacks.run_checkpoint import nonfinite_validation_metrics

SUMMARY_FILE = "summary.json"
#: The address that opens TensorBoard on this run's Custom Scalars layout (the loss first; callbacks/tensorboard.py).
CURVES_ADDRESS = "http://localhost:6006/#custom_scalars"


def last_validation_step(run_directory: str) -> int | None:
    """The optimizer step of the last completed validation recorded in a run directory's summary.json (or None)."""
    import json
    from pathlib import Path

    path = Path(run_directory) / SUMMARY_FILE
    if not path.is_file():
        return None
    last = json.loads(path.read_text()).get("last_validation")
    return None if not last else int(last["step"])


class RunSummary(L.Callback):
    """Prints a short summary when fit ends and keeps `summary.json` (module docstring) up to date.

    Also writes `budget.json` (tokens, FLOPs, training seconds, steps; what `TokenBudget(match_to=...)` reads) into
    the run directory when no TokenBudget callback does it.

    Printed: final validation loss / perplexity / bits per byte (and every non-finite validation, by step), tokens
    seen, training tokens per second of this fit, the run directory, the last checkpoint and the TensorBoard command.
    """

    def __init__(self) -> None:
        self.clock: TrainingClock | None = None
        self.last_validation: dict[str, float] | None = None
        self.nonfinite_validations: list[int] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.clock = TrainingClock.of(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self.last_validation = {"step": trainer.global_step, **metrics}
        if nonfinite_validation_metrics(metrics) and trainer.global_step not in self.nonfinite_validations:
            self.nonfinite_validations.append(trainer.global_step)
        self._write(trainer, pl_module, finished=False)

    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The numbers that the printed summary and summary.json show."""
        clock = self.clock or TrainingClock()
        seconds, steps, tokens = clock.seconds(), clock.steps(trainer), clock.tokens(pl_module)
        note = ""
        if steps == 0:
            note = "no optimizer step was trained in this fit (a resume of a run that had already reached its end)"
        elif seconds <= 0:
            note = "no training time was measured"
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        ckpt = trainer.checkpoint_callback
        return {
            **metrics,
            "steps": trainer.global_step,
            "tokens_seen": int(getattr(pl_module, "tokens_seen", 0)),
            "tokens_per_sec": rate(tokens, seconds) if steps else float("nan"),
            "rate_note": note,
            "train_seconds": seconds,
            "run_train_seconds": clock.total_seconds(),
            "fit_steps": steps,
            "fit_tokens": tokens,
            "last_validation": self.last_validation,
            "nonfinite_validations": list(self.nonfinite_validations),
            "log_dir": trainer.log_dir,
            "last_checkpoint": getattr(ckpt, "last_model_path", "") or getattr(ckpt, "best_model_path", ""),
        }

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not any(isinstance(cb, TokenBudget) for cb in trainer.callbacks):  # TokenBudget writes a richer one
            seconds = self.clock.total_seconds() if self.clock is not None else 0.0
            write_json(run_dir(trainer) / BUDGET_FILE, budget_record(trainer, pl_module, seconds))
        self._write(trainer, pl_module, finished=True)
        self._print(trainer, pl_module, self.summary(trainer, pl_module))  # summary() broadcasts: on every rank

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule, finished: bool) -> None:
        s = self.summary(trainer, pl_module)
        fit = {
            "steps": s["fit_steps"],
            "tokens": s["fit_tokens"],
            "train_seconds": s["train_seconds"],
            "tokens_per_sec": _json_number(s["tokens_per_sec"]),
            "rate_note": s["rate_note"],
        }
        last = None if s["last_validation"] is None else {k: _json_number(v) for k, v in s["last_validation"].items()}
        payload = {
            "last_validation": last,
            "nonfinite_validations": s["nonfinite_validations"],
            "steps": s["steps"],
            "tokens_seen": s["tokens_seen"],
            "train_seconds": s["run_train_seconds"],
            "fit": fit,
            "finished": finished,
        }
        write_json(run_dir(trainer) / SUMMARY_FILE, payload)

    @rank_zero_only
    def _print(self, trainer: L.Trainer, pl_module: L.LightningModule, s: dict) -> None:
        lines = ["", "=" * 72, "Run summary"]
        if "val/loss" in s:
            val = f"  val loss {s['val/loss']:.4f} nats/token | ppl {s.get('val/ppl', float('nan')):.2f}"
            if "val/bpb" in s:
                val += f" | bpb {s['val/bpb']:.4f}"
            lines.append(val)
        if s["nonfinite_validations"]:
            steps = ", ".join(str(k) for k in s["nonfinite_validations"])
            lines.append(
                f"  NON-FINITE validation at step(s) {steps}: the model diverged there. Lower the learning rate and "
                "resume from a checkpoint written before it (docs/reliability.md)."
            )
        rate_text = (
            f"{s['tokens_per_sec']:,.0f} tokens/s over {s['train_seconds']:.1f} s of training"
            if math.isfinite(s["tokens_per_sec"])
            else f"no rate: {s['rate_note']}"
        )
        if s["fit_tokens"] != s["tokens_seen"] and math.isfinite(s["tokens_per_sec"]):  # resumed: totals, then rate
            whole = f"{s['run_train_seconds']:.1f} s of training in all"
            rate_text = f"this attempt: {int(s['fit_tokens']):,} tokens, {rate_text}"
            lines.append(f"  steps {s['steps']:,} | tokens seen {s['tokens_seen']:,} in {whole} | {rate_text}")
        else:
            lines.append(f"  steps {s['steps']:,} | tokens seen {s['tokens_seen']:,} | {rate_text}")
        if s["log_dir"]:
            lines.append(f"  logs        {s['log_dir']}")
        if s["last_checkpoint"]:
            lines.append(f"  checkpoint  {s['last_checkpoint']}")
        root = trainer.logger.save_dir if trainer.logger is not None else None
        if root:
            lines.append(f"  curves      tensorboard --logdir {root}   (or: make tensorboard)")
            lines.append(f"              then open {CURVES_ADDRESS}   (loss first)")
        lines.append("=" * 72)
        print("\n".join(lines), flush=True)

    # ---------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"last_validation": self.last_validation, "nonfinite_validations": list(self.nonfinite_validations)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_validation = state_dict.get("last_validation")
        self.nonfinite_validations = [int(k) for k in state_dict.get("nonfinite_validations", [])]


def _json_number(value: Any) -> Any:
    """JSON has no NaN/Inf: non-finite floats are written as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
