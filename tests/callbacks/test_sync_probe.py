"""The GPU suite's sync probe (issue 32 item 1), run on CPU as plumbing: the window of sync debug mode "error" is
lifted exactly around the shipped callbacks' one documented host read per optimizer step (`StepReads.read`), so the
GPU test fails on any other synchronisation and no longer on that read."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_cqk.callbacks.step_reads import StepReads

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))


def test_the_sync_window_opens_only_for_the_one_documented_read_per_step(
    tiny_shards: Path, tmp_path: Path, monkeypatch
):
    from sync_probe import SyncErrorSteps

    from lightning_cqk.cli.trainer import CQKCLI

    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    args = [
        "--config", str(REPO / "configs" / "quickstart.yaml"), f"--data.data_dir={tiny_shards}",
        "--data.source=null", "--data.seq_len=16", "--data.batch_size=2", "--model.config.n_layer=1",
        "--model.config.n_embd=16", "--model.config.n_head=2", "--trainer.max_steps=7",
        "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1000", "--trainer.enable_progress_bar=false",
        "--trainer.accelerator=cpu", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--model.optim.warmup_steps=1",
    ]  # fmt: skip
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
