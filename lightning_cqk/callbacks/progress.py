"""`LineProgress`: training progress as one line per interval, for output that is not a terminal.

A tqdm bar redraws itself with carriage returns; written to a file (a sweep's run log, `> train.log`, SLURM's
output) it becomes one line of tens of kilobytes. `lightning_cqk fit` therefore uses this callback instead of the
default bar when stdout is not a TTY (`use_line_progress`, called by both trainer CLIs); a progress bar configured
explicitly in `trainer.callbacks`, or `trainer.enable_progress_bar: false`, is left as it is. It can also be
configured by hand: `class_path: lightning_cqk.callbacks.progress.LineProgress`.

Each line: `step 200/300 (67%) | 1.38 step/s | elapsed 0:02:25 | eta 0:01:12 | train/loss=5.110 val/loss=5.310`,
every `every_n_steps` optimizer steps (default: `trainer.log_every_n_steps`), plus one after each validation.

In a terminal, Lightning's default tqdm bar is replaced by `LogStepBar`, the same bar refreshed every
`log_every_n_steps` optimizer steps instead of every batch. Both read the latest `train/loss` (one host read) only
when they draw: the module does not log it with `prog_bar=True`, which would make Lightning convert it to a Python
number after every batch (a host sync per micro-batch; docs/speed.md).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import TQDMProgressBar

SHOWN = ("train/loss",)  # logged without prog_bar (no read per batch): added to the bars when they draw


def with_train_loss(metrics: dict, trainer: Any) -> dict:
    """The bar's metrics plus the latest `SHOWN` values (read here, when the bar draws)."""
    latest = trainer.callback_metrics
    return {**metrics, **{k: latest[k] for k in SHOWN if k in latest and k not in metrics}}


class LogStepBar(TQDMProgressBar):
    """Lightning's tqdm bar, refreshed every `log_every_n_steps` optimizer steps (set by `use_line_progress`)."""

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict:
        return with_train_loss(super().get_metrics(trainer, pl_module), trainer)


class LineProgress(ProgressBar):
    """Progress lines instead of a redrawn bar (see module docstring)."""

    def __init__(self, every_n_steps: int | None = None, stream: TextIO | None = None) -> None:
        super().__init__()
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
            raise ValueError(f"LineProgress.every_n_steps must be a positive integer or null, got {every_n_steps!r}.")
        self.every_n_steps = every_n_steps
        self._stream = stream
        self._enabled = True
        self._start: float | None = None
        self._start_step = 0
        self._last_step = -1

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start, self._start_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        every = self.every_n_steps or max(1, int(trainer.log_every_n_steps or 1))
        if step != self._last_step and (step % every == 0 or step == trainer.max_steps):
            self._last_step = step
            self._write(trainer, pl_module)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._write(trainer, pl_module, prefix="validation: ")

    def line(self, trainer: Any, pl_module: Any) -> str:
        """The progress line for the trainer's current state."""
        step, total = trainer.global_step, trainer.max_steps
        parts = [f"step {step}/{total} ({100 * step / total:.0f}%)" if total and total > 0 else f"step {step}"]
        if self._start is not None:
            elapsed = time.monotonic() - self._start
            done = step - self._start_step
            if done > 0 and elapsed > 0:
                rate = done / elapsed
                parts.append(f"{rate:.2f} step/s")
                parts.append(f"elapsed {_clock(elapsed)}")
                if total and total > step:
                    parts.append(f"eta {_clock((total - step) / rate)}")
        metrics = {
            k: v for k, v in with_train_loss(self.get_metrics(trainer, pl_module), trainer).items() if k != "v_num"
        }
        if metrics:
            parts.append(" ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))
        return " | ".join(parts)

    def _write(self, trainer: Any, pl_module: Any, prefix: str = "") -> None:
        if self._enabled and trainer.is_global_zero:
            stream = self._stream or sys.stdout
            print(prefix + self.line(trainer, pl_module), file=stream, flush=True)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _fmt(value: Any) -> str:
    if hasattr(value, "item"):
        value = value.item()
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def use_line_progress(trainer: Any, configured: Any) -> None:
    """Output to a file: Lightning's default progress bar (one redrawn line, tens of KB) becomes `LineProgress`; in
    a terminal it becomes `LogStepBar` (drawn every `log_every_n_steps` optimizer steps).

    Does nothing when the bar is disabled, or when a progress bar is named in `trainer.callbacks` (`configured`:
    their config entries, each with a `class_path`): that is the user's choice.
    """
    bar = trainer.progress_bar_callback
    if bar is None or isinstance(bar, (LineProgress, LogStepBar)):
        return
    entries = configured if isinstance(configured, list) else [configured] if configured else []
    if type(bar).__name__ in {str(getattr(cb, "class_path", "") or "").rsplit(".", 1)[-1] for cb in entries}:
        return
    if sys.stdout.isatty():
        if type(bar) is TQDMProgressBar:  # Lightning's default: the same bar, drawn on log steps only
            every = max(1, int(trainer.log_every_n_steps or 1)) * max(1, int(trainer.accumulate_grad_batches or 1))
            trainer.callbacks[trainer.callbacks.index(bar)] = LogStepBar(refresh_rate=every)
        return
    trainer.callbacks[trainer.callbacks.index(bar)] = LineProgress()
