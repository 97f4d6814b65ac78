"""TokenBudget: token / FLOP / wall-clock budgets stop where they say, match_to reproduces budget x ratio."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest

from lightning_cqk.callbacks import RunSummary, TokenBudget
from lightning_cqk.data import TokenDataModule
from lightning_cqk.model.flops import training_flops_per_batch
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

BATCH, SEQ = 4, 16  # the conftest loaders' shapes
TOKENS_PER_STEP = BATCH * SEQ  # 64


@pytest.fixture
def fit(make_trainer, tiny_config, token_loader):
    """fit(budget, attention, max_steps, **trainer kwargs) -> (trainer, module, logger) on random tokens."""

    def run(budget: TokenBudget, attention: str = "standard", max_steps: int = 100, **kwargs):
        L.seed_everything(0, verbose=False)
        module = LitLM(tiny_config(attention), OptimConfig(lr=1e-3, warmup_steps=2, min_lr_ratio=0.1))
        trainer, logger = make_trainer([budget], max_steps=max_steps, **kwargs)
        trainer.fit(module, token_loader(n_batches=64))
        return trainer, module, logger

    return run


@pytest.mark.parametrize("tokens", [5 * TOKENS_PER_STEP, 5 * TOKENS_PER_STEP + 63])
def test_token_budget_stops_at_whole_steps_within_it(tokens, fit):
    budget = TokenBudget(tokens=tokens, batch_size=BATCH, seq_len=SEQ)
    trainer, module, _ = fit(budget)
    assert trainer.global_step == 5 and budget.max_steps == 5
    assert module.tokens_seen == 5 * TOKENS_PER_STEP <= tokens
    schedule = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
    assert schedule(5) == pytest.approx(0.1) and schedule(4) > 0.1, "the cosine decays over exactly the budget"


def test_token_budget_reads_the_datamodule(tiny_shards, make_trainer, tiny_config):
    L.seed_everything(0, verbose=False)
    data = TokenDataModule(data_dir=str(tiny_shards), source=None, seq_len=SEQ, batch_size=BATCH)
    module = LitLM(tiny_config(vocab_size=data.vocab_size), OptimConfig(lr=1e-3, warmup_steps=2))
    budget = TokenBudget(tokens=3 * TOKENS_PER_STEP)
    trainer, _ = make_trainer([budget], max_steps=100)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 3 and module.tokens_seen == 3 * TOKENS_PER_STEP


def test_flops_budget(fit, tiny_config):
    per_step = training_flops_per_batch(tiny_config("coupled"), BATCH, SEQ)
    budget = TokenBudget(flops=3.5 * per_step, batch_size=BATCH, seq_len=SEQ)
    trainer, module, logger = fit(budget, attention="coupled")
    assert trainer.global_step == 3 and module.flops_seen == 3 * per_step
    assert logger.series("train/flops_seen")[2] == 3 * per_step


def test_match_to_reproduces_reference_budget_times_ratio(fit, tmp_path, tiny_config):
    reference = TokenBudget(tokens=5 * TOKENS_PER_STEP, batch_size=BATCH, seq_len=SEQ)
    fit(reference, save_dir=tmp_path / "reference")
    recorded = json.loads((tmp_path / "reference" / "budget.json").read_text())
    assert recorded["tokens"] == 5 * TOKENS_PER_STEP and recorded["steps"] == 5 and recorded["wallclock"] > 0
    assert recorded["flops"] == 5 * training_flops_per_batch(tiny_config(), BATCH, SEQ)

    matched = TokenBudget(match_to=str(tmp_path / "reference"), ratio=2.4, batch_size=BATCH, seq_len=SEQ)
    trainer, module, _ = fit(matched, save_dir=tmp_path / "matched")
    assert module.tokens_seen == 12 * TOKENS_PER_STEP == round(2.4 * recorded["tokens"])
    assert trainer.global_step == 12
    again = json.loads((tmp_path / "matched" / "budget.json").read_text())
    assert again["budget"] == {
        "kind": "tokens",
        "amount": pytest.approx(2.4 * 320),
        "max_steps": 12,
        "match_to": str(tmp_path / "reference"),
        "ratio": 2.4,
        "match_on": "tokens",
    }


def test_match_on_flops_across_backends(fit, tmp_path, tiny_config):
    """A standard run gets the FLOPs a coupled run used: fewer FLOPs per step, more steps."""
    coupled_step = training_flops_per_batch(tiny_config("coupled"), BATCH, SEQ)
    standard_step = training_flops_per_batch(tiny_config("standard"), BATCH, SEQ)
    assert coupled_step > standard_step
    reference = TokenBudget(tokens=40 * TOKENS_PER_STEP, batch_size=BATCH, seq_len=SEQ)
    fit(reference, "coupled", save_dir=tmp_path / "coupled")
    matched = TokenBudget(match_to=str(tmp_path / "coupled"), match_on="flops", batch_size=BATCH, seq_len=SEQ)
    trainer, module, _ = fit(matched, save_dir=tmp_path / "standard")
    expected = (40 * coupled_step) // standard_step  # 41: coupled costs 2.6% more per step at this size
    assert trainer.global_step == expected > 40
    assert module.flops_seen == expected * standard_step <= 40 * coupled_step


def test_wallclock_budget_stops_at_the_first_step_boundary(fit):
    budget = TokenBudget(wallclock=1e-9, batch_size=BATCH, seq_len=SEQ)
    trainer, _, logger = fit(budget, max_steps=50)
    assert trainer.global_step == 1
    assert logger.series("train/wallclock")[0] > 0


def test_run_summary_writes_budget_json_without_token_budget(make_trainer, tiny_config, token_loader):
    L.seed_everything(0, verbose=False)
    module = LitLM(tiny_config(), OptimConfig(lr=1e-3, warmup_steps=2))
    trainer, _ = make_trainer([RunSummary()], max_steps=3)
    trainer.fit(module, token_loader())
    record = json.loads((Path(trainer.log_dir) / "budget.json").read_text())
    assert record["tokens"] == 3 * TOKENS_PER_STEP and record["steps"] == 3


def test_errors(fit, tmp_path):
    with pytest.raises(ValueError, match="one budget"):
        TokenBudget(tokens=10, flops=10)
    with pytest.raises(FileNotFoundError, match="budget.json"):
        fit(TokenBudget(match_to=str(tmp_path / "nowhere"), batch_size=BATCH, seq_len=SEQ))
    with pytest.raises(ValueError, match="less than one optimizer step"):
        fit(TokenBudget(tokens=10, batch_size=BATCH, seq_len=SEQ))
