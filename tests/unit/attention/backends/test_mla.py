"""Multi-head latent attention (DeepSeek-V2 MLA with decoupled RoPE): equations hold, cache is latent.

The generic checks (causality, fast path == math path in fp64, fp32 finiteness, the Q/K seam, decode parity, a tiny
GPT that learns bytes) run for every case of `tests/backend_cases.py` in the contract harness,
`tests/contract/test_contract.py`.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_cqk.attention import AttentionContext, StandardAttention, build_attention
from lightning_cqk.attention.backends.mla import MLAOptions, MultiHeadLatentAttention, mla_dims
from lightning_cqk.attention.rope import apply_rope, build_rope_cache
from lightning_cqk.model.flops import forward_flops_per_token
from lightning_cqk.model_config import ModelConfig

C, NH, T = 32, 4, 12
HS = C // NH
MATRICES = ("dq_proj", "uq_proj", "qr_proj", "dkv_proj", "uk_proj", "uv_proj", "kr_proj", "out_proj")
OPTION_SETS = [
    {},
    {"qk_norm": True},
    {"latent_norm": False, "d_nope": 4, "d_rope": 4},  # q/k and v head sizes equal: no padding
    {"d_rope": 4, "d_nope": 6, "d_v": 12, "d_cq": 16, "d_ckv": 10},  # d_rope divides hs: sub-sampled tables
    {"d_rope": 6, "qk_norm": True},  # d_rope does not divide hs: tables built for d_rope
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def make_config(position: str = "rope", bias: bool = False, **options) -> ModelConfig:
    return ModelConfig(
        n_embd=C,
        n_head=NH,
        n_layer=2,
        vocab_size=10,
        block_size=16,
        position=position,
        bias=bias,
        attention="mla",
        attention_options=options,
    )


def make_backend(seed: int = 0, position: str = "rope", **options) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    backend = build_attention(make_config(position, **options), 0).double()
    with torch.no_grad():  # non-trivial gains so that every norm is exercised
        for module in backend.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return backend


def rope_ctx(T: int = T, dtype=torch.float64) -> AttentionContext:
    cos, sin = build_rope_cache(T, HS)
    return AttentionContext(cos=cos.to(dtype), sin=sin.to(dtype))


def rms(t: torch.Tensor, norm: torch.nn.RMSNorm | None) -> torch.Tensor:
    if norm is None:
        return t
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def naive_mla(m: MultiHeadLatentAttention, x: torch.Tensor, rope: bool = True) -> torch.Tensor:
    """Per-position loop of DeepSeek-V2 eqs. 9-19 from the module's weights (fp64), tables built for d_rope."""
    B, T_, _ = x.shape
    d = m.dims
    cos, sin = build_rope_cache(T_, d.d_rope) if rope else (None, None)
    c_q = rms(x @ m.dq_proj.weight.T, m.q_latent_norm)  # (B, T, d_cq)
    c_kv = rms(x @ m.dkv_proj.weight.T, m.kv_latent_norm)  # (B, T, d_ckv)
    heads = []
    for h in range(NH):

        def rows(width: int, h: int = h) -> slice:
            return slice(h * width, (h + 1) * width)

        q_nope = c_q @ m.uq_proj.weight[rows(d.d_nope)].T  # (B, T, d_nope)
        q_rope = c_q @ m.qr_proj.weight[rows(d.d_rope)].T  # (B, T, d_rope)
        k_nope = c_kv @ m.uk_proj.weight[rows(d.d_nope)].T
        k_rope = x @ m.kr_proj.weight.T  # the same key for every head
        v = c_kv @ m.uv_proj.weight[rows(d.d_v)].T  # (B, T, d_v)
        q = rms(torch.cat((q_nope, q_rope), -1), m.q_norm)
        k = rms(torch.cat((k_nope, k_rope), -1), m.k_norm)
        q = torch.cat((q[..., : d.d_nope], apply_rope(q[..., d.d_nope :], cos, sin)), -1)
        k = torch.cat((k[..., : d.d_nope], apply_rope(k[..., d.d_nope :], cos, sin)), -1)
        out = torch.zeros(B, T_, d.d_v, dtype=x.dtype)
        for i in range(T_):
            s = (k[:, : i + 1] @ q[:, i].unsqueeze(-1)).squeeze(-1) / math.sqrt(d.d_nope + d.d_rope)  # (B, i+1)
            out[:, i] = (s.softmax(-1).unsqueeze(1) @ v[:, : i + 1]).squeeze(1)
        heads.append(out)
    return torch.cat(heads, -1) @ m.out_proj.weight.T


@pytest.mark.parametrize("options", OPTION_SETS)
def test_module_matches_naive_loop_reference(options):
    for impl in ("sdpa", "math"):
        m = make_backend(impl=impl, **options)
        x = torch.randn(2, T, C, dtype=torch.float64)
        assert rel_err(m(x, rope_ctx()), naive_mla(m, x)) < 1e-12, impl


def test_reduces_to_standard_attention_with_product_weights():
    """No RoPE, no latent norms, d_nope + d_rope = hs, d_v = hs: MLA is MHA with low-rank, partly shared W_Q, W_K."""
    d_nope, d_rope = 5, 3
    m = make_backend(position="none", latent_norm=False, d_nope=d_nope, d_rope=d_rope)
    cfg = ModelConfig(n_embd=C, n_head=NH, vocab_size=10, position="none")
    std = StandardAttention(cfg, 0, StandardAttention.Options()).double()
    W = {name: getattr(m, name).weight for name in MATRICES}
    w_q, w_k = [], []
    for h in range(NH):
        w_q += [W["uq_proj"][h * d_nope : (h + 1) * d_nope], W["qr_proj"][h * d_rope : (h + 1) * d_rope]]
        w_k += [W["uk_proj"][h * d_nope : (h + 1) * d_nope] @ W["dkv_proj"], W["kr_proj"]]
    with torch.no_grad():
        std.q_proj.weight.copy_(torch.cat(w_q) @ W["dq_proj"])
        std.k_proj.weight.copy_(torch.cat(w_k))
        std.v_proj.weight.copy_(W["uv_proj"] @ W["dkv_proj"])
        std.out_proj.weight.copy_(W["out_proj"])
    x = torch.randn(2, T, C, dtype=torch.float64)
    ctx = AttentionContext()
    for impl in ("sdpa", "math"):
        m.options.impl = std.options.impl = impl
        assert rel_err(m(x, ctx), std(x, ctx)) < 1e-12, impl


@pytest.mark.parametrize("options", [{}, {"d_rope": 4, "d_v": 12, "d_ckv": 10}])
def test_absorbed_attention_on_latent_cache_equals_module(options):
    """Scores and outputs from the cached (c_kv, rotated k_rope) alone, with W_uk / W_uv absorbed (no qk_norm)."""
    m = make_backend(**options)
    d = m.dims
    x = torch.randn(2, T, C, dtype=torch.float64)
    ctx = rope_ctx()
    c_q, c_kv = m.latents(x)  # c_kv (B, T, d_ckv) is what the cache holds
    cos, sin = m.rope_tables(ctx)
    k_rope = apply_rope(m.kr_proj(x), cos, sin)  # (B, T, d_rope), cached once for all heads
    assert c_kv.size(-1) + k_rope.size(-1) == MultiHeadLatentAttention.kv_cache_values_per_token(m.config, m.options)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(NH):
        w_uk = m.uk_proj.weight[h * d.d_nope : (h + 1) * d.d_nope]  # (d_nope, d_ckv)
        w_uv = m.uv_proj.weight[h * d.d_v : (h + 1) * d.d_v]  # (d_v, d_ckv)
        q_nope = c_q @ m.uq_proj.weight[h * d.d_nope : (h + 1) * d.d_nope].T  # (B, T, d_nope)
        q_rope = apply_rope(c_q @ m.qr_proj.weight[h * d.d_rope : (h + 1) * d.d_rope].T, cos, sin)
        scores = (q_nope @ w_uk) @ c_kv.transpose(1, 2) + q_rope @ k_rope.transpose(1, 2)  # (B, T, T)
        probs = (scores / math.sqrt(d.d_nope + d.d_rope)).masked_fill(~mask, float("-inf")).softmax(-1)
        heads.append((probs @ c_kv) @ w_uv.T)  # (B, T, d_v): attention on latents, then W_uv
    y = m.out_proj(torch.cat(heads, -1))
    assert rel_err(y, m(x, ctx)) < 1e-12


def test_one_rope_key_shared_by_all_heads_and_named_matrices():
    m = make_backend()
    d = m.dims
    for name in MATRICES:
        assert isinstance(getattr(m, name), torch.nn.Linear), name
    assert m.kr_proj.weight.shape == (d.d_rope, C)
    assert m.uq_proj.weight.shape == (NH * d.d_nope, d.d_cq) and m.uk_proj.weight.shape == (NH * d.d_nope, d.d_ckv)
    assert m.qr_proj.weight.shape == (NH * d.d_rope, d.d_cq) and m.uv_proj.weight.shape == (NH * d.d_v, d.d_ckv)
    _, k, _ = m.project(torch.randn(2, T, C, dtype=torch.float64), rope_ctx())  # (B, nh, T, d_nope + d_rope)
    k_rope = k[..., d.d_nope :]
    assert torch.equal(k_rope, k_rope[:, :1].expand_as(k_rope))
    assert not torch.equal(k[:, 0, :, : d.d_nope], k[:, 1, :, : d.d_nope])


def test_rope_tables_are_those_of_a_d_rope_wide_rope():
    for d_rope in (2, 4, 8, 6, 16):
        m = make_backend(d_rope=d_rope)
        cos, sin = m.rope_tables(rope_ctx())
        ref_cos, ref_sin = build_rope_cache(T, d_rope)
        torch.testing.assert_close(cos, ref_cos.double())
        torch.testing.assert_close(sin, ref_sin.double())
    assert make_backend(position="none").rope_tables(AttentionContext()) == (None, None)


def hand_count(C: int, nh: int, d, latent_norm=True, qk_norm=False, bias=False) -> int:
    outs = {  # output width of each matrix, with its input width
        "dq": (d.d_cq, C),
        "uq": (nh * d.d_nope, d.d_cq),
        "qr": (nh * d.d_rope, d.d_cq),
        "dkv": (d.d_ckv, C),
        "uk": (nh * d.d_nope, d.d_ckv),
        "uv": (nh * d.d_v, d.d_ckv),
        "kr": (d.d_rope, C),
        "out": (C, nh * d.d_v),
    }
    n = sum(o * i + (o if bias else 0) for o, i in outs.values())
    return n + (d.d_cq + d.d_ckv if latent_norm else 0) + (2 * (d.d_nope + d.d_rope) if qk_norm else 0)


@pytest.mark.parametrize(
    "options,bias",
    [({}, False), ({}, True), ({"qk_norm": True, "latent_norm": False}, False), (OPTION_SETS[3], True)],
)
def test_parameter_count_equals_hand_count(options, bias):
    m = build_attention(make_config(bias=bias, **options), 0)
    d = m.dims
    expected = hand_count(C, NH, d, options.get("latent_norm", True), options.get("qk_norm", False), bias)
    assert sum(p.numel() for p in m.parameters()) == expected


def test_defaults_match_standard_parameter_count_up_to_rope_key_and_gains():
    for preset in ("tiny", "60m"):
        cfg = ModelConfig(preset=preset, attention="mla")
        d = mla_dims(cfg, MLAOptions())
        C_, hs = cfg.n_embd, cfg.head_size
        assert d == (3 * C_ // 4, C_ // 4, hs, hs, hs)
        m = build_attention(cfg, 0)
        assert sum(p.numel() for p in m.parameters()) == 4 * C_ * C_ + C_ * hs + d.d_cq + d.d_ckv


def test_check_config_refuses_impossible_options():
    with pytest.raises(ValueError, match="d_rope=5 must be even"):
        make_config(d_rope=5)
    make_config(position="none", d_rope=5)  # no rotation, no constraint
    with pytest.raises(ValueError, match="non-negative integer"):
        make_config(d_cq=-1)  # 0 is allowed: no query latent
    with pytest.raises(ValueError, match="positive integer"):
        make_config(d_v=2.5)
    with pytest.raises(ValueError, match="impl"):
        make_config(impl="flash")
    with pytest.raises(ValueError, match="prefill='materialized' is not known; choose 'materialised'"):
        make_config(prefill="materialized")


def test_flops_and_kv_cache():
    cfg = make_config(d_rope=4, d_nope=6, d_v=12, d_cq=16, d_ckv=10)
    opts = MLAOptions(d_rope=4, d_nope=6, d_v=12, d_cq=16, d_ckv=10)
    proj = C * 16 + 16 * NH * 10 + C * 10 + 10 * NH * 18 + C * 4 + NH * 12 * C
    assert MultiHeadLatentAttention.forward_flops_per_token(cfg, opts, 7) == 2 * proj + 2 * 7 * NH * (10 + 12)
    assert MultiHeadLatentAttention.kv_cache_values_per_token(cfg, opts) == 14
    big = ModelConfig(preset="60m", attention="mla")
    assert MultiHeadLatentAttention.kv_cache_values_per_token(big, MLAOptions()) == 128 + 64
    assert forward_flops_per_token(big, 1024) > forward_flops_per_token(ModelConfig(preset="60m"), 1024)


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
def test_compiles_without_graph_breaks():
    """fullgraph=True fails on any graph break (host sync, data-dependent branch); aot_eager also traces backward."""
    for impl, options in (("sdpa", {}), ("math", {"qk_norm": True, "d_rope": 6})):
        torch._dynamo.reset()
        m = make_backend(impl=impl, **options)
        compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
        x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
        y = compiled(x, rope_ctx())
        y.sum().backward()
        torch.testing.assert_close(y, m(x, rope_ctx()), rtol=0, atol=1e-12)
        assert x.grad is not None and m.kr_proj.weight.grad is not None
