"""Validation does not depend on the number of processes (issue 24, item 3): 1 and 2 processes (gloo, Lightning's own
launcher through the CLI) score the same windows, give the same val/loss and write the same val_windows.json.

Before: `limit_val_batches` counted per rank and litdata dealt each rank its own chunks, so 2 processes scored twice
the windows, other ones, and val_windows.json held rank zero's share only. The set here (15 windows: 5 batches of 3)
splits unevenly (7 + 8), and the model is the seeded initial one (`validate` without a checkpoint): no training.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tiny_run import callbacks_config, child_env, tiny_command

from lightning_cqk.data.val_split import share, validation_windows

REPO = Path(__file__).resolve().parents[3]
PROBE = REPO / "tests" / "e2e" / "reliability"


def test_the_share_arithmetic():
    assert validation_windows(158, 5, 3) == 15 and validation_windows(158, 1.0, 3) == 158
    assert validation_windows(10, 100, 3) == 10 and validation_windows(158, 0.5, 3) == 79
    for n, world in ((15, 2), (7, 3), (8, 8)):
        blocks = [share(n, world, r) for r in range(world)]
        assert blocks[0][0] == 0 and blocks[-1][1] == n and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        assert max(b - a for a, b in blocks) - min(b - a for a, b in blocks) <= 1


def validate(shards: Path, tmp_path: Path, devices: int) -> tuple[dict, dict]:
    out = tmp_path / f"devices{devices}"
    callbacks = [
        {"class_path": "lightning_cqk.callbacks.ValWindowLosses", "init_args": {"every_validation": True}},
        {"class_path": "launch_probe.LaunchProbe", "init_args": {"out": str(out)}},
    ]
    cb = callbacks_config(tmp_path / f"callbacks{devices}.yaml", callbacks)
    runs = tmp_path / f"runs{devices}"
    ddp = ["--trainer.strategy=ddp"] if devices > 1 else []
    args = tiny_command(
        shards,
        runs,
        "--data.batch_size=3",
        "--trainer.limit_val_batches=5",
        f"--trainer.devices={devices}",
        *ddp,
        configs=[cb],
        subcommand="validate",
    )
    env = child_env(PROBE)
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = [json.loads((out / f"val-rank{r}.json").read_text()) for r in range(devices)]
    assert all(m == metrics[0] for m in metrics), metrics  # every rank logs the reduced value
    (windows,) = runs.rglob("val_windows.json")
    return metrics[0], json.loads(windows.read_text())


@pytest.mark.slow
def test_one_and_two_processes_score_the_same_windows(tiny_shards, tmp_path):
    one, windows_one = validate(tiny_shards, tmp_path, 1)
    two, windows_two = validate(tiny_shards, tmp_path, 2)
    assert len(windows_one["nll"]) == len(windows_two["nll"]) == 15
    assert windows_two["tokens"] == windows_one["tokens"]
    assert windows_two["nll"] == pytest.approx(windows_one["nll"], rel=1e-6)
    assert two["val/loss"] == pytest.approx(one["val/loss"], rel=1e-6)
    assert sum(windows_one["nll"]) / sum(windows_one["tokens"]) == pytest.approx(one["val/loss"], rel=1e-6)
