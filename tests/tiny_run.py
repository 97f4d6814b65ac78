"""The tiny run that the end-to-end tests train, stated once: its shards, its `lightning_cqk fit` flags, its callback
configs and the environment of a child process that runs it.

A test gives only its delta: `tiny_fit(shards, runs, "--trainer.max_steps=4")` is the whole command line of a run of
the quickstart config at the tiny shape (one layer of width 16 with 2 heads, 2 windows of 16 bytes a step, on CPU,
quiet), reading `shards` (usually the session's `tiny_shards` fixture, tests/conftest.py) and writing under `runs`.
Flags of the delta come after the tiny ones, so they win (`--data.source=<corpus>` trains on a corpus instead).

A test that trains in its own process builds its Trainer here too: `tiny_trainer(max_steps=4, callbacks=[...])` is
the quiet CPU Trainer (`QUIET_TRAINER`) with the test's delta; no test spells `L.Trainer(` inline
(tests/test_layout_of_tests.py).

This file is importable from every test folder (`tests/` is on sys.path through the root conftest), like
`backend_cases.py`.
"""

from __future__ import annotations

import json
import operator
import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import lightning as L

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"

#: The tiny run's shape: data read from prepared shards, one layer of width 16 with 2 heads, one warmup step, quiet.
TINY_FLAGS = (
    "--data.source=null",
    "--data.seq_len=16",
    "--data.batch_size=2",
    "--model.config.n_layer=1",
    "--model.config.n_embd=16",
    "--model.config.n_head=2",
    "--model.config.mlp_hidden=32",
    "--model.optim.warmup_steps=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.accelerator=cpu",
)
#: The base of every in-process Trainer of the tests: CPU, no logger, no progress bar, no model summary.
QUIET_TRAINER: dict[str, Any] = dict(
    accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
)  # fmt: skip
#: What a child process must not inherit from the test process: a launcher's rank variables and pytest's marker.
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LIGHTNING_CQK_RUN", "PYTEST_CURRENT_TEST")


def tiny_trainer(**delta: Any) -> L.Trainer:
    """The one Trainer the tests build in their own process: `QUIET_TRAINER` updated by `delta` (what the test
    changes: steps, devices and strategy, precision, callbacks, checkpointing, validation batches, a logger, ...)."""
    import lightning as L

    return L.Trainer(**{**QUIET_TRAINER, **delta})


def write_tiny_corpus(path: Path, documents: int = 60) -> Path:
    """A JSON-lines corpus of `documents` short English documents (about 160 bytes each) at `path`."""
    with path.open("w") as f:
        for i in range(documents):
            f.write(json.dumps({"text": f"Document {i}. " + "Queries meet keys in the attention. " * (2 + i % 5)}))
            f.write("\n")
    return path


def prepare_tiny_shards(root: Path) -> Path:
    """Byte-token shards of `write_tiny_corpus` (20% validation) in `root / "shards"`."""
    from lightning_cqk.data import prepare

    prepare(str(write_tiny_corpus(root / "corpus.jsonl")), str(root / "shards"), val_fraction=0.2)
    return root / "shards"


def tiny_args(
    shards: Path | str, runs: Path, *delta: str, configs: Sequence[Path | str] = (), quickstart: bool = True
) -> list[str]:
    """The tiny run's arguments after the subcommand: the quickstart config (unless `quickstart` is false: a launcher
    command that names it already), then each of `configs`, the data folder `shards`, `TINY_FLAGS`, `delta`, and last
    the run folder `runs` (`--trainer.logger.init_args.save_dir`)."""
    config_args = [a for c in ([QUICKSTART] if quickstart else []) + list(configs) for a in ("--config", str(c))]
    return [
        *config_args,
        f"--data.data_dir={shards}",
        *TINY_FLAGS,
        *delta,
        f"--trainer.logger.init_args.save_dir={runs}",
    ]


def tiny_fit(shards: Path | str, runs: Path, *delta: str, configs: Sequence[Path | str] = ()) -> list[str]:
    """`fit` and the tiny run's arguments (`tiny_args`): what `lightning_cqk.cli.main` takes."""
    return ["fit", *tiny_args(shards, runs, *delta, configs=configs)]


def tiny_command(
    shards: Path | str, runs: Path, *delta: str, configs: Sequence[Path | str] = (), subcommand: str = "fit"
) -> list[str]:
    """The tiny run as a child process's argv: `python -m lightning_cqk <subcommand> <tiny_args>`."""
    return [sys.executable, "-m", "lightning_cqk", subcommand, *tiny_args(shards, runs, *delta, configs=configs)]


def child_env(*paths: Path, **variables: str | None) -> dict[str, str]:
    """This process's environment for a child `python -m lightning_cqk`: the repo (then `paths`) on PYTHONPATH, one
    intra-op thread, no launcher rank variables, no pytest marker; `variables` set (or, given None, removed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [REPO, *paths])), OMP_NUM_THREADS="1")
    for name in [k for k in env if k in _LAUNCH_VARIABLES or k.startswith(_LAUNCH_PREFIXES)]:
        env.pop(name)
    for name, value in variables.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def callbacks_config(path: Path, callbacks: list[dict]) -> Path:
    """A config file at `path` that sets the trainer's callback list to `callbacks` (for `configs=`)."""
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return path


def quickstart_callbacks(path: Path, *extra: dict, **checkpoint: object) -> Path:
    """`callbacks_config` of the quickstart's own callback list, RunCheckpoint's init_args updated with `checkpoint`
    (e.g. `every_n_steps=2, keep_last=2`), then the `extra` callbacks."""
    callbacks = yaml.safe_load(QUICKSTART.read_text())["trainer"]["callbacks"]
    for callback in callbacks:
        if callback["class_path"].endswith("RunCheckpoint"):
            callback["init_args"].update(checkpoint)
    return callbacks_config(path, [*callbacks, *extra])


def checkpoint_folder(path: Path, step: int, *, index: bool = True, meta: bool = True) -> Path:
    """A distributed-checkpoint folder as ModelParallelStrategy writes it: shards, their index, meta.pt (a tiny
    model's weights and AdamW state saved by torch.distributed.checkpoint without a process group)."""
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(step)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    dcp.save({"state_dict": model.state_dict(), "optimizer_0": optimizer.state_dict()}, checkpoint_id=path,
             no_dist=True)  # fmt: skip
    if not index:
        (path / ".metadata").unlink()
    if meta:
        torch.save({"global_step": step, "hyper_parameters": {}}, path / "meta.pt")
    return path


class Planted:
    """Unpickling this creates `marker`: the stand-in for any command a planted pickle could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class PlantedThenIndex:
    """Runs the planted command, then returns the genuine index: the silent variant (the folder still loads)."""

    def __init__(self, marker: Path, index: object) -> None:
        self.marker, self.index = marker, index

    def __reduce__(self):
        return (operator.getitem, ((Planted(self.marker), self.index), 1))


def plant_index(folder: Path, marker: Path) -> None:
    with (folder / ".metadata").open("rb") as f:
        genuine = pickle.load(f)  # our own test folder: trusted
    (folder / ".metadata").write_bytes(pickle.dumps(PlantedThenIndex(marker, genuine)))
