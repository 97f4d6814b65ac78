"""A callback for tests/gpu/test_gpu_suite.py: CUDA sync debug mode "error" over optimizer steps 2..6 of a CLI run."""

from __future__ import annotations

import lightning as L
import torch


class SyncErrorSteps(L.Callback):
    """Turn `torch.cuda.set_sync_debug_mode("error")` on from the start of batch `first` to the end of batch `last`
    (a warm-up batch first: allocator and compile set-up may sync once), and off again afterwards."""

    def __init__(self, first: int = 1, last: int = 5) -> None:
        self.first, self.last = first, last
        self.checked = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first <= batch_idx <= self.last:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.first <= batch_idx <= self.last:
            torch.cuda.set_sync_debug_mode("default")
            self.checked += 1

    def on_exception(self, trainer, pl_module, exception) -> None:
        torch.cuda.set_sync_debug_mode("default")
