"""Per-window validation losses of the final validation, for the sampling error of the validation set.

`val_windows.json` in the run directory: {"step", "nll": [per-window summed NLL, nats], "tokens": [per-window target
tokens]}, from the validation at the run's last step (trainer.max_steps; with `every_validation` every validation
rewrites it). `lightning_cqk report` bootstraps over these windows to print how much of a difference between two
models the validation set itself can create (lightning_cqk/sweep/stats.py, `bootstrap_se_of_mean_loss`).

Cost: one more forward per validation window at the final validation only (each window alone, with the module's own
loss, so the sum over windows equals the logged val/loss x tokens). With several processes each rank scores its
share of the same windows one process scores (`data/val_split.py`: contiguous blocks, in order); the shares are
gathered to rank zero, which writes every window in the one-process order, so the file does not depend on the
number of processes.
"""

from __future__ import annotations

import lightning as L
import torch

from lightning_cqk.callbacks.common import run_dir, write_json

FILE = "val_windows.json"


class ValWindowLosses(L.Callback):
    """Record each validation window's summed NLL at the final validation (or at every one)."""

    def __init__(self, every_validation: bool = False) -> None:
        self.every_validation = every_validation
        self._nll: list[float] = []
        self._tokens: list[float] = []

    def _active(self, trainer: L.Trainer) -> bool:
        if trainer.sanity_checking:
            return False
        return self.every_validation or (trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._nll, self._tokens = [], []

    @torch.no_grad()
    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not self._active(trainer):
            return
        from lightning_cqk.module import sliding_window_nll

        block = pl_module.config.block_size
        for i in range(batch.size(0)):
            window = batch[i : i + 1]  # (1, T + 1)
            if window.size(1) - 1 > block:
                nll, n = sliding_window_nll(pl_module.model, window, block, block)
            else:
                nll, n = pl_module.loss(window, reduction="sum")
            self._nll.append(float(nll))
            self._tokens.append(float(n))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._active(trainer):
            return
        nll, tokens = self._nll, self._tokens
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            shares: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(shares, (nll, tokens))  # rank order = window order
            nll = [x for share_nll, _ in shares for x in share_nll]
            tokens = [x for _, share_tokens in shares for x in share_tokens]
        path = run_dir(trainer) / FILE  # collective: on every rank
        if nll and trainer.is_global_zero:
            write_json(path, {"step": int(trainer.global_step), "nll": nll, "tokens": tokens})
