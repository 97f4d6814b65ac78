"""Fixtures for the data tests: a small mixed corpus, a prepared copy of it, and a reader of whole token streams."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")

EOS = 256


def _shared_data_dir() -> Path:
    """``/work/shared/data`` relative to the repo (``<repo>/../shared/data``), or $LIGHTNING_CQK_SHARED_DATA."""
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    return Path(os.environ.get("LIGHTNING_CQK_SHARED_DATA", default))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder (``../shared/data``); skips when absent."""
    path = _shared_data_dir()
    if not (path / "gpt2_bpe" / "gpt2.tiktoken").is_file():
        pytest.skip(f"shared data folder {path} is absent (set LIGHTNING_CQK_SHARED_DATA to it)")
    return path


@pytest.fixture(scope="session")
def gpt2_bpe_dir() -> Path:
    """The shared GPT-2 vocabulary folder (gpt2.tiktoken, vocab.json, merges.txt); skips when absent."""
    path = _shared_data_dir() / "gpt2_bpe"
    if not (path / "gpt2.tiktoken").is_file():
        pytest.skip(f"shared GPT-2 vocabulary {path} is absent (set LIGHTNING_CQK_SHARED_DATA to its parent folder)")
    return path


@pytest.fixture(scope="session")
def wikitext_lines() -> list[str]:
    """Non-blank lines of WikiText-2 raw test (real English with numbers, accents and markup)."""
    path = _shared_data_dir() / "wikitext" / "wikitext-2-raw-test" / "wiki.test.raw"
    if not path.is_file():
        pytest.skip(f"shared WikiText file {path} is absent (set LIGHTNING_CQK_SHARED_DATA to its parent folder)")
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def write_corpus(root: Path) -> Path:
    """A JSON-lines file, plain-text files in nested folders (one with invalid UTF-8), and a file to ignore."""
    (root / "nested" / "deeper").mkdir(parents=True)
    with (root / "a.jsonl").open("w", encoding="utf-8") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"json document {i}: café naïve 注意 " + "abc xyz " * (3 + i % 7)}) + "\n")
    for i in range(12):
        folder = root / ("nested" if i % 2 else "nested/deeper")
        (folder / f"b{i:02d}.txt").write_text(f"text file {i}\nsecond line ✓ " * (1 + i % 3), encoding="utf-8")
    (root / "nested" / "broken.md").write_bytes(b"latin-1 bytes: caf\xe9 and \xff\xfe end")
    (root / "notes.csv").write_text("not,a,source\n")
    return root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mixed corpus of ``write_corpus`` (read-only: tests that modify files make their own)."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def prepared(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``corpus`` prepared once with the bytes tokenizer (val_fraction 0.25, one worker)."""
    from lightning_cqk.data import prepare

    out = tmp_path_factory.mktemp("prepared") / "shards"
    prepare(str(corpus), str(out), val_fraction=0.25)
    return out


@pytest.fixture(scope="session")
def read_stream() -> Callable[[Path], np.ndarray]:
    """Read a split's whole token stream through litdata (windows of one token, so nothing is dropped)."""

    def read(split_dir: Path) -> np.ndarray:
        from litdata import StreamingDataset, TokensLoader

        ds = StreamingDataset(str(split_dir), item_loader=TokensLoader(block_size=1), shuffle=False)
        return np.concatenate([np.asarray(x) for x in ds]) if len(ds) else np.zeros(0, np.uint16)

    return read
