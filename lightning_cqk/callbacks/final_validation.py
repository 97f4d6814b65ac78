"""`FinalValidation`: a run's last step is always validated, so its summary never shows an older validation as its loss.

Lightning validates every `val_check_interval` training *batches* (micro-batches), counted over the whole run. With
`accumulate_grad_batches` k and data shorter than the run, an epoch ends inside a window of k micro-batches: Lightning
takes the step with fewer micro-batches, and from then on the micro-batch count is no longer k x the step count, so
the validations drift off the steps they were meant for and the run's last step (`max_steps`) was not validated: with
k = 3 and shards of 49 micro-batches, the last validation of a 40-step run was at step 31, and the summary printed it
beside "steps 40" as the run's loss (issue 45 item 9). A run whose `max_steps` is no multiple of its validation
interval ended the same way.

At the optimizer step that ends the run (`trainer.max_steps` reached, or the last batch of the last epoch of a run
limited by `max_epochs`), when Lightning is not about to validate anyway (`validation_due`), this callback sets
`trainer.should_stop`: Lightning's epoch loop validates right after a batch at which a fit stops early, before the
checkpoint callbacks (which Lightning runs after every other callback) save the step, so `last.ckpt` and
`BestCheckpoint` know the final validation. The final validation is the run's final set (`data/val_sets.py`) and
`ValWindowLosses`'s windows. `lightning_cqk fit` adds it to every fit. Tests:
tests/e2e/callbacks/test_final_validation.py.
"""

from __future__ import annotations

from typing import Any

import lightning as L


def validation_due(trainer: L.Trainer) -> bool:
    """Whether the fit loop will validate right after this training batch (Lightning's own decision)."""
    loop = trainer.fit_loop.epoch_loop
    try:
        return bool(loop._should_check_val_fx(getattr(trainer.fit_loop, "_data_fetcher", None)))
    except Exception:  # another loop implementation: nothing is known to be due
        return False


def is_last_step(trainer: L.Trainer) -> bool:
    """Whether the optimizer step just taken ends the fit: `max_steps` reached, or the last epoch's last batch."""
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return True
    epochs = trainer.max_epochs
    if epochs is None or epochs < 0 or trainer.current_epoch + 1 < epochs:
        return False
    return bool(getattr(trainer.fit_loop.epoch_loop.batch_progress, "is_last_batch", False))


class FinalValidation(L.Callback):
    """Validate the run's last step whenever the validation schedule would leave it out (module docstring)."""

    def __init__(self) -> None:
        self._last_step = -1
        self.forced_at: int | None = None  # the step whose validation this callback asked for, if any

    @property
    def state_key(self) -> str:
        return "FinalValidation"  # nothing is saved in checkpoints

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self._last_step:
            return  # accumulating: not an optimizer-step boundary
        self._last_step = trainer.global_step
        if trainer.should_stop or not is_last_step(trainer) or validation_due(trainer):
            return  # a stop validates anyway (Lightning), a step before the last, or Lightning validates now
        if not trainer.limit_val_batches:
            return  # validation is off for this run (without a val dataloader, Lightning's loop skips itself)
        trainer.should_stop = True  # Lightning validates after a batch at which the fit stops early
        self.forced_at = trainer.global_step
