"""Fixtures for the instrument tests: a tiny LitLM, random-token loaders, an in-memory logger, a quiet Trainer.

Helpers are handed out as fixtures (not imported from this file: several test folders have a conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger
from torch.utils.data import DataLoader

from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

VOCAB, BATCH, SEQ = 64, 4, 16


class MemoryLogger(Logger):
    """Keeps every `log_metrics` call; its save_dir is the run directory (`trainer.log_dir`)."""

    def __init__(self, save_dir: Path) -> None:
        super().__init__()
        self._save_dir = str(save_dir)
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return "0"

    @property
    def save_dir(self) -> str:
        return self._save_dir

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def at(self, step: int) -> dict[str, float]:
        """Every metric logged at `step`."""
        merged: dict[str, float] = {}
        for s, metrics in self.rows:
            if s == step:
                merged.update(metrics)
        return merged

    def series(self, key: str) -> dict[int, float]:
        """{step: value} of one metric."""
        return {step: m[key] for step, m in self.rows if key in m}


def _tiny_config(attention: str = "standard", **overrides: Any) -> ModelConfig:
    kwargs = dict(vocab_size=VOCAB, n_layer=2, n_embd=32, n_head=4, block_size=SEQ, attention=attention)
    return ModelConfig(**{**kwargs, **overrides})


def _token_loader(n_batches: int = 64, batch_size: int = BATCH, seq_len: int = SEQ, seed: int = 0) -> DataLoader:
    """Uniformly random (batch_size, seq_len + 1) token windows: a flat loss with no spikes of its own."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, VOCAB, (n_batches * batch_size, seq_len + 1), generator=g)
    return DataLoader(data, batch_size=batch_size, shuffle=False)


@pytest.fixture
def tiny_config() -> Callable[..., ModelConfig]:
    """Factory: a 2-layer, 32-wide, 4-head config over a 64-token vocabulary and 16-token context."""
    return _tiny_config


@pytest.fixture
def token_loader() -> Callable[..., DataLoader]:
    """Factory: a loader of random (4, 17) token windows."""
    return _token_loader


@pytest.fixture
def make_module() -> Callable[..., LitLM]:
    def make(attention: str = "standard", lr: float = 1e-2, module_class: type[LitLM] = LitLM, **optim: Any) -> LitLM:
        L.seed_everything(0, verbose=False)
        optim = {"warmup_steps": 2, "weight_decay": 0.1, **optim}
        return module_class(_tiny_config(attention), OptimConfig(lr=lr, **optim))

    return make


@pytest.fixture
def make_trainer(
    make_trainer: Callable[..., L.Trainer], tmp_path: Path
) -> Callable[..., tuple[L.Trainer, MemoryLogger]]:
    """The root factory (tests/conftest.py), logging to a `MemoryLogger` in tmp_path/run (or `save_dir`) returned
    beside the Trainer."""

    def make(callbacks: list[L.Callback], max_steps: int = 8, **kwargs: Any) -> tuple[L.Trainer, MemoryLogger]:
        logger = MemoryLogger(kwargs.pop("save_dir", tmp_path / "run"))
        return make_trainer(callbacks, max_steps, logger=logger, **kwargs), logger

    return make
