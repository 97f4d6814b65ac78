"""Per-window validation losses of the final validation, for the sampling error of the validation set.

`val_windows.json` in the run directory: {"step", "nll": [per-window summed NLL, nats], "tokens": [per-window target
tokens]}, from the validation at the run's last step (trainer.max_steps; with `every_validation` every validation
rewrites it). With `data.final_val_windows` that validation scores the final set (`data/val_sets.py`), so the file
holds the final set's windows. `lightning_cqk report` bootstraps over these windows to print how much of a
difference between two models the validation set itself can create (lightning_cqk/study/judge/stats.py,
`bootstrap_se_of_mean_loss`).

Cost: one cross-entropy per batch: `LitLM` returns each window's summed NLL from the batched forward it scores the
validation with (`window_nll_wanted`), so the sum over windows equals the logged val/loss x tokens up to the order of
float summation. Where the module gives none (long windows scored in chunks, `loss_chunk`, another LightningModule),
each window is scored alone: one more forward per window at the final validation. With several processes each rank
scores its share of the same windows one process scores (`data/val_split.py`: contiguous blocks, in order); the
shares are gathered to rank zero, which writes every window in the one-process order, so the file does not depend on
the number of processes.
"""

from __future__ import annotations

import lightning as L
import torch

from lightning_cqk.callbacks.common import run_dir, write_json
from lightning_cqk.data.val_sets import is_final_validation

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
        return self.every_validation or is_final_validation(trainer)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._nll, self._tokens = [], []
        if hasattr(pl_module, "window_nll_wanted"):  # LitLM: per-window NLL from its own batched forward
            pl_module.window_nll_wanted = self._active(trainer)

    @torch.no_grad()
    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not self._active(trainer):
            return
        if isinstance(outputs, dict) and "window_nll" in outputs:
            self._nll.extend(float(x) for x in outputs["window_nll"])
            self._tokens.extend([float(batch.size(1) - 1)] * batch.size(0))
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
        if hasattr(pl_module, "window_nll_wanted"):
            pl_module.window_nll_wanted = False
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
