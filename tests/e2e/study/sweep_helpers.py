"""Helpers that the sweep tests' subprocess runs import (tests/e2e/study is put on their PYTHONPATH)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L


class KillSweepOnce(L.Callback):
    """SIGKILL the whole process group (the sweep runner and its runs) once, after optimizer step `at_step`.

    The marker file makes the kill happen only in the first attempt, so the resumed run can finish: a deterministic
    stand-in for a sweep killed by the user, the OOM killer or a cluster preemption.
    """

    def __init__(self, at_step: int, marker: str) -> None:
        self.at_step, self.marker = at_step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.at_step and not self.marker.exists():
            self.marker.write_text(str(trainer.global_step))
            os.killpg(os.getpgrp(), signal.SIGKILL)
