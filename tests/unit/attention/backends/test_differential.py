"""Differential attention (arXiv 2410.05258, V1): equations hold, lambda behaves, parameters match.

The generic checks (causality, fast path == math path in fp64, fp32 finiteness, the Q/K seam, decode parity, a tiny
GPT that learns bytes) run for every case of `tests/backend_cases.py` in the contract harness,
`tests/contract/test_contract.py`.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_cqk.attention import AttentionContext, StandardAttention, build_attention
from lightning_cqk.attention.backends.differential import DifferentialAttention, lambda_init_schedule
from lightning_cqk.attention.rope import apply_rope, build_rope_cache
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import forward_flops_per_token
from lightning_cqk.model_config import ModelConfig

C, NH, T = 32, 4, 12
HS = C // NH


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def make_config(**options) -> ModelConfig:
    return ModelConfig(
        n_embd=C,
        n_head=NH,
        n_layer=3,
        vocab_size=10,
        block_size=16,
        attention="differential",
        attention_options=options,
    )


def make_backend(layer_idx: int = 1, seed: int = 0, **options) -> DifferentialAttention:
    torch.manual_seed(seed)
    backend = build_attention(make_config(**options), layer_idx).double()
    with torch.no_grad():  # larger-than-init lambda vectors so that lambda is far from lambda_init
        for p in (backend.lambda_q1, backend.lambda_k1, backend.lambda_q2, backend.lambda_k2):
            p.normal_(0.0, 0.5)
        backend.subln.weight.uniform_(0.5, 1.5)
        if backend.q_norm is not None:
            backend.q_norm.weight.uniform_(0.5, 1.5)
            backend.k_norm.weight.uniform_(0.5, 1.5)
    return backend


def rope_ctx(T: int = T, dtype=torch.float64) -> AttentionContext:
    cos, sin = build_rope_cache(T, HS)
    return AttentionContext(cos=cos.to(dtype), sin=sin.to(dtype))


def naive_differential(m: DifferentialAttention, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """Per-position loop of the paper's equations, from the module's weights (fp64)."""
    B, T_, _ = x.shape
    nd = NH // 2
    q = (x @ m.q_proj.weight.T).view(B, T_, NH, HS).transpose(1, 2)  # (B, nh, T, hs)
    k = (x @ m.k_proj.weight.T).view(B, T_, NH, HS).transpose(1, 2)  # (B, nh, T, hs)
    v = (x @ m.v_proj.weight.T).view(B, T_, nd, 2 * HS).transpose(1, 2)  # (B, nh/2, T, 2hs)
    if m.q_norm is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + m.q_norm.eps) * m.q_norm.weight
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + m.k_norm.eps) * m.k_norm.weight
    q, k = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)
    lam = torch.exp(m.lambda_q1 @ m.lambda_k1) - torch.exp(m.lambda_q2 @ m.lambda_k2) + m.lambda_init
    out = torch.zeros(B, nd, T_, 2 * HS, dtype=x.dtype)
    for i in range(T_):
        s = q[:, :, i : i + 1] @ k[:, :, : i + 1].transpose(-1, -2) / math.sqrt(HS)  # (B, nh, 1, i+1)
        a = s.softmax(-1).view(B, nd, 2, 1, i + 1)
        out[:, :, i] = ((a[:, :, 0] - lam * a[:, :, 1]) @ v[:, :, : i + 1])[:, :, 0]
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * m.subln.weight * (1 - m.lambda_init)
    return out.transpose(1, 2).reshape(B, T_, C) @ m.out_proj.weight.T


def test_lambda_init_schedule_is_zero_based():
    assert [round(lambda_init_schedule(d), 3) for d in range(3)] == [0.2, 0.356, 0.471]
    model = GPT(make_config())
    assert [block.attn.lambda_init for block in model.blocks] == pytest.approx([0.2, 0.35551, 0.47071], abs=1e-5)
    fixed = GPT(make_config(lambda_init=0.5))
    assert [block.attn.lambda_init for block in fixed.blocks] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("qk_norm", [False, True])
def test_module_matches_naive_loop_reference(qk_norm):
    for impl in ("sdpa", "math"):
        m = make_backend(qk_norm=qk_norm, impl=impl)
        x = torch.randn(2, T, C, dtype=torch.float64)
        assert rel_err(m(x, rope_ctx()), naive_differential(m, x, rope_ctx())) < 1e-12


def test_lambda_zero_is_standard_attention_and_equal_maps_scale_it():
    """lambda = 0: each head is standard softmax attention on (q1, k1); q2 = q1, k2 = k1: (1 - lambda) x that."""
    m = make_backend(impl="sdpa", lambda_init=0.0)
    std = StandardAttention(ModelConfig(n_embd=C, n_head=NH, vocab_size=10), 0, StandardAttention.Options())
    with torch.no_grad():
        for p in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2):
            p.zero_()
    assert m.lambda_value().item() == 0.0
    x = torch.randn(2, T, C, dtype=torch.float64)
    q, k, v = m.project(x)
    q, k = m.transform_qk(q, k, rope_ctx())  # (B, nh, T, hs)
    q1, k1 = q[:, 0::2], k[:, 0::2]  # (B, nh/2, T, hs): the first map of every differential head
    for impl in ("sdpa", "math"):
        m.options.impl = std.options.impl = impl
        y = m.differential_attend(q, k, v, m.lambda_value())
        assert rel_err(y, std.attend(q1, k1, v)) < 1e-12
        lam = torch.tensor(0.3, dtype=torch.float64)
        q_eq = q1.repeat_interleave(2, dim=1)  # (B, nh, T, hs): q2 = q1
        k_eq = k1.repeat_interleave(2, dim=1)
        assert rel_err(m.differential_attend(q_eq, k_eq, v, lam), 0.7 * std.attend(q1, k1, v)) < 1e-12


def test_parameter_count_matches_standard_plus_lambda_and_norm():
    for extra in ({}, {"qk_norm": True}, {"bias": True}):
        options = {k: v for k, v in extra.items() if k == "qk_norm"}
        bias = extra.get("bias", False)
        shape = dict(n_embd=64, n_head=4, n_layer=2, vocab_size=257, block_size=64, bias=bias)
        std = GPT(ModelConfig(**shape, attention_options=options)).num_parameters()["total"]
        diff = GPT(ModelConfig(**shape, attention="differential", attention_options=options)).num_parameters()["total"]
        hs = 64 // 4
        assert diff == std + 2 * (4 * hs + 2 * hs), extra
    m = build_attention(make_config(), 0)
    assert sum(p.numel() for p in m.parameters()) == 4 * C * C + 6 * HS


def test_lambda_stays_fp32_under_bf16_autocast():
    torch.manual_seed(0)
    m = build_attention(make_config(), 1)
    x = torch.randn(2, T, C)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lam = m.lambda_value()
        y = m(x, rope_ctx(dtype=torch.float32))
        stats = m.dynamics_stats()
    assert lam.dtype == torch.float32 and lam.dim() == 0
    assert set(stats) == {"lambda"} and stats["lambda"].dtype == torch.float32 and not stats["lambda"].requires_grad
    assert all(p.dtype == torch.float32 for p in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    y.float().sum().backward()
    assert m.lambda_q1.grad.dtype == torch.float32 and torch.isfinite(m.lambda_q1.grad).all()
    expected = (
        torch.exp(m.lambda_q1 @ m.lambda_k1) - torch.exp(m.lambda_q2 @ m.lambda_k2) + lambda_init_schedule(1)
    ).detach()
    torch.testing.assert_close(stats["lambda"], expected)


def test_lambda_vectors_initialised_by_model():
    shape = dict(n_embd=256, n_head=4, n_layer=4, vocab_size=10, block_size=16)
    model = GPT(ModelConfig(**shape, attention="differential"))
    lam = torch.cat([b.attn.lambda_q1 for b in model.blocks] + [b.attn.lambda_k2 for b in model.blocks])
    assert 0.07 < lam.std().item() < 0.13  # N(0, 0.1), not the GPT-2 0.02 init and not zeros
    assert all(torch.equal(b.attn.subln.weight, torch.ones(128)) for b in model.blocks)


def test_check_config_refuses_impossible_settings():
    with pytest.raises(ValueError, match="n_head must be even"):
        ModelConfig(n_embd=30, n_head=3, vocab_size=10, attention="differential")
    with pytest.raises(ValueError, match="lambda_init"):
        make_config(lambda_init=1.0)
    with pytest.raises(ValueError, match="impl"):
        make_config(impl="flash")


def test_flops_and_kv_cache_equal_standard():
    cfg = ModelConfig(preset="60m", attention="differential")
    std = ModelConfig(preset="60m")
    assert forward_flops_per_token(cfg, 1024) == forward_flops_per_token(std, 1024)
    assert DifferentialAttention.kv_cache_values_per_token(cfg, DifferentialAttention.Options()) == 2 * 512


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
def test_compiles_without_graph_breaks():
    """fullgraph=True fails on any graph break (host sync, data-dependent branch); aot_eager also traces backward."""
    for impl in ("sdpa", "math"):
        torch._dynamo.reset()
        m = make_backend(impl=impl, qk_norm=True)
        compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
        x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
        y = compiled(x, rope_ctx())
        y.sum().backward()
        torch.testing.assert_close(y, m(x, rope_ctx()), rtol=0, atol=1e-12)
        assert x.grad is not None and m.lambda_q1.grad is not None
