"""Validation does not depend on the number of processes (issue 24, item 3): 1 and 2 processes (gloo, Lightning's own
launcher through the CLI) score the same windows, give the same val/loss and write the same val_windows.json.

Before: `limit_val_batches` counted per rank and litdata dealt each rank its own chunks, so 2 processes scored twice
the windows, other ones, and val_windows.json held rank zero's share only. The set here (15 windows: 5 batches of 3)
splits unevenly (7 + 8), and the model is the seeded initial one (`validate` without a checkpoint): no training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.data import prepare
from lightning_cqk.data.val_split import share, validation_windows

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "reliability"


def test_the_share_arithmetic():
    assert validation_windows(158, 5, 3) == 15 and validation_windows(158, 1.0, 3) == 158
    assert validation_windows(10, 100, 3) == 10 and validation_windows(158, 0.5, 3) == 79
    for n, world in ((15, 2), (7, 3), (8, 8)):
        blocks = [share(n, world, r) for r in range(world)]
        assert blocks[0][0] == 0 and blocks[-1][1] == n and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        assert max(b - a for a, b in blocks) - min(b - a for a, b in blocks) <= 1


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("val-world-data")
    with (root / "corpus.jsonl").open("w") as f:
        for i in range(120):
            f.write(json.dumps({"text": f"Document {i}. " + "Queries meet keys in the attention. " * (2 + i % 5)}))
            f.write("\n")
    prepare(str(root / "corpus.jsonl"), str(root / "shards"), val_fraction=0.2)
    return root / "shards"


def validate(shards: Path, tmp_path: Path, devices: int) -> tuple[dict, dict]:
    out = tmp_path / f"devices{devices}"
    callbacks = [
        {"class_path": "lightning_cqk.callbacks.ValWindowLosses", "init_args": {"every_validation": True}},
        {"class_path": "launch_probe.LaunchProbe", "init_args": {"out": str(out)}},
    ]
    cb = tmp_path / f"callbacks{devices}.yaml"
    cb.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    runs = tmp_path / f"runs{devices}"
    args = [
        *(
            "-m",
            "lightning_cqk",
            "validate",
            "--config",
            str(REPO / "configs" / "quickstart.yaml"),
            "--config",
            str(cb),
        ),
        f"--data.data_dir={shards}",
        "--data.source=null",
        "--data.seq_len=16",
        "--data.batch_size=3",
        "--model.config.n_layer=1",
        "--model.config.n_embd=16",
        "--model.config.n_head=2",
        "--trainer.limit_val_batches=5",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu",
        f"--trainer.devices={devices}",
        *(["--trainer.strategy=ddp"] if devices > 1 else []),
        f"--trainer.logger.init_args.save_dir={runs}",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(PROBE)]), OMP_NUM_THREADS="1")
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTEST_CURRENT_TEST"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = [json.loads((out / f"val-rank{r}.json").read_text()) for r in range(devices)]
    assert all(m == metrics[0] for m in metrics), metrics  # every rank logs the reduced value
    (windows,) = runs.rglob("val_windows.json")
    return metrics[0], json.loads(windows.read_text())


@pytest.mark.slow
def test_one_and_two_processes_score_the_same_windows(shards, tmp_path):
    one, windows_one = validate(shards, tmp_path, 1)
    two, windows_two = validate(shards, tmp_path, 2)
    assert len(windows_one["nll"]) == len(windows_two["nll"]) == 15
    assert windows_two["tokens"] == windows_one["tokens"]
    assert windows_two["nll"] == pytest.approx(windows_one["nll"], rel=1e-6)
    assert two["val/loss"] == pytest.approx(one["val/loss"], rel=1e-6)
    assert sum(windows_one["nll"]) / sum(windows_one["tokens"]) == pytest.approx(one["val/loss"], rel=1e-6)
