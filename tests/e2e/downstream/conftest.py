"""Fixtures for downstream tests: tiny LM checkpoints (standard, coupled) and a toy GLUE folder of all nine tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
from downstream_helpers import train_lm, write_glue_folder


@pytest.fixture(scope="session")
def lm_checkpoint(tmp_path_factory) -> Path:
    """A standard-attention `tiny` (1 layer, block 64, bytes) checkpoint trained 2 steps by `lightning_cqk fit`."""
    return train_lm(tmp_path_factory.mktemp("lm-standard"))


@pytest.fixture(scope="session")
def coupled_checkpoint(tmp_path_factory) -> Path:
    """The same with the `coupled` backend."""
    return train_lm(tmp_path_factory.mktemp("lm-coupled"), attention="coupled")


@pytest.fixture
def glue_dir(tmp_path: Path) -> Path:
    return write_glue_folder(tmp_path / "glue")
