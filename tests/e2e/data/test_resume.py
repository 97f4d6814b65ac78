"""Exact loader resume: a run stopped mid-epoch and resumed from its checkpoint trains on exactly the token
windows, in the same order, that the uninterrupted run trained on (across the epoch boundary too), with 0 and 2
loader workers. Lightning checkpoints the ``StreamingDataLoader`` state; nothing here hand-writes it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from litdata import StreamingDataset, TokensLoader
from tiny_run import tiny_trainer

from lightning_cqk.data import TokenDataModule


class Recorder(L.LightningModule):
    """A one-parameter model that keeps every training batch it sees (as token lists)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[list[list[int]]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.tolist())
        return (self.w - batch.float().mean()) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _fit(data_dir: Path, root: Path, max_steps: int, num_workers: int, ckpt_path: str | None = None, **kw):
    dm = TokenDataModule(data_dir=str(data_dir), source=None, seq_len=16, batch_size=4, num_workers=num_workers)
    model = Recorder()
    trainer = tiny_trainer(default_root_dir=str(root), max_steps=max_steps, limit_val_batches=0, **kw)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model.seen, trainer


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_sees_exactly_the_uninterrupted_batches(prepared: Path, tmp_path: Path, num_workers: int):
    full, trainer = _fit(prepared, tmp_path / "full", max_steps=1, num_workers=num_workers)
    per_epoch = trainer.num_training_batches
    assert 3 <= per_epoch < 100, "the fixture corpus gives a few batches per epoch"
    stop, total = per_epoch // 2 + 1, per_epoch + per_epoch // 2 + 2  # stop mid-epoch 0, end mid-epoch 1
    full, _ = _fit(prepared, tmp_path / "full", max_steps=total, num_workers=num_workers)

    ckpt_dir = tmp_path / "ckpt"
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=stop, save_top_k=-1)
    head, _ = _fit(prepared, tmp_path / "a", max_steps=stop, num_workers=num_workers, callbacks=[checkpoint])
    (ckpt,) = ckpt_dir.glob("*.ckpt")
    tail, _ = _fit(prepared, tmp_path / "b", max_steps=total, num_workers=num_workers, ckpt_path=str(ckpt))

    assert len(full) == total and len(head) == stop and len(tail) == total - stop
    assert head == full[:stop]
    assert tail == full[stop:], "the resumed run continues with the uninterrupted run's batches"
    epoch0 = Counter(tuple(w) for batch in full[:per_epoch] for w in batch)
    ordered = StreamingDataset(str(prepared / "train"), item_loader=TokensLoader(block_size=17), shuffle=False)
    every = Counter(tuple(int(t) for t in w) for w in ordered)
    assert epoch0 <= every and every.total() - epoch0.total() < 4, "one epoch: each window once (last batch dropped)"
