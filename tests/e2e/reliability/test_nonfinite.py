"""NonFiniteGuard: a NaN/Inf planted in one parameter's gradient or in the loss is caught on its step, named, and
the update skipped (parameters and optimizer state untouched) or the run stopped with a checkpoint of the last good
state; without the guard the same NaN destroys the weights."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from lightning_cqk.callbacks import NonFiniteGuard
from lightning_cqk.module import LitLM

BAD_STEP = 4
BAD_PARAM = "model.blocks.1.attn.k_proj.weight"


class NaNGradient(LitLM):
    """At BAD_STEP (and, with `every`, at every later step) one parameter's gradient gets a NaN/Inf element."""

    value, every = float("nan"), False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        step = self.trainer.global_step
        if step == BAD_STEP or (self.every and step > BAD_STEP):
            param = self.get_parameter(BAD_PARAM)

            def poison(grad: torch.Tensor) -> torch.Tensor:
                grad = grad.clone()
                grad[0, 0] = self.value
                return grad

            handle = param.register_hook(poison)
            self._handles = [*getattr(self, "_handles", []), handle]
        return loss

    def on_train_batch_end(self, *args) -> None:
        for handle in getattr(self, "_handles", []):
            handle.remove()
        self._handles = []


class NaNLoss(LitLM):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step == BAD_STEP else loss


class ParamWatch(L.Callback):
    """Per optimizer step: did any parameter change."""

    def __init__(self) -> None:
        self.changed: dict[int, bool] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._before = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        after = list(pl_module.parameters())
        self.changed[trainer.global_step - 1] = any(not torch.equal(a, b) for a, b in zip(self._before, after))


def metric_series(tmp_path: Path, key: str) -> dict[int, float]:
    import csv

    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_skip_names_the_parameter_and_leaves_that_update_out(value, make_module, make_trainer, token_loader, tmp_path):
    guard, watch = NonFiniteGuard(policy="skip"), ParamWatch()
    trainer = make_trainer([guard, watch], max_steps=8)
    NaNGradient.value = value
    module = make_module(NaNGradient)
    with pytest.warns(
        UserWarning,
        match=rf"step {BAD_STEP}: .*non-finite gradients in 1 parameter\(s\), first: "
        rf"{BAD_PARAM}; update skipped",
    ):
        trainer.fit(module, token_loader())
    assert [r["step"] for r in guard.records] == [BAD_STEP]
    assert guard.records[0]["params"] == [BAD_PARAM] and guard.records[0]["num_params"] == 1
    assert watch.changed == {s: s != BAD_STEP for s in range(8)}
    assert int(trainer.optimizers[0].state[module.get_parameter(BAD_PARAM)]["step"]) == 7, "optimizer state untouched"
    assert all(torch.isfinite(p).all() for p in module.parameters())
    record = json.loads((tmp_path / "run" / "nonfinite.json").read_text())
    assert record["skipped"] == 1 and record["stopped_at"] is None and record["steps"][0]["params"] == [BAD_PARAM]
    counts = metric_series(tmp_path, "train/nonfinite_steps")
    assert counts[BAD_STEP - 1] == 0 and counts[BAD_STEP] == 1 and counts[7] == 1


def test_without_the_guard_the_same_nan_destroys_the_weights(make_module, make_trainer, token_loader):
    NaNGradient.value = float("nan")
    module = make_module(NaNGradient)
    make_trainer([], max_steps=6).fit(module, token_loader())
    assert not torch.isfinite(module.get_parameter(BAD_PARAM)).all()


def test_nan_loss_is_caught_and_every_parameter_reported(make_module, make_trainer, token_loader):
    guard = NonFiniteGuard(report_params=3)
    trainer = make_trainer([guard], max_steps=7)
    module = make_module(NaNLoss)
    with pytest.warns(UserWarning, match="loss nan"):
        trainer.fit(module, token_loader())
    (record,) = guard.records
    names = [n for n, _ in module.named_parameters()]
    assert record["step"] == BAD_STEP and record["loss"] == "nan"
    assert record["params"] == names[:3] and record["num_params"] == len(names)
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_stop_saves_the_last_good_state_and_stops(make_module, make_trainer, token_loader, tmp_path):
    guard, watch = NonFiniteGuard(policy="stop"), ParamWatch()
    trainer = make_trainer([guard, watch], max_steps=20)
    NaNGradient.value = float("nan")
    module = make_module(NaNGradient)
    with pytest.warns(UserWarning, match="stopping after a checkpoint of the last good state"):
        trainer.fit(module, token_loader())
    assert trainer.global_step == BAD_STEP + 1 and not watch.changed[BAD_STEP]
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / f"nonfinite-step{BAD_STEP}.ckpt", weights_only=False)
    assert ckpt["global_step"] == BAD_STEP + 1
    for name, p in module.named_parameters():
        assert torch.equal(ckpt["state_dict"][name], p.detach()), "the weights before the bad update"
    assert json.loads((tmp_path / "run" / "nonfinite.json").read_text())["stopped_at"] == BAD_STEP


def test_skip_stops_after_too_many_bad_steps_in_a_row(make_module, make_trainer, token_loader):
    guard = NonFiniteGuard(policy="skip", max_consecutive_skips=3)
    trainer = make_trainer([guard], max_steps=30)
    NaNGradient.value, NaNGradient.every = float("nan"), True
    try:
        with pytest.warns(UserWarning, match="3 in a row"):
            trainer.fit(make_module(NaNGradient), token_loader())
    finally:
        NaNGradient.every = False
    assert [r["step"] for r in guard.records] == [BAD_STEP, BAD_STEP + 1, BAD_STEP + 2]
    assert trainer.global_step == BAD_STEP + 3 and guard.stopped_at == BAD_STEP + 2


def test_under_bf16_mixed(make_module, make_trainer, token_loader):
    guard = NonFiniteGuard()
    trainer = make_trainer([guard], max_steps=6, precision="bf16-mixed")
    NaNGradient.value = float("nan")
    module = make_module(NaNGradient)
    with pytest.warns(UserWarning, match=BAD_PARAM):
        trainer.fit(module, token_loader())
    assert [r["step"] for r in guard.records] == [BAD_STEP]
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_bad_options():
    with pytest.raises(ValueError, match="policy='drop' is not 'skip' or 'stop'"):
        NonFiniteGuard(policy="drop")
    with pytest.raises(ValueError, match="max_consecutive_skips must be >= 1 or null"):
        NonFiniteGuard(max_consecutive_skips=0)
