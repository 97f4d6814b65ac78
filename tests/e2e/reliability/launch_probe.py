"""A callback for tests/e2e/reliability/test_launchers.py, loaded by the `fit` subprocesses (PYTHONPATH holds this
folder).

Every rank records the step it starts from, its validation metrics and, at the end of training, its weights. With
`stop_at`, rank zero touches `<out>/stop-requested` at that step and waits there until the test's stop signal has
reached it (so the signal arrives at a known step however slow the machine), then training goes on to the agreed
stop.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning as L
import torch


class LaunchProbe(L.Callback):
    def __init__(self, out: str, stop_at: int | None = None) -> None:
        self.out = Path(out)
        self.stop_at = stop_at

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        record = {"rank": trainer.global_rank, "world": trainer.world_size, "step": trainer.global_step}
        record["log_dir"] = str(trainer.log_dir)
        (self.out / f"start-{os.getpid()}.json").write_text(json.dumps(record))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.stop_at is None or trainer.global_step != self.stop_at or not trainer.is_global_zero:
            return
        (self.out / "stop-requested").touch()
        session = next(cb for cb in trainer.callbacks if type(cb).__name__ == "RunSession")
        deadline = time.monotonic() + 120
        while not session._stop_wanted and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop_at = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        (self.out / f"val-rank{trainer.global_rank}.json").write_text(json.dumps(metrics))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(
            {"step": trainer.global_step, "weights": weights}, self.out / f"weights-rank{trainer.global_rank}.pt"
        )
