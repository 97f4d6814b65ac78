"""The training step reads nothing from the device outside logging steps and validation (issue 24, item 2).

A `SyncCounter` (tests/e2e/callbacks/sync_counter.py: item, bool, float, int, tolist, numpy, cpu, to(cpu)) is active
from the start of optimizer step FIRST to the start of step LAST of a real `fit` through the CLI with each shipped
callback stack (the quickstart's own list and callbacks/*.yaml), with no logging step and no validation in between. The
reads per optimizer step must stay at the allowance docs/speed.md states: one, NonFiniteGuard's verdict (the update must
be decided before it happens). Before issue 24 the quickstart stack made 3 (the guard's bool, the `train/tokens_seen`
float logged every batch, Lightning's `.item()` of the progress-bar loss), the stacks with gradient-norm rules more.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import pytest
import yaml
from tiny_run import REPO, tiny_args

from lightning_cqk.cli.trainer import CQKCLI

sys.path.insert(0, str(Path(__file__).parent))
from sync_counter import SyncCounter  # noqa: E402

STACKS = [None, *sorted((REPO / "callbacks").glob("*.yaml"))]
FIRST, LAST = 3, 7  # counted steps: [FIRST, LAST)
ALLOWANCE = 1  # reads per optimizer step outside logging steps and validation (docs/speed.md)


class CountSteps(L.Callback):
    """Counts the reads between the start of optimizer step FIRST and the start of step LAST."""

    def __init__(self) -> None:
        self.counter = SyncCounter()
        self.state = "before"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == FIRST and self.state == "before":
            self.counter.__enter__()
            self.state = "counting"
        elif trainer.global_step == LAST and self.state == "counting":
            self.counter.__exit__(None, None, None)
            self.state = "done"


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def count(tmp_path: Path, shards: Path, stack: Path | None, *extra: str) -> SyncCounter:
    schedule = [f"--trainer.max_steps={LAST + 1}", "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=1"]
    # The progress bar stays on: its loss display is a read per step that the allowance must not hide.
    shown = ["--trainer.log_every_n_steps=1000", "--trainer.enable_progress_bar=true"]
    configs = [stack] if stack else []
    args = tiny_args(shards, tmp_path / "runs", "--data.batch_size=4", *schedule, *shown, *extra, configs=configs)
    cli = CQKCLI(args=args, run=False)
    probe = CountSteps()
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == LAST + 1
    return probe.counter


def deciding_stack(folder: Path) -> Path:
    """callbacks/stability.yaml with every rule that decides before the update on: the spike monitor skipping spikes
    and updates above a gradient norm (configs/papers/qkv_sharing), the guard, the gradient-norm instrument."""
    config = yaml.safe_load((REPO / "callbacks" / "stability.yaml").read_text())
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"].endswith("LossSpikeMonitor"):
            callback["init_args"].update(action="skip", max_grad_norm=100.0)
    path = folder / "deciding.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("stack", [*STACKS, "deciding"], ids=lambda p: getattr(p, "name", p or "quickstart"))
def test_a_training_step_reads_the_device_once(stack, tmp_path, tiny_shards, capsys):
    stack = deciding_stack(tmp_path) if stack == "deciding" else stack
    counter = count(tmp_path, tiny_shards, stack)
    per_step = counter.total / (LAST - FIRST)
    with capsys.disabled():
        print(f"\n{stack.name if stack else 'quickstart'}: {per_step:g} reads per step {dict(counter.where)}")
    assert per_step <= ALLOWANCE, dict(counter.where)


def test_accumulation_and_a_terminal_progress_bar_add_no_read(tmp_path, tiny_shards, monkeypatch):
    """Micro-batches between optimizer steps read nothing; the tqdm bar (stdout a terminal) refreshes on log steps."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    counter = count(
        tmp_path,
        tiny_shards,
        None,
        "--trainer.accumulate_grad_batches=3",
        "--trainer.enable_progress_bar=true",
        "--trainer.val_check_interval=999",
    )
    assert counter.total / (LAST - FIRST) <= ALLOWANCE, dict(counter.where)
