"""A test helper callback (imported by `lightning_cqk fit` subprocesses): sends a signal to its own process group at
the start of training micro-batch `at_batch` (counted from 0 over the whole run), as Ctrl-C in a terminal or `kill --
-PGID` would at that moment. Deterministic where a timed signal is not: the micro-batch is chosen, not the clock."""

from __future__ import annotations

import os
import signal

import lightning as L


class SignalAtBatch(L.Callback):
    def __init__(self, at_batch: int, signal_name: str = "SIGINT") -> None:
        self.at_batch, self.signal_name = at_batch, signal_name
        self.sent = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        progress = trainer.fit_loop.epoch_loop.batch_progress.total.ready  # this micro-batch counted (1-based)
        if not self.sent and progress - 1 == self.at_batch:
            self.sent = True
            os.killpg(os.getpgid(0), getattr(signal, self.signal_name))
