"""Fixtures of the lm-eval tests (lmeval_helpers.py): a tiny fp64 GPT with the byte tokenizer, tiny local tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
from lmeval_helpers import tiny_gpt, write_tasks

from lightning_cqk.data.tokenizers import get_tokenizer
from lightning_cqk.model import GPT


@pytest.fixture
def model() -> GPT:
    return tiny_gpt()


@pytest.fixture
def tokenizer():
    return get_tokenizer("bytes")


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    return write_tasks(tmp_path / "tasks")
