"""LossSpikeMonitor: a planted spike is found exactly once at its step; skip and stop act on that step only."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch

from lightning_cqk.callbacks import GradNormMonitor, LossSpikeMonitor
from lightning_cqk.module import LitLM

SPIKE_STEP = 7


class PlantedSpike(LitLM):
    """LitLM whose loss at optimizer step SPIKE_STEP is multiplied by `factor` (gradients too)."""

    factor = 10.0

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * self.factor if self.trainer.global_step == SPIKE_STEP else loss


class ParamWatch(L.Callback):
    """Per step: did any parameter change, and the AdamW step count of the first parameter."""

    def __init__(self) -> None:
        self.changed: dict[int, bool] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._before = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        after = list(pl_module.parameters())
        self.changed[trainer.global_step - 1] = any(not torch.equal(a, b) for a, b in zip(self._before, after))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "ratio", "statistic": "ema"},
        {"mode": "ratio", "statistic": "window", "window": 4},
        {"mode": "zscore", "statistic": "ema"},
        {"mode": "zscore", "statistic": "window", "window": 5},
    ],
    ids=lambda k: f"{k['mode']}-{k['statistic']}",
)
def test_planted_spike_found_once_at_its_step(kwargs, make_module, make_trainer, tmp_path, token_loader):
    monitor = LossSpikeMonitor(warmup_steps=3, every_n_steps=2, **kwargs)
    trainer, logger = make_trainer([monitor], max_steps=14)
    trainer.fit(make_module(module_class=PlantedSpike), token_loader())
    assert [s["step"] for s in monitor.spikes] == [SPIKE_STEP]
    spike = monitor.spikes[0]
    assert spike["loss"] > 5 * spike["reference"] or kwargs["mode"] == "zscore"
    counts = logger.series("train/spikes")
    assert sorted(counts) == [1, 3, 5, 7, 9, 11, 13]
    assert [counts[s] for s in sorted(counts)] == [0, 0, 0, 1, 1, 1, 1], "cumulative count, from the spike's step"
    assert "train/skipped_updates" not in logger.at(7), "action=log skips nothing"
    record = json.loads((tmp_path / "run" / "spikes.json").read_text())
    assert [s["step"] for s in record["spikes"]] == [SPIKE_STEP] and record["skipped"] == []


def test_planted_spike_under_bf16_mixed(make_module, make_trainer, token_loader):
    monitor = LossSpikeMonitor(warmup_steps=3, action="skip")
    trainer, _ = make_trainer([monitor], max_steps=10, precision="bf16-mixed")
    trainer.fit(make_module(module_class=PlantedSpike), token_loader())
    assert [s["step"] for s in monitor.spikes] == [SPIKE_STEP] and len(monitor.skipped) == 1
    assert all(torch.isfinite(p).all() for p in trainer.lightning_module.parameters())


def test_no_spike_without_one(make_module, make_trainer, token_loader):
    monitor = LossSpikeMonitor(warmup_steps=3, mode="zscore")
    trainer, _ = make_trainer([monitor], max_steps=14)
    trainer.fit(make_module(), token_loader())
    assert monitor.spikes == []


def test_skip_leaves_parameters_unchanged_at_that_step_only(make_module, make_trainer, token_loader):
    watch = ParamWatch()
    monitor = LossSpikeMonitor(warmup_steps=3, action="skip")
    trainer, logger = make_trainer([monitor, watch], max_steps=10)
    module = make_module(module_class=PlantedSpike)
    trainer.fit(module, token_loader())
    assert [s["step"] for s in monitor.spikes] == [SPIKE_STEP]
    assert watch.changed == {s: s != SPIKE_STEP for s in range(10)}
    state = trainer.optimizers[0].state[next(module.parameters())]
    assert int(state["step"]) == 9, "the skipped step left the optimizer state alone too"
    assert logger.series("train/skipped_updates")[9] == 1
    assert monitor.skipped == [
        {"step": SPIKE_STEP, "reason": "spike", "loss": pytest.approx(monitor.spikes[0]["loss"])}
    ]


def test_stop_checkpoints_and_stops(make_module, make_trainer, tmp_path, token_loader):
    watch = ParamWatch()
    monitor = LossSpikeMonitor(warmup_steps=3, action="stop")
    trainer, _ = make_trainer([monitor, watch], max_steps=20)
    trainer.fit(make_module(module_class=PlantedSpike), token_loader())
    assert trainer.global_step == SPIKE_STEP + 1, "the spiking step ran (without an update), then training stopped"
    assert not watch.changed[SPIKE_STEP]
    ckpt = tmp_path / "run" / "checkpoints" / f"spike-step{SPIKE_STEP}.ckpt"
    assert ckpt.is_file()
    assert torch.load(ckpt, weights_only=False)["global_step"] == SPIKE_STEP + 1


def test_grad_norm_rule_skips_and_counts(make_module, make_trainer, token_loader):
    """Planted loss x1000 -> gradients x1000: only that step's pre-clip norm exceeds the threshold."""

    class BigSpike(PlantedSpike):
        factor = 1000.0

    watch, norms = ParamWatch(), GradNormMonitor(every_n_steps=1)
    monitor = LossSpikeMonitor(warmup_steps=3, max_grad_norm=50.0)
    trainer, logger = make_trainer([norms, monitor, watch], max_steps=10, gradient_clip_val=1.0)
    trainer.fit(make_module(module_class=BigSpike), token_loader())
    grad_norms = logger.series("train/grad_norm/total")
    assert grad_norms[SPIKE_STEP] > 50 and max(v for s, v in grad_norms.items() if s != SPIKE_STEP) < 50
    assert [(s["step"], s["reason"]) for s in monitor.skipped] == [(SPIKE_STEP, "grad_norm")]
    assert monitor.skipped[0]["grad_norm"] == pytest.approx(grad_norms[SPIKE_STEP], rel=1e-5)
    assert watch.changed == {s: s != SPIKE_STEP for s in range(10)}
    assert logger.series("train/skipped_updates")[9] == 1
    assert [s["step"] for s in monitor.spikes] == [SPIKE_STEP], "the loss spike is still recorded"


def test_bad_options():
    with pytest.raises(ValueError, match="mode"):
        LossSpikeMonitor(mode="max")
    with pytest.raises(ValueError, match="action"):
        LossSpikeMonitor(action="panic")
