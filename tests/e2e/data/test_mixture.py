"""MixtureDataModule: training windows drawn from each corpus by weight, validation over every corpus's val split,
bytes per token over their union, and each component prepared from its own source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_cqk.data import MixtureDataModule, PrepareSpec
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


def test_each_component_gets_its_own_spec_and_the_shared_settings(tmp_path: Path):
    """Issue 33: the mixture builds one PrepareSpec per component (its source, folder and corpus; the mixture's
    prepare options) and shares its window and batch settings, each component caching in its own folder."""
    dm = MixtureDataModule(
        components=[
            {"corpus": "text", "data_dir": str(tmp_path / "A"), "source": "a.jsonl"},
            {"corpus": "c4", "data_dir": str(tmp_path / "B")},
        ],
        tokenizer="bytes",
        seq_len=15,
        batch_size=4,
        val_fraction=0.2,
        prepare_workers=2,
        max_documents=100,
        cache_dir=str(tmp_path / "cache"),
    )
    shared = dict(tokenizer="bytes", val_fraction=0.2, num_workers=2, max_documents=100)
    assert [part.prepare_spec for part in dm.parts] == [
        PrepareSpec(source="a.jsonl", output_dir=str(tmp_path / "A"), corpus="text", **shared),
        PrepareSpec(source=None, output_dir=str(tmp_path / "B"), corpus="c4", **shared),
    ]
    assert [part.cache_dir for part in dm.parts] == [str(tmp_path / "cache" / "0"), str(tmp_path / "cache" / "1")]
    assert {(p.seq_len, p.batch_size, p.val_batch_size, p.seed) for p in dm.parts} == {(15, 4, 4, 42)}
    assert (dm.vocab_size, dm.eos_id, dm.val_batch_size) == (257, 256, 4)
