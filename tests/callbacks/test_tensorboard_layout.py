"""`lightning_cqk fit`'s TensorBoard logger (issue 26): no `epoch` chart, and a custom-scalars layout that puts the
loss, val/ppl, the gradient norms and the learning rate first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_cqk.callbacks.tensorboard import LAYOUT, to_summary_layout
from lightning_cqk.cli import main
from lightning_cqk.data import prepare

REPO = Path(__file__).resolve().parents[2]


def test_the_layout_names_the_curves_to_read_first():
    first = LAYOUT[next(iter(LAYOUT))]
    assert list(first) == ["loss (train/loss, val/loss)", "val/ppl", "gradient norms", "learning rate"]
    summary = to_summary_layout(LAYOUT)
    assert summary["1 read first"]["loss (train/loss, val/loss)"] == ["Multiline", ["(train/loss$)|(val/loss$)"]]


def test_fit_logs_no_epoch_and_writes_the_layout(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    with (tmp_path / "corpus.jsonl").open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"Document {i}. " + "Values follow the weights. " * (2 + i % 4)}) + "\n")
    prepare(str(tmp_path / "corpus.jsonl"), str(tmp_path / "shards"), val_fraction=0.2)
    callbacks = [{"class_path": "lightning_cqk.callbacks.GradNormMonitor"}]
    (tmp_path / "cb.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "quickstart.yaml"),
            "--config",
            str(tmp_path / "cb.yaml"),
            f"--data.data_dir={tmp_path / 'shards'}",
            "--data.source=null",
            "--data.seq_len=16",
            "--data.batch_size=2",
            "--model.config.n_layer=1",
            "--model.config.n_embd=16",
            "--model.config.n_head=2",
            "--model.optim.warmup_steps=1",
            "--trainer.max_steps=2",
            "--trainer.log_every_n_steps=1",
            "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.accelerator=cpu",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        ]
    )
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
