"""A callback for tests/gpu/test_gpu_suite.py: CUDA sync debug mode "error" over optimizer steps 2..6 of a CLI run,
except inside the one documented host read per optimizer step (`StepReads.read`, callbacks/step_reads.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import lightning as L
import torch

from lightning_cqk.callbacks.step_reads import StepReads


class SyncErrorSteps(L.Callback):
    """Turn sync debug mode "error" on from the start of batch `first` to the end of batch `last` (a warm-up batch
    first: allocator and compile set-up may sync once), and off again afterwards. `StepReads.read`, the step's one
    sanctioned read, runs with the mode back at "default" and is counted per optimizer step (`reads`): any other
    synchronisation in the window raises. `set_mode` is CUDA's setter; a CPU test passes a recorder."""

    def __init__(self, first: int = 1, last: int = 5, set_mode: Callable[[str], None] | None = None) -> None:
        self.first, self.last = first, last
        self.set_mode = set_mode or torch.cuda.set_sync_debug_mode
        self.checked = 0
        self.reads: Counter[int] = Counter()  # optimizer step -> host reads made inside the window
        self._inside = False
        self._original_read = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        probe, original = self, StepReads.read
        self._original_read = original

        def sanctioned_read(step_reads: StepReads) -> dict[str, float]:
            if not probe._inside or not step_reads._pending:
                return original(step_reads)
            probe.set_mode("default")
            try:
                return original(step_reads)
            finally:
                probe.reads[step_reads.step] += 1
                probe.set_mode("error")

        StepReads.read = sanctioned_read

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._original_read is not None:
            StepReads.read = self._original_read
            self._original_read = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first <= batch_idx <= self.last:
            self._inside = True
            self.set_mode("error")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.first <= batch_idx <= self.last:
            self.set_mode("default")
            self._inside = False
            self.checked += 1

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.set_mode("default")
        self.teardown(trainer, pl_module, "fit")
