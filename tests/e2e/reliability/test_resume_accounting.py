"""Budgets and "best" stay true across resumes (issue 25 classes 3 and 4), through real `lightning_cqk fit` runs.

- A token budget resumed with another `accumulate_grad_batches` stops at the budget, counting the tokens trained at
  the old rate; `budget.json` records each attempt's rate; a resume that trains no step is recorded in run.json and
  leaves budget.json as it was.
- Every checkpoint written at a validation step knows that validation's best (`last.ckpt` included); a run resumed
  there with a diverging learning rate, and a `cp -a` copy resumed the same way, keep the true best and leave no
  orphan best file; a best file from beyond the resumed step is pruned.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from tiny_run import callbacks_config, child_env, tiny_command

SEQ, BATCH = 16, 2  # the tiny run's windows


def fit(shards: Path, runs: Path, *extra: str, every: int = 3) -> subprocess.CompletedProcess:
    callbacks = [
        {"class_path": "lightning_cqk.callbacks.RunCheckpoint", "init_args": {"every_n_steps": every}},
        {"class_path": "lightning_cqk.callbacks.BestCheckpoint"},
    ]
    config = callbacks_config(runs.parent / f"{runs.name}-callbacks.yaml", callbacks)
    command = tiny_command(
        shards,
        runs,
        "--model.optim.lr=1e-2",
        f"--trainer.val_check_interval={every}",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.deterministic=true",
        *extra,
        configs=[config],
    )
    return subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=300)


def ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.slow
def test_a_token_budget_resumed_with_another_accumulation_counts_the_tokens_already_trained(tiny_shards, tmp_path):
    runs = tmp_path / "runs"
    step = SEQ * BATCH  # 32 tokens per optimizer step at accumulate 1
    ok(fit(tiny_shards, runs, f"--budget.tokens={40 * step}", "--trainer.max_steps=1000", every=20))
    (run_dir,) = (runs / "quickstart").iterdir()
    first = json.loads((run_dir / "budget.json").read_text())
    assert (first["tokens"], first["steps"], first["tokens_per_step"]) == (40 * step, 40, step)

    # Resume with a larger budget and twice the accumulation: 40 steps of 32 tokens are done, 20 steps of 64 remain.
    ok(fit(tiny_shards, runs, f"--budget.tokens={80 * step}", "--trainer.accumulate_grad_batches=2", "--ckpt_path=last",
           "--trainer.max_steps=1000", every=20))  # fmt: skip
    budget = json.loads((run_dir / "budget.json").read_text())
    attempts = budget["attempts"]
    assert budget["tokens"] == 80 * step and budget["steps"] == 60, budget
    assert budget["budget"]["max_steps"] == 60 and budget["tokens_per_step"] is None, "two rates: see attempts"
    rates = [
        (a["from_step"], a["to_step"], a["tokens_per_step"], a["accumulate_grad_batches"]) for a in budget["attempts"]
    ]
    assert rates == [(0, 40, step, 1), (40, 60, 2 * step, 2)], rates
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["tokens_seen"] == 80 * step

    # The same again trains no step: the attempt is in run.json, budget.json is left exactly as it was.
    before = (run_dir / "budget.json").read_bytes()
    ok(fit(tiny_shards, runs, f"--budget.tokens={80 * step}", "--trainer.accumulate_grad_batches=2", "--ckpt_path=last",
           "--trainer.max_steps=1000", every=20))  # fmt: skip
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert len(attempts) == 3 and attempts[-1]["trained_no_step"] is True and attempts[-1]["status"] == "finished"
    assert (run_dir / "budget.json").read_bytes() == before


def best_state(ckpt: Path) -> dict:
    callbacks = torch.load(ckpt, weights_only=True)["callbacks"]
    (state,) = [v for k, v in callbacks.items() if k.startswith("BestCheckpoint")]
    return state


def best_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("best-*.ckpt"))


def val_losses(run_dir: Path) -> dict[int, float]:
    """{optimizer step: val/loss} of every validation, from the TensorBoard event files (logged at step - 1)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses = {}
    for events in run_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if "val/loss" in acc.Tags()["scalars"]:
            losses.update({e.step + 1: e.value for e in acc.Scalars("val/loss")})
    return losses


@pytest.mark.slow
def test_checkpoints_at_a_validation_step_know_its_best_and_resumes_and_copies_track_the_true_best(
    tiny_shards, tmp_path
):
    runs = tmp_path / "runs"
    ok(fit(tiny_shards, runs, "--trainer.max_steps=9"))  # validations and saves at 3, 6, 9
    (run_dir,) = (runs / "quickstart").iterdir()
    losses = val_losses(run_dir)
    best = min(losses, key=losses.get)
    state = best_state(run_dir / "checkpoints" / "last.ckpt")
    assert Path(state["best_model_path"]).name == f"best-step={best}.ckpt", (state["best_model_path"], losses)
    assert float(state["best_model_score"]) == pytest.approx(losses[best], rel=1e-6)
    for step in (3, 6, 9):  # every periodic file saved at a validation step knows that step's validation
        saved = best_state(run_dir / "checkpoints" / f"step={step:08d}.ckpt")
        assert float(saved["current_score"]) == pytest.approx(losses[step], rel=1e-6)
    assert best_files(run_dir) == [f"best-step={best}.ckpt"]

    # A cp -a copy, resumed with a learning rate that diverges: its own best file stays the tracked best.
    copy = runs / "quickstart" / "copy"
    shutil.copytree(run_dir, copy, symlinks=True)
    original = {p.name: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").iterdir()}
    ok(fit(tiny_shards, runs, f"--ckpt_path={copy / 'checkpoints' / 'last.ckpt'}", "--model.optim.lr=30",
           "--trainer.max_steps=15"))  # fmt: skip
    later = val_losses(copy)
    assert min(later[12], later[15]) > losses[best], "the control: the continuation is worse"
    state = best_state(copy / "checkpoints" / "last.ckpt")
    assert state["best_model_path"] == str(copy / "checkpoints" / f"best-step={best}.ckpt"), state["best_model_path"]
    assert best_files(copy) == [f"best-step={best}.ckpt"], "no orphan, no worse best"
    assert {p.name: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").iterdir()} == original

    # The run itself, resumed at its last validation step from a last.ckpt whose BestCheckpoint state does not know
    # its best (what checkpoints written one validation behind hold), beside a best file from beyond that step (left
    # by an abandoned continuation): the first is tracked again with the score it recorded, the second pruned.
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("BestCheckpoint")]
    checkpoint["callbacks"][key].update(best_k_models={}, best_model_path="", best_model_score=None, kth_value=None)
    last.unlink()  # (a hard link to step=9's file: write a file of its own)
    torch.save(checkpoint, last)
    future = torch.load(run_dir / "checkpoints" / f"best-step={best}.ckpt", weights_only=True)
    future["global_step"] = 99
    torch.save(future, run_dir / "checkpoints" / "best-step=99.ckpt")
    result = fit(tiny_shards, runs, "--ckpt_path=last", "--model.optim.lr=30", "--trainer.max_steps=15")
    ok(result)
    assert "tracking" in result.stdout + result.stderr and "pruned" in result.stdout + result.stderr
    state = best_state(run_dir / "checkpoints" / "last.ckpt")
    assert Path(state["best_model_path"]).name == f"best-step={best}.ckpt", state["best_model_path"]
    assert float(state["best_model_score"]) == pytest.approx(losses[best], rel=1e-6)
    assert best_files(run_dir) == [f"best-step={best}.ckpt"]
