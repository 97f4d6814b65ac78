"""MixtureDataModule: training windows drawn from each corpus by weight, validation over every corpus's val split,
bytes per token over their union, and each component prepared from its own source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_cqk.data import MixtureDataModule
from lightning_cqk.data.datamodule import count_windows


def _corpus(path: Path, letter: str) -> Path:
    with path.open("w") as f:
        for i in range(200):
            f.write(json.dumps({"text": f"{letter * 40} {i}"}) + "\n")
    return path


def test_weighted_training_and_union_validation(tmp_path: Path):
    a, b = _corpus(tmp_path / "a.jsonl", "a"), _corpus(tmp_path / "b.jsonl", "b")
    dm = MixtureDataModule(
        components=[
            {"corpus": "text", "data_dir": str(tmp_path / "A"), "source": str(a), "weight": 3.0},
            {"corpus": "text", "data_dir": str(tmp_path / "B"), "source": str(b), "weight": 1.0},
        ],
        tokenizer="bytes",
        seq_len=15,
        batch_size=8,
        val_fraction=0.2,
    )
    assert dm.bytes_per_token is None, "known only once prepared"
    dm.prepare_data()
    dm.setup("fit")
    windows = [w for batch in dm.train_dataloader() for w in batch.tolist()][:400]
    from_a = sum(ord("a") in w for w in windows) / len(windows)
    assert 0.65 < from_a < 0.85, f"weight 3:1 -> 75% of windows from A, got {from_a:.2f}"
    assert all(not (ord("a") in w and ord("b") in w) for w in windows), "a window comes from one corpus"
    val = [w for batch in dm.val_dataloader() for w in batch.tolist()]
    assert len(val) == sum(count_windows(tmp_path / d / "val", 16) for d in "AB"), "every val window of both"
    assert 0.9 < dm.bytes_per_token < 1.0


def test_bad_weights_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="weights must be positive"):
        MixtureDataModule(components=[{"corpus": "text", "data_dir": str(tmp_path), "weight": 0.0}])
    with pytest.raises(ValueError, match="Unknown corpus"):
        MixtureDataModule(components=[{"corpus": "nope", "data_dir": str(tmp_path)}])
