"""GlueClassifier: pooling by hand, padding invariance, and a head that learns a trivially separable task."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from downstream_helpers import write_glue_folder
from tiny_run import tiny_trainer

from lightning_cqk.downstream.classifier import GlueClassifier, pool
from lightning_cqk.downstream.glue_data import GlueDataModule, collate, encode_example
from lightning_cqk.downstream.glue_tasks import Example


def test_pooling_by_hand():
    hidden = torch.arange(12.0).view(2, 3, 2)  # (B=2, T=3, C=2)
    lengths = torch.tensor([2, 3])
    assert pool(hidden, lengths, "last").tolist() == [[2.0, 3.0], [10.0, 11.0]]
    assert pool(hidden, lengths, "mean").tolist() == [[1.0, 2.0], [8.0, 9.0]]
    with pytest.raises(ValueError, match="pooling"):
        pool(hidden, lengths, "max")


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("fixture", ["lm_checkpoint", "coupled_checkpoint"])
def test_padding_does_not_change_an_example(pooling: str, fixture: str, request: pytest.FixtureRequest):
    model = GlueClassifier(str(request.getfixturevalue(fixture)), task="mnli", pooling=pooling).eval()
    items = [(encode_example(model.tokenizer, Example(t, "h", 0), 64)[0], 0) for t in ("short", "a much longer text")]
    alone = model(**{k: v for k, v in collate(items[:1]).items() if k != "labels"})
    batch = collate(items)  # the first example is right-padded here
    together = model(batch["input_ids"], batch["lengths"])
    assert together.shape == (2, 3)
    torch.testing.assert_close(together[:1], alone, rtol=1e-5, atol=1e-6)


def test_regression_head_uses_mse(lm_checkpoint: Path):
    model = GlueClassifier(str(lm_checkpoint), task="stsb")
    assert model.head.out_features == 1
    logits, labels = torch.tensor([[1.0], [3.0]]), torch.tensor([2.0, 5.0])
    assert float(model.loss(logits, labels)) == pytest.approx((1 + 4) / 2)


def test_head_learns_a_trivially_separable_task(lm_checkpoint: Path, tmp_path: Path):
    glue = write_glue_folder(tmp_path / "glue", n_train=256, n_dev=64)
    L.seed_everything(0)
    model = GlueClassifier(str(lm_checkpoint), task="sst2", lr=2e-3, warmup_steps=5, head_dropout=0.0)
    data = GlueDataModule("sst2", data_dir=str(glue), batch_size=16)
    trainer = tiny_trainer(max_steps=60, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(model, datamodule=data)
    trainer.limit_val_batches = 1.0
    trainer.validate(model, datamodule=data, verbose=False)
    assert model.final_metrics["acc"] >= 0.95, model.final_metrics
    assert model.final_metrics["score"] == model.final_metrics["acc"]
