"""Evaluation at several context lengths: the sliding-window NLL scores every target once with the stated context
(fp64 oracle), equals the plain loss at full context, and `validate` logs token-weighted val/ctx<c>/* metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_run import tiny_trainer

from lightning_cqk.data import TokenDataModule
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM, sliding_window_nll


def tiny_gpt(block_size: int = 16) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, n_layer=1, n_embd=32, n_head=2, block_size=block_size)
    return GPT(config).double().eval()


@torch.no_grad()
def test_full_context_equals_plain_loss_and_stride_one_equals_per_token_oracle():
    model = tiny_gpt()
    batch = torch.randint(0, 50, (2, 17))  # (B, L + 1), L = 16
    x, y = batch[:, :-1], batch[:, 1:]
    plain = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum")
    total, n = sliding_window_nll(model, batch, context=16, stride=16)
    assert n == 32 and torch.allclose(total.double(), plain, rtol=1e-6)

    for context in (4, 5):
        # oracle: target t is predicted from x[max(0, t + 1 - context) : t + 1]
        oracle = sum(
            F.cross_entropy(model(x[:, max(0, t + 1 - context) : t + 1])[:, -1], y[:, t], reduction="sum")
            for t in range(16)
        )
        total, n = sliding_window_nll(model, batch, context=context, stride=1)
        assert n == 32 and torch.allclose(total.double(), oracle, rtol=1e-6)

    # non-overlapping windows: the sum over independent chunks
    chunks = sum(
        F.cross_entropy(model(x[:, i : i + 4]).flatten(0, 1), y[:, i : i + 4].flatten(), reduction="sum")
        for i in range(0, 16, 4)
    )
    assert torch.allclose(sliding_window_nll(model, batch, 4, 4)[0].double(), chunks, rtol=1e-6)
    # a shorter context never helps a trained model, but on any model more context changes the score
    assert not torch.allclose(sliding_window_nll(model, batch, 2, 2)[0].double(), plain)


def test_bad_contexts_are_refused():
    config = ModelConfig(vocab_size=50, n_layer=1, n_embd=32, n_head=2, block_size=16)
    with pytest.raises(ValueError, match="eval_contexts must lie in"):
        LitLM(config, eval_contexts=[32])
    with pytest.raises(ValueError, match="eval_stride in"):
        LitLM(config, eval_contexts=[8, 16], eval_stride=9)


def test_validate_logs_each_context(tmp_path: Path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: " + "attention weights queries and keys. " * 4 for i in range(80)))
    data = TokenDataModule(
        data_dir=str(tmp_path / "shards"),
        source=str(text),
        documents="paragraph",
        seq_len=16,
        val_seq_len=48,  # longer validation windows, scored 16 tokens of context at a time
        batch_size=2,
        val_fraction=0.3,
    )
    config = ModelConfig(vocab_size=data.vocab_size, n_layer=1, n_embd=32, n_head=2, block_size=16)
    module = LitLM(config, eval_contexts=[4, 16], eval_stride=4)
    trainer = tiny_trainer(limit_val_batches=3)
    (metrics,) = trainer.validate(module, datamodule=data)
    for c in (4, 16):
        assert metrics[f"val/ctx{c}/ppl"] == pytest.approx(torch.tensor(metrics[f"val/ctx{c}/loss"]).exp().item())
    with torch.no_grad():
        batches = [b for _, b in zip(range(3), data.val_dataloader())]
        assert batches[0].shape == (2, 49)
        nll = sum(sliding_window_nll(module.model, b, 16, 4)[0] for b in batches)
        chunked = sum(sliding_window_nll(module.model, b, 16, 16)[0] for b in batches)
        tokens = sum(b[:, 1:].numel() for b in batches)
    assert metrics["val/ctx16/loss"] == pytest.approx((nll / tokens).item(), rel=1e-5), "token-weighted"
    assert metrics["val/loss"] == pytest.approx((chunked / tokens).item(), rel=1e-5), "block_size chunks"
