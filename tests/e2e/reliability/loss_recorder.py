"""A test helper callback (imported by the `lightning_cqk fit` subprocesses of the resume test): appends every
training step's loss, exactly (`float.hex`), and the step's first token to `<run dir>/losses.jsonl`, one line per step,
flushed at once so that a SIGKILL loses nothing already recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L


class LossRecorder(L.Callback):
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = {
            "step": trainer.global_step,
            "loss": float(outputs["loss"]).hex(),
            "batch": int(batch[:, :8].sum()),
            "pid": os.getpid(),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
