"""Fixtures for the reliability tests: a tiny LitLM and random-token loaders (the quiet CPU Trainer, `make_trainer`,
is the root conftest's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

VOCAB, BATCH, SEQ = 64, 4, 16


@pytest.fixture
def make_module() -> Callable[..., LitLM]:
    """Factory: a seeded 2-layer, 32-wide LitLM over a 64-token vocabulary (any LitLM subclass)."""

    def make(module_class: type[LitLM] = LitLM, lr: float = 1e-2, **config: Any) -> LitLM:
        L.seed_everything(0, verbose=False)
        shape = dict(vocab_size=VOCAB, n_layer=2, n_embd=32, n_head=4, block_size=SEQ, **config)
        return module_class(ModelConfig(**shape), OptimConfig(lr=lr, warmup_steps=2))

    return make


@pytest.fixture
def token_loader() -> Callable[..., DataLoader]:
    """Factory: random (4, 17) token windows."""

    def make(n_batches: int = 32) -> DataLoader:
        data = torch.randint(0, VOCAB, (n_batches * BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
        return DataLoader(data, batch_size=BATCH, shuffle=False)

    return make
