"""Every named corpus downloads and prepares (`prepare --corpus NAME --max_documents 100`): a smoke test that needs
the internet (Hugging Face Hub) and the `datasets` package, marked `network`. Offline (CI, this sandbox) each test
skips itself with the reason, so `make test` (`-m "not gpu"`) passes without a network; `pytest -m network` runs
only these.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from lightning_cqk.data import Manifest
from lightning_cqk.data.corpora import CORPORA

REPO = Path(__file__).resolve().parents[3]
HUB = ("huggingface.co", 443)


@cache
def offline_reason() -> str | None:
    """Why the Hub cannot be reached from here, or None when it can."""
    if importlib.util.find_spec("datasets") is None:
        return "the `datasets` package is not installed (pip install -e '.[data]')"
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    try:
        socket.create_connection(HUB, timeout=3).close()
    except OSError as err:
        return f"no network: cannot reach {HUB[0]}:{HUB[1]} ({type(err).__name__}: {err})"
    return None


ONLINE = [name for name, corpus in CORPORA.items() if corpus.hf_name]


@pytest.mark.network
@pytest.mark.parametrize("name", ONLINE)
def test_named_corpus_downloads_and_prepares(name: str, tmp_path: Path):
    reason = offline_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / name
    command = [sys.executable, "-m", "lightning_cqk", "prepare", "--corpus", name, "--output_dir", str(out),
               "--max_documents", "100"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = Manifest.load(out)
    assert manifest.corpus == name and manifest.splits["train"].documents > 0 and manifest.splits["val"].tokens > 0
