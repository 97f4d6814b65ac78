"""Every registered attention backend trains through the Lightning Trainer: the loss falls on the quickstart data."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from tiny_run import tiny_trainer

from lightning_cqk import attention
from lightning_cqk.data import TokenDataModule
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

STEPS = 40


class LossRecorder(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


@pytest.fixture(scope="module")
def quickstart_shards(tmp_path_factory) -> str:
    """The quickstart's built-in corpus, prepared once for this module."""
    path = str(tmp_path_factory.mktemp("python_docs") / "bytes")
    TokenDataModule(data_dir=path, source="builtin:python_docs").prepare_data()
    return path


@pytest.mark.parametrize("name", attention.available())
def test_loss_falls(name: str, quickstart_shards: str):
    L.seed_everything(0)
    data = TokenDataModule(data_dir=quickstart_shards, source=None, seq_len=64, batch_size=8)
    config = ModelConfig(vocab_size=data.vocab_size, n_layer=2, n_embd=64, n_head=4, block_size=64, attention=name)
    module = LitLM(config, OptimConfig(lr=3e-3, warmup_steps=5))
    recorder = LossRecorder()
    trainer = tiny_trainer(max_steps=STEPS, enable_checkpointing=False, limit_val_batches=0, callbacks=[recorder])
    trainer.fit(module, datamodule=data)
    losses = recorder.losses
    assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses)))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, f"{name}: loss {first:.3f} -> {last:.3f}"
