"""A run started from the sweep's fork server (lightning_cqk/study/run/worker.py) is a fresh `python -m lightning_cqk
fit`
process to the last digit: the same final validation loss and the same bits in every weight of last.ckpt; its log
and exit status are where and what a fresh process gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from tiny_run import tiny_fit

from lightning_cqk.study.design import start_mode
from lightning_cqk.study.run import worker
from lightning_cqk.study.run.run_scalars import read_scalars


def _fit_args(shards: Path, runs: Path, name: str) -> list[str]:
    return tiny_fit(
        shards,
        runs,
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2",
        "--trainer.logger.init_args.name=w",
        f"--trainer.logger.init_args.version={name}",
    )


def _run(cmd: list[str], env: dict[str, str], log: Path) -> int:
    with open(log, "a") as handle:
        return worker.start_run(cmd, env, handle).wait(timeout=300)


def test_a_forked_run_equals_a_fresh_process_to_the_last_digit(tiny_shards: Path, tmp_path: Path, monkeypatch):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIGHTNING_CQK_DEBUG": "1"}
    runs = tmp_path / "runs"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(start_mode, "mode", "fresh")
    fresh = _run(
        [sys.executable, "-m", "lightning_cqk", *_fit_args(tiny_shards, runs, "fresh")], env, tmp_path / "a.log"
    )
    monkeypatch.setattr(start_mode, "mode", "fork")
    forked = worker.start_run(
        [sys.executable, "-m", "lightning_cqk", *_fit_args(tiny_shards, runs, "forked")],
        env,
        open(tmp_path / "b.log", "a"),
    )
    assert isinstance(forked, worker.ForkedRun), "on Linux the sweep forks its runs from a pre-imported worker"
    assert forked.wait(timeout=300) == 0 and fresh == 0, (tmp_path / "b.log").read_text()[-2000:]
    assert "TokenBudget" in (tmp_path / "b.log").read_text() or "run:" in (tmp_path / "b.log").read_text()

    a, b = read_scalars(runs / "w" / "fresh"), read_scalars(runs / "w" / "forked")
    assert a["val/loss"] == b["val/loss"] and len(a["val/loss"]) == 2, "every validation, to the last digit"
    weights_a = torch.load(runs / "w" / "fresh" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    weights_b = torch.load(runs / "w" / "forked" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a), "every weight, bit for bit"

    bad = _run([sys.executable, "-m", "lightning_cqk", "fit", "--trainer.max_steps=many"], env, tmp_path / "c.log")
    fresh_bad = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "fit", "--trainer.max_steps=many"], env=env, capture_output=True
    ).returncode
    assert bad == fresh_bad != 0, "a user error exits as it does from a fresh process"
