"""Shared test fixtures: offline litdata, restored dtype, the shared real-data folder, the tiny run's shards and the
one quiet Trainer factory."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from tiny_run import prepare_tiny_shards, tiny_trainer

if TYPE_CHECKING:
    import lightning as L

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
# The probe callbacks that the subprocess tests load (tests/e2e/reliability/*.py, tests/e2e/study/sweep_helpers.py) are
# outside the package's allow-list of class paths (lightning_cqk/cli/class_paths.py): added the documented way, for
# every process the tests start.
os.environ["LIGHTNING_CQK_TRUSTED_MODULES"] = (
    "launch_probe,loss_recorder,signal_probe,slurm_helpers,sweep_helpers,validation_killer"
)
# Test shapes are tiny: one intra-op thread is faster for them and keeps timings stable when cores are shared.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
# The specs' {shared_data} placeholder has no default in the package: the tests read the corpora beside the repo.
# Absolute, for this process and every command a test starts in another folder (the Makefile exports "../shared/data").
os.environ["LIGHTNING_CQK_SHARED_DATA"] = str(
    Path(os.environ.get("LIGHTNING_CQK_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")).resolve()
)


#: The pyramid's layers (tests/<layer>/...): each test is marked with its layer's name (`pytest -m unit`); `make
#: test-fast` runs `unit` and `contract_smoke` (tests/contract/conftest.py), `make test` every test.
LAYERS = ("unit", "contract", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        path = Path(item.path).resolve()
        parts = path.relative_to(tests).parts if tests in path.parents else ()
        if len(parts) > 1 and parts[0] in LAYERS:
            item.add_marker(parts[0])


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
    """Byte-token shards of 60 short documents (20% validation), prepared once per test process: the data of the tiny
    run (tests/tiny_run.py: `tiny_fit(tiny_shards, runs, *delta)`). Read-only for tests: copy it to damage it."""
    return prepare_tiny_shards(tmp_path_factory.mktemp("tiny-shards"))


@pytest.fixture
def make_trainer(tmp_path: Path) -> Callable[..., L.Trainer]:
    """Factory: a quiet 1-device CPU Trainer of `max_steps` steps, no validation, no checkpointing unless asked,
    logging every step as CSV into tmp_path/run (the run's folder: checkpoints go to tmp_path/run/checkpoints);
    keyword arguments replace any of these (`logger=`: another logger for the same folder)."""

    def make(callbacks: list[L.Callback], max_steps: int = 8, **kwargs: Any) -> L.Trainer:
        from lightning.pytorch.loggers import CSVLogger

        defaults = dict(max_steps=max_steps, devices=1, enable_checkpointing=False, limit_val_batches=0)
        defaults["log_every_n_steps"] = 1
        if "logger" not in kwargs:
            kwargs["logger"] = CSVLogger(tmp_path, name="run", version="")
        return tiny_trainer(callbacks=callbacks, **{**defaults, **kwargs})

    return make
