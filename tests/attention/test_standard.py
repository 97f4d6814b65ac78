"""Standard attention: SDPA fast path == explicit math path in fp64 (forward and backward), causality."""

from __future__ import annotations

import torch

from lightning_cqk.attention import AttentionContext, build_attention
from lightning_cqk.attention.functional import attention_probs, causal_attention
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.config import ModelConfig


def naive_attention(q, k, v):
    """Independent loop-over-positions reference: o_i = sum_{j<=i} softmax_j(q_i . k_j / sqrt(d)) v_j."""
    B, nh, T, hs = q.shape
    out = torch.zeros_like(q)
    for i in range(T):
        s = (q[:, :, i : i + 1] @ k[:, :, : i + 1].transpose(-1, -2)) / hs**0.5  # (B, nh, 1, i+1)
        out[:, :, i] = (s.softmax(-1) @ v[:, :, : i + 1])[:, :, 0]
    return out


def test_functional_paths_match_naive_loop_fp64():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64) for _ in range(3))
    ref = naive_attention(q, k, v)
    torch.testing.assert_close(causal_attention(q, k, v, impl="math"), ref)
    torch.testing.assert_close(causal_attention(q, k, v, impl="sdpa"), ref)
    probs = attention_probs(q, k)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 9, dtype=torch.float64))
    assert torch.all(probs.triu(1) == 0)


def test_grouped_kv_heads_match_repeated_heads():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 7, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 7, 8, dtype=torch.float64), torch.randn(2, 2, 7, 8, dtype=torch.float64)
    ref = naive_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(causal_attention(q, k, v, impl="math"), ref)
    torch.testing.assert_close(causal_attention(q, k, v, impl="sdpa"), ref)


def _backend_pair(impl_a="sdpa", impl_b="math"):
    torch.manual_seed(0)
    cfg = ModelConfig(n_embd=32, n_head=4, n_layer=1, vocab_size=10, block_size=16)
    a = build_attention(cfg.replace(attention_options={"impl": impl_a}), 0).double()
    b = build_attention(cfg.replace(attention_options={"impl": impl_b}), 0).double()
    b.load_state_dict(a.state_dict())
    cos, sin = build_rope_cache(16, cfg.head_size)
    return a, b, AttentionContext(cos=cos.double(), sin=sin.double())


def test_standard_sdpa_equals_math_forward_and_backward_fp64():
    a, b, ctx = _backend_pair()
    x = torch.randn(3, 16, 32, dtype=torch.float64, requires_grad=True)
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ya, yb = a(xa, ctx), b(xb, ctx)
    torch.testing.assert_close(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(xa.grad, xb.grad)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=name)


def test_standard_is_causal():
    a, _, ctx = _backend_pair()
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    y = a(x, ctx)
    x2 = x.clone()
    x2[:, 10:] += torch.randn_like(x2[:, 10:])
    y2 = a(x2, ctx)
    torch.testing.assert_close(y2[:, :10], y[:, :10], rtol=0, atol=1e-12)
    assert not torch.allclose(y2[:, 10:], y[:, 10:])


def test_standard_parameter_count():
    cfg = ModelConfig(n_embd=32, n_head=4, vocab_size=10)
    assert sum(p.numel() for p in build_attention(cfg, 0).parameters()) == 4 * 32 * 32
    cfg = ModelConfig(n_embd=32, n_head=4, vocab_size=10, bias=True)
    assert sum(p.numel() for p in build_attention(cfg, 0).parameters()) == 4 * 32 * 32 + 4 * 32
