"""Callbacks the SLURM tests' runs load (tests/slurm is put on their PYTHONPATH): a run that stops its own array task
once, the way SLURM stops it, at a known step."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import lightning as L


class StopOwnTaskOnce(L.Callback):
    """After optimizer step `at_step` of the first attempt (the marker file says which attempt it is), stop this
    SLURM array task through the controller: `scancel --signal=USR1` (SLURM's warning before a time limit) when
    `signal` is "USR1", a plain `scancel` (SIGTERM, then SIGKILL after KillWait) when it is "cancel". Training then
    waits for the run's own stop to be taken (its RunSession saw the signal), so the stop lands at this step."""

    def __init__(self, at_step: int, marker: str, signal: str = "USR1") -> None:
        self.at_step, self.marker, self.signal = at_step, Path(marker), signal

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step < self.at_step or self.marker.exists():
            return
        self.marker.write_text(str(trainer.global_step))
        task = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        cmd = ["scancel", task] if self.signal == "cancel" else ["scancel", f"--signal={self.signal}", task]
        subprocess.run(cmd, check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(getattr(c, "_stop_wanted", False) for c in trainer.callbacks):
            time.sleep(0.05)
