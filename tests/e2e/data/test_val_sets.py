"""Two validation sets (`data.final_val_windows`, lightning_cqk/data/val_sets.py): the intermediate validations score
the `limit_val_batches` subset, the final one (at max_steps) the larger set, and the report's final value and
sampling error are the final set's. Also: the default keeps one set, a final set larger than the split is refused,
and the per-window losses taken from the batched forward add up to the logged validation loss."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L
import pytest
from tiny_run import tiny_trainer

from lightning_cqk.callbacks import ValWindowLosses
from lightning_cqk.data import TokenDataModule
from lightning_cqk.errors import ConfigError
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig
from lightning_cqk.study.judge.group_estimates import final, val_sampling_error
from lightning_cqk.study.report.report_read import VAL_WINDOWS, unfinished_reason
from lightning_cqk.study.results_model import Group, StudyData
from lightning_cqk.study.run.run_scalars import read_scalars

SUBSET_BATCHES, BATCH, FINAL = 2, 3, 10  # intermediate: 2 x 3 = 6 windows; final: 10 windows


def _fit(data_dir: Path, root: Path, final_val_windows: int | None, max_steps: int = 4) -> Path:
    L.seed_everything(0)
    dm = TokenDataModule(
        data_dir=str(data_dir),
        source=None,
        seq_len=16,
        batch_size=2,
        val_batch_size=BATCH,
        final_val_windows=final_val_windows,
    )
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=dm.vocab_size)
    model = LitLM(config, OptimConfig(lr=1e-3, warmup_steps=1))
    logger = L.pytorch.loggers.TensorBoardLogger(str(root), name="", version="run")
    trainer = tiny_trainer(
        max_steps=max_steps,
        val_check_interval=2,
        limit_val_batches=SUBSET_BATCHES,
        num_sanity_val_steps=0,
        logger=logger,
        callbacks=[ValWindowLosses()],
        enable_checkpointing=False,
    )
    trainer.fit(model, datamodule=dm)
    return Path(logger.log_dir)


def test_the_final_validation_scores_the_larger_set_and_the_report_reads_it(prepared: Path, tmp_path: Path):
    run = _fit(prepared, tmp_path, final_val_windows=FINAL)
    scalars = read_scalars(run)
    windows = dict(scalars["val/windows"])
    assert windows == {1: SUBSET_BATCHES * BATCH, 3: FINAL}, "step 2: the subset; step 4 (the last): the final set"
    record = json.loads((run / VAL_WINDOWS).read_text())
    assert len(record["nll"]) == FINAL and record["step"] == 4
    final_loss = sum(record["nll"]) / sum(record["tokens"])
    assert final({"scalars": scalars}, "val/loss") == pytest.approx(final_loss, rel=1e-5)
    assert final({"scalars": scalars}, "val/ppl") == pytest.approx(math.exp(final_loss), rel=1e-5)
    assert unfinished_reason(scalars, {"steps": 4}, "val/ppl") == ""
    run_entry = {"seed": 1, "scalars": scalars, "windows": record}
    data = StudyData({"spec": {"metric": "val/ppl"}}, groups={"g": Group(runs=[run_entry])})
    assert val_sampling_error(data)[1] == FINAL, "the sampling error is over the final set's windows"


def test_without_the_option_every_validation_scores_the_same_set(prepared: Path, tmp_path: Path):
    scalars = read_scalars(_fit(prepared, tmp_path, final_val_windows=None))
    assert dict(scalars["val/windows"]) == {1: SUBSET_BATCHES * BATCH, 3: SUBSET_BATCHES * BATCH}


def test_a_final_set_larger_than_the_split_is_refused(prepared: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"final_val_windows=100000: the val split .* only \d+ windows"):
        _fit(prepared, tmp_path, final_val_windows=100_000)


def test_a_tuning_grid_keeps_its_held_out_windows_after_the_final_set(tmp_path: Path, monkeypatch):
    """The verdicts read the final set: a held-out range inside it is refused; the grid runs' own final set must
    reach the held-out end (their val_windows.json is the final validation's)."""
    import copy

    import yaml

    from lightning_cqk.study.design.spec import SpecError, expand
    from tests.unit.study.design.test_tuned_rate import REPO, SPEC

    monkeypatch.chdir(REPO)
    spec = copy.deepcopy(SPEC)
    spec["profiles"]["cpu"]["overrides"]["data.final_val_windows"] = 48  # the verdicts: windows 0-47
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=r"overlaps the verdicts' validation windows \[0, 48\)"):
        expand(path, "cpu")
    spec["profiles"]["cpu"]["tuning"]["held_out"] = [48, 80]
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=r"validate on 48 windows, fewer than held_out's end 80.*final_val_windows: 80"):
        expand(path, "cpu")
    spec["profiles"]["cpu"]["tuning"]["overrides"]["data.final_val_windows"] = 80
    path.write_text(yaml.safe_dump(spec))
    assert expand(path, "cpu").runs


def test_per_window_losses_leave_the_validation_loss_bit_for_bit():
    """The final validation's per-window losses (for val_windows.json) come from the batched forward, and the summed
    loss it logs is the one `loss(batch, "sum")` gives, to the last bit."""
    import torch

    L.seed_everything(0)
    model = LitLM(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=257), OptimConfig())
    batch = torch.randint(0, 257, (5, 17))
    with torch.no_grad():
        nll, n, per_window = model._loss_per_window(batch)
        expected, n_expected = model.loss(batch, reduction="sum")
    assert torch.equal(nll, expected) and n == n_expected and per_window.shape == (5,)
    assert float(per_window.sum()) == pytest.approx(float(nll), rel=1e-6)
