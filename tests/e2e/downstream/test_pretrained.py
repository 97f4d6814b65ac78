"""Loading LM checkpoints: exact weights for any backend, the training tokenizer, clear refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lightning_cqk.downstream.classifier import GlueClassifier
from lightning_cqk.inference.pretrained import load_pretrained
from lightning_cqk.module import LitLM


@pytest.mark.parametrize("fixture", ["lm_checkpoint", "coupled_checkpoint"])
def test_loaded_model_equals_the_trained_one(fixture: str, request: pytest.FixtureRequest):
    ckpt = request.getfixturevalue(fixture)
    pretrained = load_pretrained(ckpt)
    reference = LitLM.load_from_checkpoint(ckpt, map_location="cpu").model.eval()
    assert pretrained.config.attention == ("coupled" if "coupled" in fixture else "standard")
    assert pretrained.tokenizer.name == "bytes" and pretrained.fingerprint_checked
    idx = torch.randint(0, 257, (2, 40))
    torch.testing.assert_close(pretrained.model(idx), reference(idx), rtol=0, atol=0)
    hidden = pretrained.model.hidden_states(idx)  # (B, T, C): what the LM head reads
    torch.testing.assert_close(pretrained.model.lm_head(hidden), reference(idx), rtol=0, atol=0)


def _rewrite(ckpt: Path, tmp_path: Path, edit) -> Path:
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    edit(checkpoint)
    out = tmp_path / "edited.ckpt"
    torch.save(checkpoint, out)
    return out


def test_a_tokenizer_other_than_the_training_one_is_refused(lm_checkpoint: Path, tmp_path: Path):
    with pytest.raises(ValueError, match=r"trained with the 'bytes' tokenizer, but tokenizer='gpt2'"):
        load_pretrained(lm_checkpoint, tokenizer="gpt2")
    with pytest.raises(ValueError, match=r"trained with the 'bytes' tokenizer"):
        GlueClassifier(str(lm_checkpoint), task="sst2", tokenizer="gpt2")
    # no recorded tokenizer: the vocabulary size still has to match the model's embedding
    bare = _rewrite(lm_checkpoint, tmp_path, lambda c: c.pop("datamodule_hyper_parameters"))
    with pytest.raises(ValueError, match=r"'gpt2' has 50,257 ids but the model .* has a vocabulary of 257"):
        load_pretrained(bare, tokenizer="gpt2")
    with pytest.raises(ValueError, match="does not record its tokenizer"):
        load_pretrained(bare)
    assert load_pretrained(bare, tokenizer="bytes").tokenizer.name == "bytes"


def test_a_vocabulary_that_differs_from_the_manifest_is_refused(lm_checkpoint: Path, tmp_path: Path):
    original = torch.load(lm_checkpoint, map_location="cpu", weights_only=False)["datamodule_hyper_parameters"]
    shards = tmp_path / "shards"
    shutil.copytree(original["data_dir"], shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["tokenizer_fingerprint"] = "0" * 64
    (shards / "manifest.json").write_text(json.dumps(manifest))
    edited = _rewrite(lm_checkpoint, tmp_path, lambda c: c["datamodule_hyper_parameters"].update(data_dir=str(shards)))
    with pytest.raises(ValueError, match=r"is not the one .* was trained with \(000000000000"):
        load_pretrained(edited)
    assert not load_pretrained(edited, check_fingerprint=False).fingerprint_checked


def test_not_a_checkpoint_and_missing_file(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nope.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not a lightning_cqk language-model checkpoint"):
        load_pretrained(tmp_path / "other.ckpt")
