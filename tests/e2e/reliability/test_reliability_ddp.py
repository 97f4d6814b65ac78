"""Two CPU processes (DDP, gloo): a NaN on one rank is skipped on every rank (the replicas stay identical and
finite), and RunCheckpoint's periodic files, retention and hard-linked last.ckpt work with a rank-zero writer."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader

from lightning_cqk.callbacks import AtomicCheckpointIO, NonFiniteGuard, RunCheckpoint
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

pytestmark = pytest.mark.slow
BAD_STEP = 4


class NaNOnRankOne(LitLM):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        bad = self.trainer.global_step == BAD_STEP and self.global_rank == 1
        return loss * float("nan") if bad else loss


class Report(L.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        guard = next(c for c in trainer.callbacks if isinstance(c, NonFiniteGuard))
        report = {
            "bad_steps": [r["step"] for r in guard.records],
            "finite": all(bool(torch.isfinite(p).all()) for p in pl_module.parameters()),
            "checksum": sum(p.double().sum().item() for p in pl_module.parameters()),
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def test_nonfinite_skip_and_checkpoints_under_ddp(tmp_path: Path):
    L.seed_everything(0, verbose=False)
    config = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)
    module = NaNOnRankOne(config, OptimConfig(lr=1e-2, warmup_steps=2))
    data = DataLoader(torch.randint(0, 64, (64, 17)), batch_size=4)
    trainer = tiny_trainer(
        strategy="ddp_spawn",
        devices=2,
        max_steps=8,
        default_root_dir=tmp_path,
        plugins=[AtomicCheckpointIO()],
        callbacks=[NonFiniteGuard(), RunCheckpoint(every_n_steps=3, keep_last=1), Report(str(tmp_path))],
    )
    trainer.fit(module, data)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["bad_steps"] for r in reports] == [[BAD_STEP], [BAD_STEP]], "both ranks saw it and skipped"
    assert all(r["finite"] for r in reports)
    assert reports[0]["checksum"] == reports[1]["checksum"], "the replicas stayed identical"
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step=00000006.ckpt"], "keep_last=1"
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 8, "final state at train end"
