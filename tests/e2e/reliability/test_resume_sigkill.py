"""Exact resume through the real CLI: a `lightning_cqk fit` subprocess is SIGKILLed mid-run and restarted with
`--ckpt_path last` in the same run directory; the restarted run trains on the same batches with bit-identical losses
(deterministic CPU) and ends with the same weights and optimizer state as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk.data import prepare

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
STEPS, EVERY, KILL_AT = 20, 5, 12


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume-data")
    with (root / "corpus.jsonl").open("w") as f:
        for i in range(120):
            f.write(
                json.dumps({"text": f"Document {i}. " + "The quick brown fox jumps over the lazy dog. " * (2 + i % 5)})
            )
            f.write("\n")
    prepare(str(root / "corpus.jsonl"), str(root / "shards"), val_fraction=0.2)
    return root / "shards"


RUN = "standard-tiny-L2-H2-d32-ff64-s1337"  # the run directory's name: the tiny preset at the shape below


def fit_command(shards: Path, runs: Path, losses: Path, *extra: str) -> list[str]:
    """The quickstart with its own callbacks (checkpoint every EVERY steps) plus the loss recorder."""
    callbacks = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())["trainer"]["callbacks"]
    for callback in callbacks:
        args = callback.setdefault("init_args", {})
        if callback["class_path"].endswith("RunCheckpoint"):
            args.update(every_n_steps=EVERY, keep_last=2)
        elif callback["class_path"].endswith(".ModelCheckpoint"):
            args.update(every_n_train_steps=EVERY)
    callbacks.append({"class_path": "loss_recorder.LossRecorder", "init_args": {"path": str(losses)}})
    config = runs.parent / f"{runs.name}-callbacks.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return [
        sys.executable,
        "-m",
        "lightning_cqk",
        "fit",
        "--config",
        str(REPO / "configs" / "quickstart.yaml"),
        "--config",
        str(config),
        f"--data.data_dir={shards}",
        "--data.source=null",
        "--data.seq_len=32",
        "--data.batch_size=4",
        "--model.config.n_layer=2",
        "--model.config.n_embd=32",
        "--model.config.n_head=2",
        "--model.config.mlp_hidden=64",
        "--model.optim.warmup_steps=2",
        f"--trainer.max_steps={STEPS}",
        "--trainer.val_check_interval=8",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu",
        "--trainer.deterministic=true",
        f"--trainer.logger.init_args.save_dir={runs}",
        *extra,
    ]


def environment() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]), OMP_NUM_THREADS="1")
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def read_losses(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigkill_then_ckpt_path_last_reproduces_the_uninterrupted_run(shards: Path, tmp_path: Path):
    # The uninterrupted reference.
    # The loss records sit inside each run's directory: a callback writes nowhere else (issue 45 item 4).
    full_losses = tmp_path / "full" / "quickstart" / RUN / "losses.jsonl"
    done = subprocess.run(
        fit_command(shards, tmp_path / "full", full_losses), env=environment(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    full = {r["step"]: r for r in read_losses(full_losses)}
    assert sorted(full) == list(range(1, STEPS + 1))

    # The same run, SIGKILLed once it has trained past a checkpoint, then restarted with the same command.
    runs = tmp_path / "runs"
    losses = runs / "quickstart" / RUN / "losses.jsonl"
    # The first launch already says `--ckpt_path last` (nothing to resume yet: it starts afresh), as a preemptible job
    # would: the same command line for the first launch and every restart.
    proc = subprocess.Popen(
        fit_command(shards, runs, losses, "--ckpt_path=last"),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while not any(r["step"] >= KILL_AT for r in read_losses(losses)):
        assert proc.poll() is None, f"the run ended before it was killed: {proc.stderr.read().decode()[-3000:]}"
        assert time.monotonic() < deadline, "the run did not reach the kill step in time"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    (run_dir,) = (runs / "quickstart").iterdir()
    killed_at = max(r["step"] for r in read_losses(losses))
    resumed_from = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert resumed_from % EVERY == 0 and 0 < resumed_from <= killed_at < STEPS
    assert (run_dir / ".lock").exists(), "SIGKILL leaves the run lock behind (stale)"

    again = subprocess.run(
        fit_command(shards, runs, losses, "--ckpt_path=last"), env=environment(), capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "took over" in again.stdout + again.stderr, "the stale lock is taken over with a message"
    assert [p.name for p in (runs / "quickstart").iterdir()] == [run_dir.name], "same run directory, no new one"
    assert not (run_dir / ".lock").exists(), "released at exit"

    records = read_losses(losses)
    first = [r for r in records if r["pid"] == records[0]["pid"]]
    second = [r for r in records if r["pid"] != records[0]["pid"]]
    assert [r["step"] for r in first] == list(range(1, killed_at + 1))
    assert [r["step"] for r in second] == list(range(resumed_from + 1, STEPS + 1))
    for r in first + second:
        assert (r["loss"], r["batch"]) == (full[r["step"]]["loss"], full[r["step"]]["batch"]), f"step {r['step']}"

    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    reference = torch.load(next((tmp_path / "full").glob("*/*/checkpoints/last.ckpt")), weights_only=False)
    assert final["global_step"] == reference["global_step"] == STEPS
    assert final["state_dict"].keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
    for a, b in zip(final["optimizer_states"][0]["state"].values(), reference["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in b)
    periodic = sorted(p.name for p in (run_dir / "checkpoints").glob("step=*.ckpt"))
    assert periodic == [f"step={STEPS - EVERY:08d}.ckpt", f"step={STEPS:08d}.ckpt"], "keep_last=2"
