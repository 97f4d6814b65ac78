"""An interrupted validation is redone (issue 13 class 4, training side): a real `lightning_cqk fit` subprocess is
SIGKILLed during its final validation; `--ckpt_path last` then retrains from the checkpoint before that validation and
validates, so the run ends with the final validation of the uninterrupted run (bit-identical on CPU), and its
`summary.json` names the step of the last completed validation at every point."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import callbacks_config, child_env, tiny_fit

from lightning_cqk.callbacks.summary import last_validation_step
from lightning_cqk.cli import main

HERE = Path(__file__).resolve().parent
STEPS, EVERY = 6, 3  # checkpoints and validations both every 3 steps: the final ones fall on the same step


def fit_args(shards: Path, runs: Path, *extra: str, kill_marker: Path | None = None) -> list[str]:
    callbacks = [
        {"class_path": "lightning_cqk.callbacks.RunCheckpoint", "init_args": {"every_n_steps": EVERY}},
        {"class_path": "lightning_cqk.callbacks.BestCheckpoint"},
    ]
    if kill_marker is not None:
        init = {"at_step": STEPS, "marker": str(kill_marker)}
        callbacks.append({"class_path": "validation_killer.KillDuringValidation", "init_args": init})
    config = callbacks_config(runs.parent / f"{runs.name}-callbacks.yaml", callbacks)
    schedule = [
        f"--trainer.max_steps={STEPS}",
        f"--trainer.val_check_interval={EVERY}",
        "--trainer.limit_val_batches=2",
    ]
    delta = [*schedule, "--trainer.log_every_n_steps=1", "--trainer.deterministic=true", *extra]
    return tiny_fit(shards, runs, *delta, configs=[config])


def fit(shards: Path, runs: Path, *extra: str, kill_marker: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "lightning_cqk", *fit_args(shards, runs, *extra, kill_marker=kill_marker)]
    return subprocess.run(command, env=child_env(HERE), capture_output=True, text=True, timeout=300)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


@pytest.mark.slow
def test_a_run_killed_during_its_final_validation_validates_again_on_resume(tiny_shards: Path, tmp_path: Path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocesses (OMP_NUM_THREADS=1): the same numbers, bit for bit
    try:
        main(fit_args(tiny_shards, tmp_path / "full"))  # the uninterrupted reference, in process (cheaper)
    finally:
        torch.set_num_threads(threads)
    (reference,) = (tmp_path / "full" / "quickstart").iterdir()
    expected = summary(reference)["last_validation"]
    assert expected["step"] == STEPS and summary(reference)["finished"]

    runs, marker = tmp_path / "runs", tmp_path / "killed.pid"
    killed = fit(tiny_shards, runs, "--ckpt_path=last", kill_marker=marker)
    assert killed.returncode == -signal.SIGKILL and marker.exists(), killed.stderr[-3000:]
    (run_dir,) = (runs / "quickstart").iterdir()
    # The save due at the last step waits for that step's validation: last.ckpt is the checkpoint before it.
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS - EVERY
    assert last_validation_step(str(run_dir)) == STEPS - EVERY and not summary(run_dir)["finished"]

    again = fit(tiny_shards, runs, "--ckpt_path=last", kill_marker=marker)
    assert again.returncode == 0, again.stderr[-3000:]
    after = summary(run_dir)
    assert after["finished"] and after["steps"] == STEPS
    assert after["last_validation"] == expected, "the final validation is redone, exactly as uninterrupted"
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == STEPS
    assert final["callbacks"]["RunSummary"]["last_validation"]["step"] == STEPS, "the checkpoint knows it validated"
