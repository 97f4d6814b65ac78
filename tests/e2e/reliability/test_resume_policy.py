"""The resume policy is one list (`run_dir.RESUME_POLICY`): the check, the refusal's table and docs/reliability.md's
table are made from it, so the message a refused resume prints cannot drift from what the check enforces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tiny_run import tiny_args

from lightning_cqk.cli import main
from lightning_cqk.run.directory import (
    RESUME_POLICY,
    ResumeRefused,
    classify_changes,
    policy_markdown,
    policy_table,
)

REPO = Path(__file__).resolve().parents[3]


def _example(pattern: str) -> str:
    return pattern.replace("*", "anything")


def test_the_check_allows_exactly_the_table():
    changes = {_example(p): (1, 2) for patterns, _ in RESUME_POLICY for p in patterns}
    refused_ones = {"model.config.n_layer": (1, 2), "data.seq_len": (1, 2), "model.optim.logit_control.method": (1, 2)}
    allowed, refused = classify_changes({**changes, **refused_ones})
    assert set(allowed) == set(changes) and set(refused) == set(refused_ones)
    table = policy_table()
    for patterns, how in RESUME_POLICY:
        assert patterns[0] in table and how in table
        assert all(p.rsplit(".", 1)[-1] in table for p in patterns)


def test_docs_show_the_table_the_check_uses():
    docs = (REPO / "docs" / "reliability.md").read_text()
    assert policy_markdown() in docs, (
        "docs/reliability.md's 'What a resume may change' table differs from run_dir.RESUME_POLICY; paste "
        "`python -c 'from lightning_cqk.run.directory import policy_markdown; print(policy_markdown())'` there"
    )


def test_a_refused_resume_prints_the_table(tiny_shards: Path, tmp_path: Path, monkeypatch):
    """A real `fit`, then the same run resumed with another architecture: refused, with the policy table."""
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    args = tiny_args(tiny_shards, tmp_path / "runs", "--trainer.max_steps=1", "--trainer.limit_val_batches=0")
    main(["fit", *args])
    (run,) = (tmp_path / "runs" / "quickstart").iterdir()
    ckpt = run / "checkpoints" / "last.ckpt"  # RunCheckpoint (the quickstart's stack) writes it when training ends
    with pytest.raises(ResumeRefused) as refusal:
        main(["fit", *args, f"--ckpt_path={ckpt}", "--model.config.n_head=4"])  # the tiny run has 2
    message = str(refusal.value)
    assert "model.config.n_head" in message and policy_table() in message
