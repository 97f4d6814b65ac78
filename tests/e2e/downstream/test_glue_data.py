"""Tokenising GLUE examples for a causal LM: separator, EOS, longest-first truncation, padding, the DataModule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_cqk.data.tokenizers import get_tokenizer
from lightning_cqk.downstream.glue_data import GlueDataModule, collate, encode_example, truncate_pair
from lightning_cqk.downstream.glue_tasks import Example

BYTES = get_tokenizer("bytes")
EOS = BYTES.eos_id


def test_truncate_pair_longest_first():
    assert truncate_pair(3, 2, 10) == (3, 2)  # fits
    assert truncate_pair(10, 3, 8) == (5, 3)  # only the longer one loses tokens
    assert truncate_pair(3, 10, 8) == (3, 5)
    assert truncate_pair(10, 10, 8) == (4, 4)  # equal lengths end equal
    assert truncate_pair(10, 10, 9) == (5, 4)


def test_encode_sentence_and_pair():
    assert encode_example(BYTES, Example("ab", None, 1), 16) == ([97, 98, EOS], False)
    assert encode_example(BYTES, Example("ab", "cd", 1), 16) == ([97, 98, EOS, 99, 100, EOS], False)
    assert encode_example(BYTES, Example("ab", "cd", 1), 16, separator="\n", append_eos=False) == (
        [97, 98, 10, 99, 100],
        False,
    )
    # 6 tokens: budget 4 for the texts; "abcdef" is cut, "xy" kept; separator and EOS survive
    assert encode_example(BYTES, Example("abcdef", "xy", 0), 6) == ([97, 98, EOS, 120, 121, EOS], True)
    assert encode_example(BYTES, Example("abcdef", None, 0), 4) == ([97, 98, 99, EOS], True)
    with pytest.raises(ValueError, match="no room"):
        encode_example(BYTES, Example("a", "b", 0), 3)


def test_collate_right_pads():
    batch = collate([([1, 2, 3], 1), ([4], 0)])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["lengths"].tolist() == [3, 1] and batch["labels"].dtype == torch.int64
    assert collate([([1], 2.5)])["labels"].dtype == torch.float32


def test_datamodule_batches(glue_dir: Path):
    dm = GlueDataModule("mnli", data_dir=str(glue_dir), tokenizer="bytes", max_length=24, batch_size=8)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 8 and batch["input_ids"].shape[1] <= 24
    assert (batch["input_ids"][torch.arange(8), batch["lengths"] - 1] == EOS).all()  # closing EOS kept
    assert len(dm.val_dataloader()) == 2  # matched, mismatched
    assert dm.truncated > 0 and "truncated" in dm.summary()
    stsb = GlueDataModule("stsb", data_dir=str(glue_dir), tokenizer="bytes", max_length=64)
    stsb.setup("fit")
    assert next(iter(stsb.val_dataloader()[0]))["labels"].dtype == torch.float32


def test_train_subset_is_fixed_by_the_seed(glue_dir: Path):
    def subset(seed: int) -> list:
        dm = GlueDataModule(
            "sst2", data_dir=str(glue_dir), tokenizer="bytes", max_length=64, max_train_examples=10, seed=seed
        )
        dm.setup("fit")
        return dm.train_items

    assert subset(3) == subset(3) != subset(4) and len(subset(3)) == 10


def test_bad_options_are_clear_errors(glue_dir: Path):
    with pytest.raises(ValueError, match="Unknown GLUE task"):
        GlueDataModule("glue")
    with pytest.raises(ValueError, match="separator"):
        GlueDataModule("rte", separator="")
    dm = GlueDataModule("rte", data_dir=str(glue_dir))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        dm.setup("fit")


def test_tokenizer_and_length_come_from_the_model(glue_dir: Path, lm_checkpoint: Path):
    from types import SimpleNamespace

    from lightning_cqk.downstream.classifier import GlueClassifier

    model = GlueClassifier(str(lm_checkpoint), task="rte")
    dm = GlueDataModule("rte", data_dir=str(glue_dir))
    dm.trainer = SimpleNamespace(lightning_module=model)
    dm.setup("fit")
    assert max(len(ids) for ids, _ in dm.train_items) <= model.config.block_size == 64
    too_long = GlueDataModule("rte", data_dir=str(glue_dir), max_length=65)
    too_long.trainer = SimpleNamespace(lightning_module=model)
    with pytest.raises(ValueError, match="exceeds the model's block_size 64"):
        too_long.setup("fit")


def test_a_data_tokenizer_other_than_the_models_is_refused(
    glue_dir: Path, lm_checkpoint: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
):
    from types import SimpleNamespace

    from lightning_cqk.downstream.classifier import GlueClassifier

    monkeypatch.setenv("LIGHTNING_CQK_GPT2_BPE", str(shared_data / "gpt2_bpe" / "gpt2.tiktoken"))
    other = GlueDataModule("rte", data_dir=str(glue_dir), tokenizer="gpt2")
    other.trainer = SimpleNamespace(lightning_module=GlueClassifier(str(lm_checkpoint), task="rte"))
    with pytest.raises(ValueError, match="not the tokenizer of the model's checkpoint"):
        other.setup("fit")


def test_eval_subset_is_fixed_and_spread_over_the_split(glue_dir: Path):
    from lightning_cqk.downstream.glue_data import fixed_subset

    examples = [Example(str(i), None, 0) for i in range(100)]
    picked = fixed_subset(examples, 10, 0)
    assert picked == fixed_subset(examples, 10, 0) and len(set(picked)) == 10
    assert [int(e.text_a) for e in picked] == sorted(int(e.text_a) for e in picked)
    assert max(int(e.text_a) for e in picked) >= 50  # not the head of the file
    assert fixed_subset(examples, None, 0) == examples == fixed_subset(examples, 500, 0)

    def eval_items(seed: int) -> list:
        dm = GlueDataModule(
            "sst2", data_dir=str(glue_dir), tokenizer="bytes", max_length=64, max_eval_examples=5, seed=seed
        )
        dm.setup("validate")
        return dm.eval_items["dev"]

    assert eval_items(1) == eval_items(2) and len(eval_items(1)) == 5  # independent of the fine-tuning seed
