"""A test helper callback (imported by `lightning_cqk fit` subprocesses): SIGKILLs its own process at the first
validation batch of optimizer step `at_step`, once (a marker file remembers it), as a crash during that validation."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L


class KillDuringValidation(L.Callback):
    def __init__(self, at_step: int, marker: str) -> None:
        self.at_step, self.marker = at_step, Path(marker)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking or trainer.global_step != self.at_step or self.marker.exists():
            return
        self.marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
