"""TokenDataModule: batch shape and dtype, windows cut from the stream, a fixed val set, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

from lightning_cqk.data import Manifest, PrepareSpec, TokenDataModule, prepare
from lightning_cqk.data.tokenizers import GPT2_BPE_ENV


def test_batches_windows_and_fixed_val(prepared: Path, read_stream, tmp_path: Path):
    dm = TokenDataModule(data_dir=str(tmp_path / "not-yet"), source=None, seq_len=16, batch_size=3)
    assert (dm.vocab_size, dm.eos_id, dm.bytes_per_token) == (257, 256, None), "known before any I/O"

    dm = TokenDataModule(data_dir=str(prepared), source=None, seq_len=16, batch_size=3, shuffle=False)
    dm.prepare_data()  # finished shards: nothing to do, and no source needed
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (3, 17) and batch.dtype == torch.int64
    train = read_stream(prepared / "train").astype(np.int64)
    assert batch.tolist() == [train[i * 17 : (i + 1) * 17].tolist() for i in range(3)], "consecutive windows"

    val_a = [b.tolist() for b in dm.val_dataloader()]
    val_b = [b.tolist() for b in dm.val_dataloader()]
    val = read_stream(prepared / "val")
    assert val_a == val_b and sum(len(b) for b in val_a) == len(val) // 17, "the whole, fixed validation set"
    assert 0.9 < dm.bytes_per_token < 1.0, "bytes tokenizer: every token is a byte except EOS"

    shuffled = TokenDataModule(data_dir=str(prepared), source=None, seq_len=16, batch_size=3, seed=1)
    shuffled.setup("fit")
    first = [b.tolist() for _, b in zip(range(3), shuffled.train_dataloader())]
    assert first != [b.tolist() for _, b in zip(range(3), dm.train_dataloader())], "training windows are shuffled"


def test_the_datamodule_builds_its_prepare_spec(tmp_path: Path):
    """Issue 33: the data.* arguments of what to prepare become one PrepareSpec (data_dir: its output_dir,
    prepare_workers: its num_workers), which prepare_data hands to prepare; the folder and source are read from it."""
    dm = TokenDataModule(
        data_dir=str(tmp_path / "shards"),
        source="corpus.jsonl",
        val_source="val.jsonl",
        documents="line",
        text_field="body",
        prepare_workers=3,
        val_overlap="keep",
    )
    assert dm.prepare_spec == PrepareSpec(
        source="corpus.jsonl",
        output_dir=str(tmp_path / "shards"),
        val_source="val.jsonl",
        documents="line",
        text_field="body",
        num_workers=3,
        val_overlap="keep",
    )
    assert (dm.data_dir, dm.source, dm.corpus) == (str(tmp_path / "shards"), "corpus.jsonl", None)


def test_prepare_data_builds_missing_shards(corpus: Path, tmp_path: Path):
    data_dir = tmp_path / "shards"
    dm = TokenDataModule(data_dir=str(data_dir), source=str(corpus), seq_len=8, batch_size=2, val_fraction=0.25)
    dm.prepare_data()
    dm.setup("fit")
    assert (data_dir / "manifest.json").is_file() and dm.manifest.splits["val"].documents > 0
    with pytest.raises(FileNotFoundError, match=r"No token shards at .*lightning_cqk prepare --source"):
        TokenDataModule(data_dir=str(tmp_path / "nothing"), source=None).prepare_data()


def test_mismatches_and_too_little_data(prepared: Path, tmp_path: Path, monkeypatch):
    with pytest.raises(ValueError, match="made with tokenizer 'bytes'.*data.tokenizer is 'gpt2'.*another data_dir"):
        TokenDataModule(data_dir=str(prepared), source=None, tokenizer="gpt2").setup("fit")
    splits = Manifest.load(prepared).splits
    val_tokens = splits["val"].tokens
    assert splits["train"].tokens > val_tokens + 1, "the train split has a window of this length, val has none"
    with pytest.raises(ValueError, match=rf"val split .* 0 window\(s\) of seq_len \+ 1 = {val_tokens + 1}"):
        TokenDataModule(data_dir=str(prepared), source=None, seq_len=val_tokens, batch_size=1).setup("fit")
    with pytest.raises(ValueError, match=r"train split .* at least 100000 \(batch_size x devices\)"):
        TokenDataModule(data_dir=str(prepared), source=None, seq_len=8, batch_size=100_000).setup("fit")

    tampered = tmp_path / "tampered"
    shutil.copytree(prepared, tampered)
    manifest = json.loads((tampered / "manifest.json").read_text())
    manifest["tokenizer_fingerprint"] = "0" * 64
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="different 'bytes' vocabulary"):
        TokenDataModule(data_dir=str(tampered), source=None, seq_len=8).setup("fit")
    (tampered / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="Corrupt shard manifest.*--overwrite true"):
        TokenDataModule(data_dir=str(tampered), source=None, seq_len=8).setup("fit")


def test_gpt2_shards_train_offline_without_the_vocabulary(
    corpus: Path, gpt2_bpe_dir: Path, tmp_path: Path, monkeypatch
):
    data_dir = tmp_path / "gpt2"
    prepare(
        str(corpus), str(data_dir), tokenizer="gpt2", bpe_file=str(gpt2_bpe_dir / "gpt2.tiktoken"), val_fraction=0.25
    )

    def offline(name):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.delenv(GPT2_BPE_ENV, raising=False)
    dm = TokenDataModule(data_dir=str(data_dir), source=None, tokenizer="gpt2", seq_len=4, batch_size=2)
    dm.setup("fit")  # no vocabulary file and no network: the fingerprint check is skipped, names still match
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (2, 5) and batch.dtype == torch.int64 and int(batch.max()) < 50257
    assert dm.vocab_size == 50257 and dm.eos_id == 50256
