"""`lightning_cqk fit`'s TensorBoard logger (issue 26): no `epoch` chart, and a custom-scalars layout that puts the
loss, val/ppl, the gradient norms and the learning rate first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_run import callbacks_config, tiny_fit

from lightning_cqk.callbacks.tensorboard import LAYOUT, to_summary_layout
from lightning_cqk.cli import main


def test_the_layout_names_the_curves_to_read_first():
    first = LAYOUT[next(iter(LAYOUT))]
    assert list(first) == ["loss (train/loss, val/loss)", "val/ppl", "gradient norms", "learning rate"]
    summary = to_summary_layout(LAYOUT)
    assert summary["1 read first"]["loss (train/loss, val/loss)"] == ["Multiline", ["(train/loss$)|(val/loss$)"]]


def test_fit_logs_no_epoch_and_writes_the_layout(tiny_shards: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    cb = callbacks_config(tmp_path / "cb.yaml", [{"class_path": "lightning_cqk.callbacks.GradNormMonitor"}])
    schedule = ["--trainer.max_steps=2", "--trainer.log_every_n_steps=1", "--trainer.val_check_interval=2"]
    main(tiny_fit(tiny_shards, tmp_path / "runs", *schedule, "--trainer.limit_val_batches=1", configs=[cb]))
    (run_dir,) = (tmp_path / "runs" / "quickstart").iterdir()
    events = EventAccumulator(str(run_dir))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "val/loss", "val/ppl"} <= scalars and any(t.startswith("train/grad_norm/") for t in scalars)
    assert "epoch" not in scalars
    layout = events.Tags()["tensors"]
    assert "custom_scalars__config__" in layout
    from tensorboard.plugins.custom_scalar import layout_pb2

    written = layout_pb2.Layout()
    written.ParseFromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {chart.title for category in written.category for chart in category.chart}
    assert "gradient norms" in charts and "loss (train/loss, val/loss)" in charts  # GradNormMonitor was added
    assert not charts & {"throughput", "attention entropy"}, "no chart that no callback of the run logs"


def test_the_layout_keeps_the_charts_of_the_callbacks_present_and_drops_empty_categories():
    from lightning.pytorch.callbacks import LearningRateMonitor

    from lightning_cqk.callbacks import GradNormMonitor, Throughput
    from lightning_cqk.callbacks.tensorboard import layout_for

    bare = layout_for([])
    assert list(bare) == ["1 read first"] and list(bare["1 read first"]) == ["loss (train/loss, val/loss)", "val/ppl"]
    full = layout_for([GradNormMonitor(), LearningRateMonitor(), Throughput()])
    assert list(full["1 read first"]) == list(LAYOUT["1 read first"]) and list(full["2 instruments"]) == ["throughput"]


@pytest.mark.parametrize("metrics", [{"epoch": 3}, {}])
def test_a_dict_of_nothing_but_epoch_writes_nothing(tmp_path: Path, metrics):
    from lightning_cqk.callbacks.tensorboard import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path), name="x", version="v")
    logger.log_metrics(metrics, step=1)
    assert not logger._layout_written and not (tmp_path / "x" / "v").exists()
