"""Mistakes a newcomer makes in the first hour (issue 35 item 4), through the real `lightning_cqk fit` command: each
ends in one paragraph that names the fix (no traceback), and the fix works when pasted."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import child_env, tiny_command

from lightning_cqk.cli.main import join_negative_values
from lightning_cqk.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[2]


def fit(tmp_path: Path, shards: Path, *extra: str) -> subprocess.CompletedProcess:
    env = child_env(LIGHTNING_CQK_LOG_DIR=str(tmp_path / "log"))
    args = tiny_command(shards, tmp_path / "runs", "--trainer.max_steps=1", *extra)
    return subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def one_paragraph(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("lightning_cqk fit: ")]
    return line


@pytest.mark.slow
def test_a_width_that_heads_do_not_divide_names_both_fixes_without_a_traceback(tiny_shards, tmp_path):
    said = one_paragraph(fit(tmp_path, tiny_shards, "--model.config.n_embd", "130", "--model.config.n_head", "4"))
    assert "n_embd=130 is not divisible by n_head=4" in said
    assert "--model.config.n_head 5" in said and "--model.config.n_embd 128" in said
    base = dict(n_layer=1, block_size=8, vocab_size=256)
    assert ModelConfig(n_embd=130, n_head=5, **base).head_size == 26  # the pasted fixes build
    assert ModelConfig(n_embd=128, n_head=4, **base).head_size == 32


@pytest.mark.slow
def test_a_missing_source_is_named_before_the_shards_it_does_not_match(tiny_shards, tmp_path):
    said = one_paragraph(fit(tmp_path, tiny_shards, f"--data.source={tmp_path / 'typo.jsonl'}"))
    assert said.startswith(f"lightning_cqk fit: Text source '{tmp_path / 'typo.jsonl'}' does not exist."), said
    assert "does not match the shards" not in said and "--data.source null" in said


@pytest.mark.slow
def test_a_negative_number_after_a_flag_is_its_value(tiny_shards, tmp_path):
    said = one_paragraph(fit(tmp_path, tiny_shards, "--model.optim.lr", "-1e-3"))
    assert "optim.lr=-0.001 is not allowed" in said  # parsed as the value, then refused for what it is


def test_negative_values_are_joined_to_their_flag_and_nothing_else_is():
    assert join_negative_values(["fit", "--model.optim.lr", "-1e-3", "--trainer.max_steps", "-1"]) == [
        "fit", "--model.optim.lr=-1e-3", "--trainer.max_steps=-1"]  # fmt: skip
    kept = ["fit", "--model.optim.lr=-1e-3", "--print_config", "-h", "--a", "--b", "-", "--c", "-x"]
    assert join_negative_values(kept) == kept


@pytest.mark.slow
def test_a_run_that_would_train_for_days_says_so_with_a_gpu_and_a_cpu_size_command_that_works(tmp_path):
    """Issue 35 item 1: the card's PubMed job sat at step 0 of 9,155 on a CPU with no word of its length. The limit
    is lowered so that a tiny run crosses it; the printed CPU-size command is then run as pasted."""
    env = child_env(LIGHTNING_CQK_LONG_RUN_HOURS="0.000001")
    source = tmp_path / "corpus.jsonl"  # enough text for the CPU-size recipe's 128-token windows
    source.write_text("".join(json.dumps({"text": f"Abstract {i}. " + "Keys meet queries. " * (20 + i % 7)}) + "\n"
                              for i in range(300)))  # fmt: skip
    args = ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), f"--data.data_dir={tmp_path / 'shards'}",
            f"--data.source={source}", "--data.val_fraction=0.2", "--trainer.max_steps=4",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "lightning_cqk", *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (said,) = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "at this pace" in line]
    assert "s per micro-batch, 2 optimizer steps left" in said and "LIGHTNING_CQK_LONG_RUN_HOURS" in said
    gpu = said.split("torchrun ", 1)[1].split(". At CPU size", 1)[0]
    assert gpu.startswith("--standalone --nproc_per_node 8 -m lightning_cqk fit --config ")
    assert gpu.endswith("--trainer.devices 8 --trainer.strategy ddp")
    cpu = said.split("#a-paper-config-at-cpu-size): ", 1)[1].split(". (This note", 1)[0]
    pasted = shlex.split(cpu)
    assert pasted[:2] == ["lightning_cqk", "fit"] and "--trainer.max_steps" in pasted
    env.pop("LIGHTNING_CQK_LONG_RUN_HOURS")
    small = subprocess.run([sys.executable, "-m", *pasted], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert small.returncode == 0, small.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "quickstart").glob("standard-tiny-L2-*")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 200, summary
