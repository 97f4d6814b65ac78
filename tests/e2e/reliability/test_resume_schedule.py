"""A resume under a changed schedule length trains every step, the first included, at the new schedule's rate."""

from __future__ import annotations

import lightning as L
import pytest

from lightning_cqk.callbacks import AtomicCheckpointIO, RunCheckpoint
from lightning_cqk.optim import warmup_cosine


class LearningRates(L.Callback):
    """The learning rate each optimizer step trains with, by global step (read before the step is taken)."""

    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx) -> None:
        self.by_step[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


def test_a_resume_that_changes_max_steps_trains_its_first_step_at_the_new_rate(
    make_module, make_trainer, token_loader, tmp_path
):
    """Issue 34 defect 9: the restored optimizer held the rate the 8-step schedule gave step 4; the 12-step one's
    is used from that very step."""
    checkpoints = dict(enable_checkpointing=True, plugins=[AtomicCheckpointIO()])
    make_trainer([RunCheckpoint(every_n_steps=4)], max_steps=8, **checkpoints).fit(make_module(), token_loader())
    rates = LearningRates()
    module = make_module()
    make_trainer([RunCheckpoint(every_n_steps=4), rates], max_steps=12, **checkpoints).fit(
        module, token_loader(), ckpt_path=str(tmp_path / "run" / "checkpoints" / "step=00000004.ckpt")
    )
    optim = module.optim
    expected = {step: optim.lr * warmup_cosine(step, optim.warmup_steps, 12, optim.min_lr_ratio) for step in (4, 5, 11)}
    assert {step: rates.by_step[step] for step in expected} == pytest.approx(expected, rel=1e-12)
