"""`lightning_cqk consolidate FOLDER`: one checkpoint file from an FSDP2 distributed-checkpoint folder.

FSDP2 (`--trainer.strategy ModelParallelStrategy`) saves each checkpoint as a folder (`checkpoint_files`: the
weight and optimizer shards of every process, their index, and `meta.pt` with the rest of the state). Training
resumes from the folder itself (`--ckpt_path last`); the commands that need the weights in one file (`generate`,
`eval`, `glue`, `mc-eval`, `--model.checkpoint`) refuse a folder and print this command. The file it writes holds
the full weights (`state_dict`, gathered on the CPU: the whole model must fit in this machine's memory) and
everything meta.pt holds (the step, the model's settings), but no optimizer state: it is for evaluating and
fine-tuning, not for resuming (Lightning's `python -m lightning.pytorch.utilities.consolidate_checkpoint` expects
Fabric's key names and fails on the folders a Trainer writes).
"""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path
from typing import Any

from lightning_cqk.checkpoint.folder import read_full_state
from lightning_cqk.checkpoint.reading import (
    META_NAME,
    CorruptCheckpointError,
    checkpoint_problem,
    corrupt_checkpoint_message,
    load_checkpoint,
)
from lightning_cqk.errors import ConfigError


def default_output(folder: str | Path) -> Path:
    """`<folder>.consolidated` beside the folder (not a `*.ckpt` name: never taken for a resumable checkpoint)."""
    folder = Path(folder)
    return folder.with_name(folder.name + ".consolidated")


def consolidated_state(folder: str | Path) -> dict[str, Any]:
    """The folder's full weights as `state_dict` plus the content of its meta.pt, on the CPU.

    The folder is read without running code from it (`checkpoint_folder`: the index through a restricted
    unpickler, stored items as plain data, meta.pt with `weights_only=True`); a folder missing a shard names it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = (
            "a checkpoint file is one file already: give it to generate, eval or glue as it is"
            if folder.exists()
            else "it does not exist"
        )
        raise ConfigError(f"{folder} is not a distributed-checkpoint folder ({what}).")
    problem = checkpoint_problem(folder)
    if problem is not None:
        raise CorruptCheckpointError(corrupt_checkpoint_message(folder, problem))
    shards = read_full_state(folder)
    meta = load_checkpoint(folder / META_NAME)
    if "state_dict" not in shards:
        raise CorruptCheckpointError(
            corrupt_checkpoint_message(folder, "its index holds no model weights (no state_dict entries)")
        )
    return {**meta, "state_dict": shards["state_dict"]}


def consolidate(folder: str | Path, output: str | Path | None = None) -> Path:
    """Write `consolidated_state(folder)` to `output` (default `default_output`), atomically; never over a file."""
    import torch

    target = Path(output) if output is not None else default_output(folder)
    if target.exists() or target.is_symlink():
        raise ConfigError(f"{target} exists already; give another --output, or remove it first.")
    if not target.parent.is_dir():
        raise ConfigError(
            f"--output {target}: its folder {target.parent} does not exist. Create it first (mkdir -p "
            f"{target.parent}) or give a file in an existing folder."
        )
    state = consolidated_state(folder)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")  # never a planted name
    try:
        with open(tmp, "xb") as file:  # created exclusively: a link planted at that name is not followed
            torch.save(state, file)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def consolidate_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="lightning_cqk consolidate",
        description="One checkpoint file (weights and settings, no optimizer state) from an FSDP2 checkpoint folder.",
    )
    parser.add_argument("folder", help="an FSDP2 checkpoint folder, e.g. runs/<experiment>/<run>/checkpoints/last.ckpt")
    parser.add_argument("--output", default=None, help="the file to write (default: <folder>.consolidated)")
    args = parser.parse_args(argv)
    written = consolidate(args.folder, args.output)
    print(f"consolidate: wrote {written} (weights and settings of {args.folder}; no optimizer state)")
