"""Run by ``test_ddp.py`` as a script: 2-process DDP (gloo, CPU) over a TokenDataModule; every rank writes the
windows it trained on, per epoch, to ``<out>/rank<r>-epoch<e>.json``. Not a test module (no ``test_`` prefix)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from tiny_run import tiny_trainer

from lightning_cqk.data import TokenDataModule


class Recorder(L.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[list[int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.extend(batch.tolist())
        return (self.w - batch.float().mean()) ** 2

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", (self.w - batch.float().mean()) ** 2, sync_dist=True)

    def on_train_epoch_end(self) -> None:
        path = self.out / f"rank{self.global_rank}-epoch{self.current_epoch}.json"
        path.write_text(json.dumps({"windows": self.seen, "world_size": self.trainer.world_size}))
        self.seen = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main(data_dir: str, out: str, num_workers: int) -> None:
    torch.set_num_threads(1)
    dm = TokenDataModule(data_dir=data_dir, source=None, seq_len=16, batch_size=4, num_workers=num_workers)
    trainer = tiny_trainer(devices=2, strategy="ddp", max_epochs=2, enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(Recorder(Path(out)), datamodule=dm)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
