"""Standard attention: both functional paths against an independent loop, grouped K/V heads, parameter count.

The generic checks (causality, fast path == math path in fp64, fp32 finiteness, the Q/K seam, decode parity, a tiny
GPT that learns bytes) run for every case of `tests/backend_cases.py` in the contract harness,
`tests/contract/test_contract.py`.
"""

from __future__ import annotations

import torch

from lightning_cqk.attention import build_attention
from lightning_cqk.attention.kernels.functional import attention_probs, causal_attention
from lightning_cqk.model_config import ModelConfig


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


def test_standard_parameter_count():
    cfg = ModelConfig(n_embd=32, n_head=4, vocab_size=10)
    assert sum(p.numel() for p in build_attention(cfg, 0).parameters()) == 4 * 32 * 32
    cfg = ModelConfig(n_embd=32, n_head=4, vocab_size=10, bias=True)
    assert sum(p.numel() for p in build_attention(cfg, 0).parameters()) == 4 * 32 * 32 + 4 * 32


def test_qk_norm_runs_the_fused_rms_norm_on_bf16_inputs():
    """Issue 32 item 5: QK-norm's fp32 gain met bf16 q/k and `F.rms_norm` fell back to its composite kernel (torch
    warns "Mismatch dtype"). `MatchedRMSNorm` applies the gain in the input's dtype: no warning, the same values as
    the fp32 computation rounded once, and the gradient reaches the fp32 gain; in fp64 it is nn.RMSNorm exactly."""
    import warnings

    from torch import nn

    from lightning_cqk.attention.kernels.matched_norm import MatchedRMSNorm

    torch.manual_seed(0)
    norm = MatchedRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = norm(x)
    reference = torch.nn.functional.rms_norm(x.float(), (16,), norm.weight.detach(), 1e-6)
    torch.testing.assert_close(y.float(), reference, rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
    plain = nn.RMSNorm(16, eps=1e-6).double()
    plain.load_state_dict(norm.double().state_dict())
    z = torch.randn(5, 16, dtype=torch.float64)
    torch.testing.assert_close(norm(z), plain(z), rtol=0, atol=0)
