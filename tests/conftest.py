"""Shared test fixtures: offline litdata, restored dtype, and the location of the shared real-data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
# The probe callbacks that the subprocess tests load (tests/reliability/*.py, tests/sweep/sweep_helpers.py) are outside
# the package's allow-list of class paths (lightning_cqk/cli/class_paths.py): added the documented way, for every
# process the tests start.
os.environ["LIGHTNING_CQK_TRUSTED_MODULES"] = "launch_probe,loss_recorder,signal_probe,sweep_helpers,validation_killer"
# Test shapes are tiny: one intra-op thread is faster for them and keeps timings stable when cores are shared.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
# The specs' {shared_data} placeholder has no default in the package: the tests read the corpora beside the repo.
# Absolute, for this process and every command a test starts in another folder (the Makefile exports "../shared/data").
os.environ["LIGHTNING_CQK_SHARED_DATA"] = str(
    Path(os.environ.get("LIGHTNING_CQK_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")).resolve()
)


def shared_data_dir() -> Path:
    """`../shared/data` beside the repo (or $LIGHTNING_CQK_SHARED_DATA), absolute: tests run commands in other folders
    (the Makefile exports the relative `../shared/data`)."""
    return Path(os.environ.get("LIGHTNING_CQK_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture(autouse=True)
def _restore_default_dtype():
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"shared real-data folder {path} is absent (set LIGHTNING_CQK_SHARED_DATA to use another)")
    return path


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> Path:
    """Byte-token shards of 60 short documents (20% validation), prepared once per test process: the data of a tiny
    `fit` (`--data.data_dir <it> --data.source=null --data.seq_len=16 --data.batch_size=2`). Read-only for tests."""
    import json

    from lightning_cqk.data import prepare

    root = tmp_path_factory.mktemp("tiny-shards")
    with (root / "corpus.jsonl").open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"Document {i}. " + "Queries meet keys in the attention. " * (2 + i % 5)}))
            f.write("\n")
    prepare(str(root / "corpus.jsonl"), str(root / "shards"), val_fraction=0.2)
    return root / "shards"
