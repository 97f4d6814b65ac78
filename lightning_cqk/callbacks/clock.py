"""TrainingClock: the one place that counts a run's optimizer steps, tokens, FLOPs and training seconds.

`TokenBudget` (wall-clock budgets, `budget.json`), `Throughput` (tokens/s, FLOPs/s, MFU) and `RunSummary` (the
printed rate, `summary.json`) all read this clock, so their numbers agree by construction.

Training time is the wall time from `on_train_start` to `on_train_end`, minus pauses. A pause starts when a
validation starts (during fit, sanity checks included) or when any checkpoint is written (`on_save_checkpoint`,
called as the checkpoint is assembled, for every ModelCheckpoint, RunCheckpoint, NonFiniteGuard or manual save), and
ends when the next training batch starts; the time after the last step (the final validation and save) is a pause
too. So validation and checkpoint time are excluded alike, wherever they happen; so is the fetch of the one batch that
follows each pause (a few milliseconds a pause). Steps, tokens and FLOPs: `trainer.global_step` and the module's
`tokens_seen` / `flops_seen` (LitLM counts every trained batch, all ranks together), minus their values when this fit
started. Resumed runs continue the training seconds of earlier fits (`total_seconds`; checkpoint state).

One clock per trainer: `TrainingClock.of(trainer)` returns the trainer's clock, adding one to the callbacks when there
is none (the readers call it in `setup`). Rates over no time or no step are NaN (`rate`), never a division by zero.
Tests: `tests/e2e/callbacks/test_clock.py`.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L

#: The time source (seconds, monotonic). A module attribute so tests can drive the clock deterministically.
_now = time.perf_counter


def rate(amount: float, seconds: float) -> float:
    """amount / seconds, NaN when there was no amount to measure or no time (never a bogus huge or zero rate)."""
    return amount / seconds if seconds > 0 and amount > 0 else float("nan")


class TrainingClock(L.Callback):
    """Counts optimizer steps, tokens, FLOPs and training seconds (validation and checkpoints excluded)."""

    def __init__(self) -> None:
        self.earlier_seconds = 0.0  # training seconds of earlier fits of this run (restored on resume)
        self.start_step = 0
        self.start_tokens = 0.0
        self.start_flops = 0.0
        self._start: float | None = None
        self._stop: float | None = None
        self._paused = 0.0
        self._pause_since: float | None = None

    @staticmethod
    def of(trainer: L.Trainer) -> TrainingClock:
        """The trainer's clock (added to its callbacks when it has none)."""
        for callback in trainer.callbacks:
            if isinstance(callback, TrainingClock):
                return callback
        clock = TrainingClock()
        trainer.callbacks.append(clock)
        return clock

    # -------------------------------------------------------------------------------------------- hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._stop, self._paused, self._pause_since = _now(), None, 0.0, None
        self.start_step = trainer.global_step
        self.start_tokens, self.start_flops = self.counts(pl_module)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._pause_since is not None:
            self._paused += _now() - self._pause_since
            self._pause_since = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._pause()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._start is not None and self._stop is None:
            self._stop = self._pause_since if self._pause_since is not None else _now()

    def _pause(self) -> None:
        if self._start is not None and self._stop is None and self._pause_since is None:
            self._pause_since = _now()

    # -------------------------------------------------------------------------------------------- reads
    def seconds(self) -> float:
        """Training seconds of this fit so far (frozen once training ended)."""
        if self._start is None:
            return 0.0
        end = self._stop if self._stop is not None else _now()
        open_pause = end - self._pause_since if self._pause_since is not None and self._stop is None else 0.0
        return max(end - self._start - self._paused - open_pause, 0.0)

    def total_seconds(self) -> float:
        """Training seconds of the whole run, earlier fits of a resumed run included."""
        return self.earlier_seconds + self.seconds()

    def steps(self, trainer: L.Trainer) -> int:
        """Optimizer steps trained in this fit."""
        return trainer.global_step - self.start_step if self._start is not None else 0

    @staticmethod
    def counts(pl_module: L.LightningModule) -> tuple[float, float]:
        """(tokens, FLOPs) trained so far by the whole run, from the module's counters (0 when it keeps none)."""
        return float(getattr(pl_module, "tokens_seen", 0) or 0), float(getattr(pl_module, "flops_seen", 0) or 0)

    def tokens(self, pl_module: L.LightningModule) -> float:
        """Tokens trained in this fit."""
        return self.counts(pl_module)[0] - self.start_tokens if self._start is not None else 0.0

    def flops(self, pl_module: L.LightningModule) -> float:
        """Analytic training FLOPs of this fit."""
        return self.counts(pl_module)[1] - self.start_flops if self._start is not None else 0.0

    # ------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self.total_seconds()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.earlier_seconds = float(state_dict.get("train_seconds", 0.0))
