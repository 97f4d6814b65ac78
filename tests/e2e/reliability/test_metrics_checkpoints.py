"""Issue 13 classes 1, 2 and 10 (metrics and checkpoints): a non-finite validation shows as non-finite (val/loss,
val/ppl, val/bpb), is named in the run summary, and is never kept as the best checkpoint; checkpoint retention only
deletes files in its own folder (a run resumed from another run's last.ckpt, a `cp -a` copy of a run);
`val_check_interval: 0` is refused before any step; a resume that trains no step prints no rate; a finite but
explosive update (weights of 1e9), which the NaN checks cannot see, is rolled back by NonFiniteGuard(max_abs_weight)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from tiny_run import tiny_trainer

from lightning_cqk.callbacks import AtomicCheckpointIO, BestCheckpoint, NonFiniteGuard, RunCheckpoint, RunSummary
from lightning_cqk.callbacks.nonfinite import max_abs
from lightning_cqk.module import LitLM


def steps_on_disk(folder: Path) -> list[int]:
    return sorted(int(p.stem.split("=")[1]) for p in folder.glob("step=*.ckpt"))


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """name -> (inode, mtime_ns) of every file: any deletion or rewrite changes it."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------------------- class 1: non-finite validation
class PoisonAfter(L.Callback):
    """At the end of optimizer step `step`, a diverged model: a NaN in one weight, or a final norm scaled by 1e6 (a
    finite val/loss of millions of nats, whose val/ppl overflows to inf)."""

    def __init__(self, step: int, kind: str) -> None:
        self.step, self.kind = step, kind

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                if self.kind == "nan_weight":
                    pl_module.model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
                else:
                    pl_module.model.norm_f.weight.mul_(1e6)


class PartlyNaNValidation(LitLM):
    """One validation batch of several scores NaN (the rest finite): the sum must not drop it."""

    def validation_step(self, batch, batch_idx):
        if batch_idx == 1 and self.trainer.global_step >= 4:
            self.val_nll.update(torch.tensor(float("nan")))
        return super().validation_step(batch, batch_idx)


@pytest.mark.parametrize("trigger", ["nan_weight", "partly_nan_batches", "overflowing_ppl"])
def test_a_non_finite_validation_is_non_finite_named_and_never_best(
    trigger, make_module, make_trainer, token_loader, tmp_path, capsys
):
    callbacks = [RunSummary(), RunCheckpoint(every_n_steps=2, keep_last=None), BestCheckpoint(filename="best-{step}")]
    if trigger == "partly_nan_batches":
        module = make_module(PartlyNaNValidation)
    else:
        callbacks.append(PoisonAfter(step=3, kind=trigger))
        module = make_module()
    trainer = make_trainer(
        callbacks, max_steps=6, enable_checkpointing=True, val_check_interval=2, limit_val_batches=3,
        check_val_every_n_epoch=None, num_sanity_val_steps=0,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="BestCheckpoint: step 4: .*not kept as best"):
        trainer.fit(module, token_loader(), token_loader(4))
    assert math.isinf(trainer.callback_metrics["val/ppl"]) or math.isnan(trainer.callback_metrics["val/ppl"])
    if trigger == "overflowing_ppl":  # a finite but absurd loss: the ppl overflow is what marks the divergence
        assert 100 < float(trainer.callback_metrics["val/loss"]) < float("inf")
    # The log has the finite validation at step 2 and non-finite ones from step 4 on (no 0.0, no 1.0).
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    column = "val/ppl" if trigger == "overflowing_ppl" else "val/loss"
    values = [float(r.split(",")[header.index(column)]) for r in rows[1:] if r.split(",")[header.index(column)]]
    assert len(values) == 3 and math.isfinite(values[0]) and not any(math.isfinite(v) for v in values[1:])
    # Best checkpoint: the finite step-2 model, never a diverged one.
    (best,) = [c for c in trainer.callbacks if isinstance(c, BestCheckpoint)]
    assert Path(best.best_model_path).name == "best-step=2.ckpt"
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("best*")) == ["best-step=2.ckpt"]
    # Named in the summary (printed and summary.json).
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["nonfinite_validations"] == [4, 6] and summary["last_validation"]["val/ppl"] in ("nan", "inf")
    assert "NON-FINITE validation at step(s) 4, 6" in capsys.readouterr().out


def test_val_bpb_is_non_finite_with_the_loss(make_module, token_loader):
    module = make_module()
    module._token_bytes = torch.ones(64, dtype=torch.long)  # every token one byte
    trainer = tiny_trainer()
    with torch.no_grad():
        module.model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
    metrics = trainer.validate(module, token_loader(2), verbose=False)[0]
    assert all(math.isnan(metrics[k]) for k in ("val/loss", "val/ppl", "val/bpb")), metrics


# --------------------------------------------------------------------- class 2: retention only deletes its own files
def run(make_trainer, token_loader, module, folder: Path, max_steps: int, keep_last: int, ckpt=None) -> L.Trainer:
    callback = RunCheckpoint(every_n_steps=2, keep_last=keep_last, dirpath=str(folder))
    trainer = make_trainer(
        [callback], max_steps=max_steps, enable_checkpointing=True, plugins=[AtomicCheckpointIO()],
        default_root_dir=str(folder.parent),
    )  # fmt: skip
    trainer.fit(module, token_loader(), ckpt_path=ckpt)
    return trainer


def test_resuming_from_another_runs_checkpoint_never_deletes_its_files(
    make_module, make_trainer, token_loader, tmp_path
):
    a = tmp_path / "A" / "checkpoints"
    run(make_trainer, token_loader, make_module(), a, max_steps=6, keep_last=2)
    assert steps_on_disk(a) == [4, 6]
    before = snapshot(a)
    b = tmp_path / "B" / "checkpoints"
    run(make_trainer, token_loader, make_module(), b, max_steps=12, keep_last=1, ckpt=str(a / "last.ckpt"))
    assert snapshot(a) == before, "run B deleted or rewrote run A's checkpoints"
    assert steps_on_disk(b) == [12], "B applies keep_last=1 to its own files"


def test_a_copied_run_prunes_its_own_copies_only(make_module, make_trainer, token_loader, tmp_path):
    a = tmp_path / "A" / "checkpoints"
    run(make_trainer, token_loader, make_module(), a, max_steps=6, keep_last=2)
    subprocess.run(["cp", "-a", str(tmp_path / "A"), str(tmp_path / "C")], check=True)
    before = snapshot(a)
    c = tmp_path / "C" / "checkpoints"
    run(make_trainer, token_loader, make_module(), c, max_steps=10, keep_last=2, ckpt=str(c / "last.ckpt"))
    assert snapshot(a) == before, "the copy deleted or rewrote the original run's checkpoints"
    assert steps_on_disk(c) == [8, 10], "the copy prunes its own copies (steps 4, 6) by name"


# ------------------------------------------------------------------------------------------------ class 10
def test_val_check_interval_zero_is_refused_before_any_step(make_module, make_trainer, token_loader):
    module = make_module()
    trainer = make_trainer([], max_steps=3, val_check_interval=0, limit_val_batches=2, check_val_every_n_epoch=None)
    with pytest.raises(ValueError, match=r"val_check_interval is 0.*--trainer.limit_val_batches 0"):
        trainer.fit(module, token_loader(), token_loader(2))
    assert trainer.global_step == 0 and module.tokens_seen == 0
    # The suggested fix works: validation off.
    trainer = make_trainer([], max_steps=2, val_check_interval=0, limit_val_batches=0, check_val_every_n_epoch=None)
    trainer.fit(module, token_loader(), token_loader(2))
    assert trainer.global_step == 2


def test_val_check_interval_inside_an_accumulation_is_refused(make_module, make_trainer, token_loader):
    """Lightning counts an integer val_check_interval in training batches: 3 batches with accumulation 2 would
    validate half-way through an optimizer step. Refused with the interval that means whole steps."""
    module = make_module()
    settings = dict(val_check_interval=3, accumulate_grad_batches=2, limit_val_batches=1, check_val_every_n_epoch=None)
    trainer = make_trainer([], max_steps=4, **settings)
    with pytest.raises(ValueError, match=r"not a multiple of trainer.accumulate_grad_batches=2.*val_check_interval 4"):
        trainer.fit(module, token_loader(), token_loader(2))
    assert trainer.global_step == 0


def test_a_resume_that_trains_no_step_prints_no_rate(make_module, make_trainer, token_loader, tmp_path, capsys):
    run(make_trainer, token_loader, make_module(), tmp_path / "A" / "checkpoints", max_steps=4, keep_last=1)
    capsys.readouterr()
    summary = RunSummary()
    trainer = make_trainer([summary], max_steps=4, default_root_dir=str(tmp_path / "A"))
    trainer.fit(make_module(), token_loader(), ckpt_path=str(tmp_path / "A" / "checkpoints" / "last.ckpt"))
    out = capsys.readouterr().out
    assert "steps 4 | tokens seen 256 | no rate: no optimizer step was trained in this fit" in out, out
    record = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert record["fit"]["steps"] == 0 and record["fit"]["tokens_per_sec"] == "nan" and record["fit"]["rate_note"]


def test_a_resumed_run_prints_its_totals_and_this_attempts_rate_apart(make_module, make_trainer, token_loader,
                                                                      tmp_path, capsys):  # fmt: skip
    """Issue 35 item 5: the whole run's tokens were printed beside only the last attempt's seconds and rate."""
    folder = tmp_path / "A" / "checkpoints"
    first = make_trainer([RunSummary(), RunCheckpoint(every_n_steps=2, keep_last=1, dirpath=str(folder))], max_steps=4,
                         enable_checkpointing=True, default_root_dir=str(folder.parent))  # fmt: skip
    first.fit(make_module(), token_loader())  # as `fit` runs: RunSummary's clock keeps the training seconds
    capsys.readouterr()
    trainer = make_trainer([RunSummary()], max_steps=8, default_root_dir=str(tmp_path / "A"))
    trainer.fit(make_module(), token_loader(), ckpt_path=str(tmp_path / "A" / "checkpoints" / "last.ckpt"))
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "run" / "summary.json").read_text())
    whole, fit = record["train_seconds"], record["fit"]
    assert fit["tokens"] == 256 and record["tokens_seen"] == 512 and whole > fit["train_seconds"]
    expected = (f"steps 8 | tokens seen 512 in {whole:.1f} s of training in all | this attempt: 256 tokens, "
                f"{fit['tokens_per_sec']:,.0f} tokens/s over {fit['train_seconds']:.1f} s of training")  # fmt: skip
    assert expected in out, out


# ------------------------------------------------------------------ class 1: an explosive (finite) update, recovered
class Explode(L.Callback):
    """A finite but explosive update: after optimizer step `step`, one weight matrix is 1e9 everywhere."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.blocks[0].mlp.up_proj.weight.fill_(1e9)


class Capture(L.Callback):
    """The weights right after the guard has acted at `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.weights = step, None

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.step:
            self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


@pytest.mark.parametrize("watch", [False, True])
def test_an_explosive_update_is_rolled_back_to_the_last_good_checkpoint(
    watch, make_module, make_trainer, token_loader, tmp_path
):
    guard = NonFiniteGuard(max_abs_weight=100.0 if watch else None)
    capture = Capture(step=5)
    callbacks = [Explode(step=5), guard, capture, RunCheckpoint(every_n_steps=2, keep_last=None)]
    trainer = make_trainer(callbacks, max_steps=8, enable_checkpointing=True)
    module = make_module(LitLM)
    if not watch:  # the control: the finite explosion passes the NaN/Inf checks and wrecks the model
        trainer.fit(module, token_loader())
        assert not guard.rollbacks and max_abs(module.parameters()) >= 1e8
        return
    with pytest.warns(UserWarning, match=r"step 5: the largest \|weight\| is 1e\+09 > max_abs_weight 100.*rolled back"):
        trainer.fit(module, token_loader())
    folder = Path(trainer.checkpoint_callback.dirpath)
    assert [(r["step"], r["to_step"], r["lr_factor"]) for r in guard.rollbacks] == [(5, 4, 0.5)]
    step4 = torch.load(folder / "step=00000004.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(capture.weights[k], v) for k, v in step4.items()), "weights are step 4's, exactly"
    assert max_abs(module.parameters()) < 100.0 and math.isfinite(float(trainer.callback_metrics["train/loss"]))
    schedule = trainer.lr_scheduler_configs[0].scheduler
    assert schedule.base_lrs == [0.5 * module.optim.lr] * len(schedule.base_lrs), "the learning rate is halved"
    record = json.loads((tmp_path / "run" / "nonfinite.json").read_text())
    assert record["rollbacks"][0]["to_checkpoint"].endswith("step=00000004.ckpt")
