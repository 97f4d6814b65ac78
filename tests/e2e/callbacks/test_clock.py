"""One clock (TrainingClock) for TokenBudget, Throughput and RunSummary: on a simulated clock where every training
step takes 2 s, every validation batch 50 s and every checkpoint write 30 s, all three report exactly the training
time (validation and checkpoints excluded alike), the same tokens per second, and a wall-clock budget stops on it."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

import lightning_cqk.callbacks.clock as clock_module
from lightning_cqk.callbacks import (
    AtomicCheckpointIO,
    RunCheckpoint,
    RunSummary,
    Throughput,
    TokenBudget,
    TrainingClock,
)

STEP_S, VAL_BATCH_S, SAVE_S = 2.0, 50.0, 30.0
TOKENS_PER_STEP = 4 * 16


@pytest.fixture
def now(monkeypatch) -> dict[str, float]:
    """The simulated time the clock reads."""
    time = {"t": 0.0}
    monkeypatch.setattr(clock_module, "_now", lambda: time["t"])
    return time


class Simulated(L.Callback):
    def __init__(self, now: dict[str, float]) -> None:
        self.now = now

    def on_train_batch_end(self, *args) -> None:
        self.now["t"] += STEP_S

    def on_validation_batch_end(self, *args) -> None:
        self.now["t"] += VAL_BATCH_S


class SlowIO(AtomicCheckpointIO):
    """Writing a checkpoint takes SAVE_S simulated seconds (after every callback's on_save_checkpoint)."""

    def __init__(self, now: dict[str, float]) -> None:
        super().__init__()
        self.now = now

    def save_checkpoint(self, *args, **kwargs) -> None:
        self.now["t"] += SAVE_S
        super().save_checkpoint(*args, **kwargs)


def fit(make_module, make_trainer, token_loader, now, budget: TokenBudget, max_steps: int = 6):
    callbacks = [
        Simulated(now), budget, Throughput(warmup_steps=0, every_n_steps=5), RunSummary(),
        RunCheckpoint(every_n_steps=2, keep_last=None),
    ]  # fmt: skip
    trainer, logger = make_trainer(
        callbacks, max_steps=max_steps, enable_checkpointing=True, plugins=[SlowIO(now)], val_check_interval=3,
        limit_val_batches=2, check_val_every_n_epoch=None, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(make_module(), token_loader(), token_loader(2))
    return trainer, logger


def test_budget_throughput_and_summary_read_one_clock(make_module, make_trainer, token_loader, now, tmp_path: Path):
    budget = TokenBudget(batch_size=4, seq_len=16)
    trainer, logger = fit(make_module, make_trainer, token_loader, now, budget)
    (clock,) = [c for c in trainer.callbacks if isinstance(c, TrainingClock)]
    assert now["t"] > 6 * STEP_S + 2 * 2 * VAL_BATCH_S, "validation and checkpoints did take (simulated) time"
    train_seconds = 6 * STEP_S
    run = tmp_path / "run"
    recorded = json.loads((run / "budget.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert clock.total_seconds() == budget.elapsed() == recorded["wallclock"] == train_seconds
    assert summary["train_seconds"] == summary["fit"]["train_seconds"] == train_seconds
    assert summary["fit"]["tokens_per_sec"] == 6 * TOKENS_PER_STEP / train_seconds
    # Throughput's window (steps 2..5, a validation and two saves inside it) gives the same rate.
    (throughput,) = [c for c in trainer.callbacks if isinstance(c, Throughput)]
    assert throughput.latest["train/tokens_per_sec"] == TOKENS_PER_STEP / STEP_S == summary["fit"]["tokens_per_sec"]
    assert logger.series("train/wallclock")[4] == 5 * STEP_S  # logged at the 5th step, before its save
    # The run's training seconds travel in the checkpoint (a resumed run continues them).
    state = torch.load(Path(trainer.checkpoint_callback.dirpath) / "last.ckpt", weights_only=True)["callbacks"]
    assert state["TrainingClock"]["train_seconds"] == train_seconds


def test_a_wallclock_budget_stops_on_training_time(make_module, make_trainer, token_loader, now):
    trainer, _ = fit(
        make_module, make_trainer, token_loader, now, TokenBudget(wallclock=7.0, batch_size=4, seq_len=16), max_steps=20
    )
    assert trainer.global_step == 4, "4 steps x 2 s: validation and checkpoint time did not count"
