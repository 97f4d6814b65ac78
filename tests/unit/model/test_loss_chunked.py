"""The chunked head + cross-entropy equals F.cross_entropy on full fp32 logits in fp64 (forward and backward), and
LitLM's loss with loss_chunk equals the plain one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_cqk.model.loss import chunked_cross_entropy
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM


@pytest.mark.parametrize(("chunk", "reduction"), [(1, "mean"), (5, "sum"), (7, "mean"), (64, "mean")])
def test_chunked_equals_cross_entropy_fp64(chunk, reduction):
    torch.manual_seed(0)
    h = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)  # (B, T, C)
    w = torch.randn(41, 16, dtype=torch.float64, requires_grad=True)  # (V, C)
    y = torch.randint(0, 41, (3, 7))
    want = F.cross_entropy((h @ w.t()).flatten(0, 1), y.flatten(), reduction=reduction)
    got = chunked_cross_entropy(h, w, y, chunk, reduction=reduction)
    assert got.dtype == torch.float64  # fp32 at least, fp64 for fp64 inputs
    assert chunked_cross_entropy(h.float(), w.float(), y, chunk).dtype == torch.float32
    g_want = torch.autograd.grad(want * 1.7, (h, w))
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    got = chunked_cross_entropy(h2, w2, y, chunk, reduction=reduction)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad(got * 1.7, (h2, w2))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_litlm_loss_chunk_equals_plain():
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=97)
    plain, chunked = LitLM(cfg), LitLM(cfg, loss_chunk=5)
    chunked.load_state_dict(plain.state_dict())
    batch = torch.randint(0, 97, (3, 17))
    (a, n_a), (b, n_b) = plain.loss(batch), chunked.loss(batch)
    assert n_a == n_b == 48
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    a.backward()
    b.backward()
    for p, q in zip(plain.parameters(), chunked.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_loss_chunk_refuses_bad_values():
    with pytest.raises(ValueError, match="loss_chunk"):
        LitLM(ModelConfig(preset="tiny", n_layer=1, n_head=2, n_embd=32, block_size=16), loss_chunk=-1)
