"""The GPU suite's sync probe (issue 32 item 1), run on CPU as plumbing: the window of sync debug mode "error" is
lifted exactly around the shipped callbacks' one documented host read per optimizer step (`StepReads.read`), so the
GPU test fails on any other synchronisation and no longer on that read."""

from __future__ import annotations

import sys
from pathlib import Path

from tiny_run import REPO, tiny_args

from lightning_cqk.callbacks.step_reads import StepReads

sys.path.insert(0, str(REPO / "tests" / "gpu"))


def test_the_sync_window_opens_only_for_the_one_documented_read_per_step(
    tiny_shards: Path, tmp_path: Path, monkeypatch
):
    from sync_probe import SyncErrorSteps

    from lightning_cqk.cli.trainer import CQKCLI

    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    schedule = ["--trainer.max_steps=7", "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1000"]
    args = tiny_args(tiny_shards, tmp_path / "runs", *schedule)
    cli = CQKCLI(args=args, run=False)
    modes: list[str] = []
    probe = SyncErrorSteps(first=1, last=5, set_mode=modes.append)
    cli.trainer.callbacks.append(probe)
    original = StepReads.read
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert StepReads.read is original, "the probe puts the read back"
    assert probe.checked == 5
    assert sorted(probe.reads) == [1, 2, 3, 4, 5] and set(probe.reads.values()) == {1}, dict(probe.reads)
    assert modes == ["error", "default", "error", "default"] * 5, modes
