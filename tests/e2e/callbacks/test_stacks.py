"""The callback stacks in callbacks/*.yaml parse and build with the CLI; budgets work from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from tiny_run import tiny_args

from lightning_cqk.callbacks import TokenBudget
from lightning_cqk.cli import main
from lightning_cqk.cli.trainer import CQKCLI

REPO = Path(__file__).resolve().parents[3]
STACKS = sorted((REPO / "callbacks").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def overrides(tmp_path: Path, shards: Path, *configs: Path, steps: int = 50) -> list[str]:
    """The tiny run (with `configs` after the quickstart) at 4 windows a step, validating once at most."""
    return tiny_args(
        shards,
        tmp_path / "runs",
        "--data.batch_size=4",
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=1000",
        "--trainer.limit_val_batches=1",
        configs=configs,
    )


def test_there_are_stacks():
    assert {p.name for p in STACKS} >= {"stability.yaml", "compute_matched.yaml"}


@pytest.mark.parametrize("stack", STACKS, ids=lambda p: p.name)
def test_stack_builds_with_the_cli(stack: Path, tmp_path: Path, tiny_shards: Path):
    cli = CQKCLI(args=overrides(tmp_path, tiny_shards, stack), run=False)
    listed = [c["class_path"].rsplit(".", 1)[-1] for c in yaml.safe_load(stack.read_text())["trainer"]["callbacks"]]
    built = [type(c).__name__ for c in cli.trainer.callbacks]
    assert all(name in built for name in listed), (listed, built)
    assert any(isinstance(c, ModelCheckpoint) for c in cli.trainer.callbacks), "a stack is a complete list"
    assert any(isinstance(c, LearningRateMonitor) for c in cli.trainer.callbacks)
    assert sum(isinstance(c, TokenBudget) for c in cli.trainer.callbacks) == 1, "the always-present budget group"


def test_stability_config_uses_the_stability_stack():
    config = yaml.safe_load((REPO / "configs" / "stability.yaml").read_text())
    stack = yaml.safe_load((REPO / "callbacks" / "stability.yaml").read_text())
    assert config["trainer"]["callbacks"] == stack["trainer"]["callbacks"]


def test_budget_from_the_command_line_and_match_to(tmp_path: Path, tiny_shards: Path):
    base = ["fit", *overrides(tmp_path, tiny_shards, REPO / "callbacks" / "compute_matched.yaml")]
    main([*base, "--trainer.logger.init_args.name=ref", "--budget.tokens=200"])  # 64 tokens per step: 3 steps
    run = "standard-tiny-L1-H2-d16-ff32-s1337"  # the tiny run's shape is in the run's name
    ref = tmp_path / "runs" / "ref" / run
    recorded = json.loads((ref / "budget.json").read_text())
    assert (recorded["steps"], recorded["tokens"]) == (3, 192)
    main([*base, "--trainer.logger.init_args.name=matched", f"--budget.match_to={ref}", "--budget.ratio=2"])
    matched = json.loads((tmp_path / "runs" / "matched" / run / "budget.json").read_text())
    assert (matched["steps"], matched["tokens"]) == (6, 384)
