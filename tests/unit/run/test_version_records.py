"""A torch older than a feature needs is refused when the run is configured, naming the feature and the version."""

from __future__ import annotations

import pytest
import torch

from lightning_cqk.errors import ConfigError
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig
from lightning_cqk.run.version_records import require_torch, torch_version

TINY = dict(preset="tiny", n_layer=1, n_head=4, n_embd=32, block_size=16, vocab_size=97)


def test_version_parsing(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.0a0+git123")
    assert torch_version() == (2, 10)


def test_muon_refused_on_old_torch(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu126")
    with pytest.raises(ConfigError, match=r"torch.optim.Muon.*torch>=2.9.*2.8.0"):
        LitLM(ModelConfig(**TINY), optim=OptimConfig(name="muon"))
    LitLM(ModelConfig(**TINY))  # AdamW and MHA need nothing newer


def test_grouped_heads_refused_on_old_torch(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(ConfigError, match=r"enable_gqa.*torch>=2.5"):
        LitLM(ModelConfig(**TINY, attention_options={"n_kv_groups": 2}))


def test_fsdp2_refused_on_old_torch(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.0")
    with pytest.raises(ConfigError, match="fully_shard"):
        require_torch("fsdp2")
