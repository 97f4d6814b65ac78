"""Deconstructed attention variants (arXiv 2510.11602): mlp, approximate, non_approximate, static_emb_qk,
rnd_emb_qk, fixed_seq_qk.

Independent loop references, which inputs each variant reads, degenerate cases against `standard`, the fixed-input
stream inside GPT, parameter counts, FLOPs, configs. The generic checks (causality, fast path == math path in fp64, fp32
finiteness, the Q/K seam, decode parity, a tiny GPT that learns bytes) run for every case of `tests/backend_cases.py` in
the contract harness, `tests/contract/test_contract.py`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from flop_counting import analytic_sdpa_training_flops, counted_sdpa_flops
from torch.utils.flop_counter import FlopCounterMode

from lightning_cqk.attention import AttentionContext, build_attention, get_attention
from lightning_cqk.attention.backends.deconstructed_mixing import (
    softmax_pool_quadratic,
    softmax_pool_scan,
    taylor_attention_chunked,
    taylor_attention_quadratic,
    taylor_chunk_size,
)
from lightning_cqk.attention.backends.deconstructed_qk import load_token_ids
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import MLP_MATRICES, training_flops_per_token
from lightning_cqk.model_config import ModelConfig

VARIANTS = ["mlp", "approximate", "non_approximate", "static_emb_qk", "rnd_emb_qk", "fixed_seq_qk"]
C, NH, T, L = 32, 4, 19, 24
CONFIG_DIR = Path(__file__).resolve().parents[4] / "configs" / "attention"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def config(name: str, options: dict | None = None, **kw) -> ModelConfig:
    base = dict(n_embd=C, n_head=NH, n_layer=2, vocab_size=61, block_size=L, attention=name)
    base.update(kw)
    return ModelConfig(attention_options=options or {}, **base)


def backend(name: str, options: dict | None = None, seed: int = 0, **kw):
    torch.manual_seed(seed)
    module = build_attention(config(name, options, **kw), 1).double()
    for p in module.parameters():  # non-trivial norm gains and biases, so their gradients are checked too
        p.data.add_(0.1 * torch.randn_like(p))
    return module


def context(x: torch.Tensor, reference: list[torch.Tensor] | None = None, embeddings=None) -> AttentionContext:
    cos, sin = build_rope_cache(L, C // NH)
    T_ = x.size(1)
    if embeddings is None:
        embeddings = torch.randn_like(x)
    if reference is None:
        reference = [torch.randn(1, L, C, dtype=x.dtype) for _ in range(2)]
    return AttentionContext(cos=cos[:T_].double(), sin=sin[:T_].double(), embeddings=embeddings, reference=reference)


# ----------------------------------------------------------------------------------------------------------------------
# The functional cores against independent loops
# ----------------------------------------------------------------------------------------------------------------------


def taylor_loop(q, k, v, normalization, eps=1e-6):
    """Per-position loop: each query against its prefix, Taylor kernels written out."""
    out = torch.zeros_like(v)
    hs = q.size(-1)
    for i in range(q.size(-2)):
        s = (k[..., : i + 1, :] @ q[..., i, :, None])[..., 0] / math.sqrt(hs)  # (B, nh, i+1)
        kernels = [torch.ones_like(s), s, s * s / 2]
        vs = v[..., : i + 1, :]
        if normalization == "joint":
            w = sum(kernels)
            out[..., i, :] = (w[..., None] * vs).sum(-2) / w.sum(-1, keepdim=True)
        else:
            d1 = s.sum(-1, keepdim=True)
            d1 = torch.where(d1 >= 0, d1 + eps, d1 - eps)
            out[..., i, :] = (
                vs.mean(-2)
                + (s[..., None] * vs).sum(-2) / d1
                + (kernels[2][..., None] * vs).sum(-2) / (kernels[2].sum(-1, keepdim=True) + eps)
            )
    return out


@pytest.mark.parametrize("normalization", ["separate", "joint"])
def test_taylor_forms_match_a_loop_and_each_other(normalization):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 21, 6, dtype=torch.float64) for _ in range(3))
    ref = taylor_loop(q, k, v, normalization)
    assert rel(taylor_attention_quadratic(q, k, v, normalization), ref) < 1e-10
    for chunk in (1, 4, 7, 21, 64):  # one chunk per token, ragged last chunk, exact fit, single chunk
        assert rel(taylor_attention_chunked(q, k, v, normalization, chunk_size=chunk), ref) < 1e-10


def test_auto_chunk_is_quadratic_until_the_linear_form_is_cheaper():
    assert [taylor_chunk_size(T_, 32, None, "joint") for T_ in (64, 1024, 1200, 8192)] == [64, 1024, 64, 64]
    assert [taylor_chunk_size(T_, 64, None, "joint") for T_ in (1024, 4096, 8192)] == [1024, 4096, 64]
    assert taylor_chunk_size(1024, 64, 16, "joint") == 16


def test_joint_taylor_is_kernel_attention_with_1_plus_s_plus_half_s_squared():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    s = q @ k.transpose(-1, -2) / 2.0  # sqrt(hs) = 2
    w = (1 + s + s * s / 2).tril()
    expected = (w @ v) / w.sum(-1, keepdim=True)
    torch.testing.assert_close(taylor_attention_chunked(q, k, v, "joint", chunk_size=4), expected)


def test_softmax_pool_scan_matches_loop_and_logcumsumexp():
    torch.manual_seed(0)
    s = 3 * torch.randn(2, 3, 37, dtype=torch.float64)
    v = torch.randn(2, 3, 37, 5, dtype=torch.float64)
    loop = torch.stack([(s[..., : i + 1].softmax(-1)[..., None] * v[..., : i + 1, :]).sum(-2) for i in range(37)], -2)
    assert rel(softmax_pool_quadratic(s, v), loop) < 1e-12
    for chunk in (2, 3, 4, 36, 64):  # chunk 2 at T = 37 recurses five levels deep
        o, lse = softmax_pool_scan(s, v, chunk)
        assert rel(o, loop) < 1e-12
        torch.testing.assert_close(lse, torch.logcumsumexp(s, -1))


def test_softmax_pool_scan_is_stable_for_huge_scores():
    torch.manual_seed(0)
    s = (1e4 * torch.randn(2, 50)).requires_grad_()  # e^{1e4} overflows any float
    v = torch.randn(2, 50, 3, requires_grad=True)
    o, _ = softmax_pool_scan(s, v, 8)
    o.square().sum().backward()
    assert torch.isfinite(o).all() and torch.isfinite(s.grad).all() and torch.isfinite(v.grad).all()
    ref = softmax_pool_quadratic(s.detach().double(), v.detach().double())
    assert rel(o.double(), ref) < 1e-5


# ----------------------------------------------------------------------------------------------------------------------
# Backends: the inputs they read, degenerate cases
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_exactly_the_inputs_each_variant_reads_receive_gradients(name):
    """static_emb_qk reads the token embeddings, rnd_emb_qk and fixed_seq_qk the reference stream of their layer (1);
    the others neither."""
    module = backend(name)
    x, emb = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True), torch.randn(2, T, C, dtype=torch.float64)
    emb.requires_grad_()
    refs = [torch.randn(1, L, C, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    module(x, context(x, refs, emb)).square().sum().backward()
    assert x.grad is not None and refs[0].grad is None
    assert (emb.grad is not None) == (name == "static_emb_qk")
    assert (refs[1].grad is not None) == (name in ("rnd_emb_qk", "fixed_seq_qk"))


def test_mlp_backend_is_the_gated_mlp_formula():
    module = backend("mlp")
    x = torch.randn(2, T, C, dtype=torch.float64)
    expected = F.silu(x @ module.gate_proj.weight.T) * (x @ module.up_proj.weight.T) @ module.out_proj.weight.T
    torch.testing.assert_close(module(x, context(x)), expected)
    math_module = backend("mlp", {"impl": "math"})
    torch.testing.assert_close(math_module(x, context(x)), expected)


def test_static_emb_qk_reduces_to_standard_when_embeddings_are_the_input():
    mine = backend("static_emb_qk", {"embedding_norm": False})
    std = build_attention(config("standard"), 1).double()
    std.load_state_dict(mine.state_dict())
    x = torch.randn(2, T, C, dtype=torch.float64)
    torch.testing.assert_close(mine(x, context(x, embeddings=x)), std(x, context(x)), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["rnd_emb_qk", "fixed_seq_qk"])
@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_fixed_input_qk_reduces_to_standard_when_the_reference_is_the_input(name, impl):
    mine = backend(name, {"impl": impl})
    std = build_attention(config("standard"), 1).double()
    std.load_state_dict(mine.state_dict(), strict=False)  # fixed_seq_qk also stores its token ids
    x = torch.randn(1, L, C, dtype=torch.float64)
    y = mine(x[:, :T], context(x[:, :T], reference=[x, x]))
    torch.testing.assert_close(y, std(x[:, :T], context(x[:, :T])), rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------------------------------------------------
# The fixed reference stream inside GPT
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rnd_emb_qk", "fixed_seq_qk"])
def test_reference_states_are_the_blocks_applied_to_the_fixed_input(name):
    torch.manual_seed(0)
    model = GPT(config(name, n_layer=3)).double()
    states = model.reference_states(T)
    assert len(states) == 3 and all(s.shape == (1, L, C) for s in states)
    source = model.blocks[0].attn.reference_input(model.wte)  # (1, L, C)
    if name == "fixed_seq_qk":
        torch.testing.assert_close(source, model.wte(model.blocks[0].attn.reference_tokens))
    # manual run: ordinary attention on the stream (a reading layer's reference is its own input)
    r, expected = source, []
    for block in model.blocks:
        h = block.norm_1(r)
        expected.append(h)
        std = build_attention(config("standard", n_layer=3), 0).double()
        std.load_state_dict(block.attn.state_dict(), strict=False)
        cos, sin = model.rope_cos[:L], model.rope_sin[:L]
        r = r + std(h, AttentionContext(cos=cos, sin=sin))
        r = r + block.mlp(block.norm_2(r))
    for got, want in zip(states, expected):
        torch.testing.assert_close(got, want)


def test_fixed_map_is_shared_by_every_input_and_layer_input():
    """Inside a GPT, an rnd_emb_qk layer's output is P (x W_V) W_O with P fixed: linear in its input x."""
    torch.manual_seed(0)
    model = GPT(config("rnd_emb_qk")).double()
    ctx = model.context(T, embeddings=None, reference=model.reference_states(T))
    attn = model.blocks[1].attn
    x1, x2 = torch.randn(2, T, C, dtype=torch.float64), torch.randn(2, T, C, dtype=torch.float64)
    torch.testing.assert_close(attn(x1 + 2 * x2, ctx), attn(x1, ctx) + 2 * attn(x2, ctx))


def test_rnd_emb_qk_input_is_seeded_and_identical_across_layers():
    cfg = config("rnd_emb_qk", {"sigma": 0.5, "seed": 3}, n_layer=3)
    a, b = GPT(cfg), GPT(cfg)
    eps = [block.attn.reference_embedding for block in a.blocks]
    assert all(torch.equal(e, eps[0]) for e in eps)
    assert torch.equal(eps[0], b.blocks[0].attn.reference_embedding)
    assert abs(eps[0].std().item() - 0.5) < 0.05
    assert "blocks.0.attn.reference_embedding" not in a.state_dict()  # derived from the config, not stored
    other = GPT(config("rnd_emb_qk", {"sigma": 0.5, "seed": 4}, n_layer=3))
    assert not torch.allclose(other.blocks[0].attn.reference_embedding, eps[0])
    with torch.device("meta"):
        assert GPT(cfg).num_parameters()["total"] == a.num_parameters()["total"]


def test_fixed_seq_tokens_are_stored_and_default_to_the_python_docs():
    model = GPT(config("fixed_seq_qk", vocab_size=257))
    tokens = model.blocks[0].attn.reference_tokens
    assert tokens.shape == (1, L) and "blocks.0.attn.reference_tokens" in model.state_dict()
    import pydoc_data.topics

    first = sorted(pydoc_data.topics.topics)[0]
    assert bytes(tokens[0].tolist()) == pydoc_data.topics.topics[first].encode()[:L]


@pytest.mark.parametrize("detach", [False, True])
def test_gradients_reach_earlier_blocks_through_the_stream_unless_detached(detach):
    torch.manual_seed(0)
    model = GPT(config("rnd_emb_qk", {"detach_reference": detach}, n_layer=2)).double()
    states = model.reference_states(T)
    x = torch.randn(2, T, C, dtype=torch.float64)
    ctx = model.context(T, embeddings=x, reference=states)
    model.blocks[1].attn(x, ctx).square().sum().backward()
    grad = model.blocks[0].mlp.up_proj.weight.grad  # block 0 touches layer 1 only through the stream
    if detach:
        assert grad is None
    else:
        assert grad is not None and grad.abs().sum() > 0
    assert model.blocks[1].attn.q_proj.weight.grad.abs().sum() > 0  # W_Q learns either way


def test_sequences_longer_than_the_fixed_input_are_refused():
    model = GPT(config("rnd_emb_qk", {"length": 8}))
    assert model(torch.randint(0, 61, (2, 8))).shape == (2, 8, 61)
    with pytest.raises(ValueError, match="exceeds the length 8 of the fixed reference stream"):
        model(torch.randint(0, 61, (2, 9)))
    module = backend("rnd_emb_qk")
    x = torch.randn(1, 12, C, dtype=torch.float64)
    with pytest.raises(ValueError, match="exceeds the fixed input's length 8"):
        module(x, context(x, reference=[torch.zeros(1, 8, C)] * 2))
    with pytest.raises(ValueError, match="fixed reference stream"):
        module(x, AttentionContext())


def test_one_reference_stream_per_model():
    with pytest.raises(ValueError, match="one reference stream"):
        GPT(config("rnd_emb_qk", layer_overrides=[{"layers": [1], "attention": "fixed_seq_qk"}]))
    with pytest.raises(ValueError, match="define different ones"):
        GPT(
            config(
                "rnd_emb_qk",
                layer_overrides=[{"layers": [1], "attention": "rnd_emb_qk", "attention_options": {"seed": 1}}],
            )
        )
    hybrid = GPT(config("standard", n_layer=4, layer_overrides=[{"pattern": "odd", "attention": "rnd_emb_qk"}]))
    assert hybrid.reference_layers == [0, 2]
    assert len(hybrid.reference_states(T)) == 3  # the stream stops below the last reading layer


# ----------------------------------------------------------------------------------------------------------------------
# Token files
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16, np.uint8])
def test_npy_token_files_load_without_numpy_in_the_model(tmp_path, dtype):
    ids = (np.arange(40) * 7 % 61).astype(dtype)
    np.save(tmp_path / "ids.npy", ids)
    got = load_token_ids(str(tmp_path / "ids.npy"), 30)
    assert got.dtype == torch.int64 and got.tolist() == ids[:30].astype(int).tolist()
    model = GPT(config("fixed_seq_qk", {"token_file": str(tmp_path / "ids.npy")}))
    assert model.blocks[1].attn.reference_tokens[0].tolist() == ids[:L].astype(int).tolist()


def test_txt_token_files_and_their_errors(tmp_path):
    (tmp_path / "ids.txt").write_text("3 1, 4\n1 5 9 " * 10)
    assert load_token_ids(str(tmp_path / "ids.txt"), 7).tolist() == [3, 1, 4, 1, 5, 9, 3]
    (tmp_path / "bad.txt").write_text("1 2 x")
    with pytest.raises(ValueError, match="expected integers"):
        load_token_ids(str(tmp_path / "bad.txt"), 2)
    with pytest.raises(ValueError, match="holds 60 ids, fewer than the 100"):
        load_token_ids(str(tmp_path / "ids.txt"), 100)
    with pytest.raises(ValueError, match="does not exist"):
        load_token_ids(str(tmp_path / "missing.npy"), 2)
    (tmp_path / "ids.csv").write_text("1,2")
    with pytest.raises(ValueError, match="unsupported suffix"):
        load_token_ids(str(tmp_path / "ids.csv"), 2)
    np.save(tmp_path / "f.npy", np.ones(4, dtype=np.float32))
    with pytest.raises(ValueError, match="integer array"):
        load_token_ids(str(tmp_path / "f.npy"), 2)
    np.save(tmp_path / "big.npy", np.full(40, 99, dtype=np.int64))
    with pytest.raises(ValueError, match=r"ids up to 99, outside the vocabulary 0\.\.60"):
        config("fixed_seq_qk", {"token_file": str(tmp_path / "big.npy")})


# ----------------------------------------------------------------------------------------------------------------------
# Config errors, parameter counts, KV cache, FLOPs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("approximate", {"normalization": "both"}, "normalization='both'"),
        ("approximate", {"chunk_size": 0}, "chunk_size must be a positive integer"),
        ("approximate", {"eps": 0.0}, "eps must be > 0"),
        ("approximate", {"impl": "flash"}, "impl='flash'"),
        ("non_approximate", {"chunk_size": 1}, "chunk_size must be an integer >= 2"),
        ("mlp", {"hidden": 0}, "hidden must be >= 1"),
        ("mlp", {"hiden": 8}, "Did you mean 'hidden'"),
        ("rnd_emb_qk", {"length": L + 1}, r"length must be an integer in 1\.\.block_size=24"),
        ("rnd_emb_qk", {"sigma": -1.0}, "sigma must be > 0"),
        ("fixed_seq_qk", {"token_file": "builtin:wiki"}, "Unknown built-in token source"),
        ("static_emb_qk", {"qk_norms": True}, "Did you mean 'qk_norm'"),
    ],
)
def test_impossible_options_fail_at_config_time(name, options, match):
    with pytest.raises(ValueError, match=match):
        config(name, options)


@pytest.mark.parametrize("n_embd", [64, 512, 1024])
def test_mlp_width_matches_attention_parameters_within_one_percent(n_embd):
    cfg = ModelConfig(n_embd=n_embd, n_head=8, vocab_size=11, attention="mlp")
    m = round(4 * n_embd / 3)
    count = sum(p.numel() for p in build_attention(cfg, 0).parameters())
    assert count == 3 * n_embd * m
    assert abs(count - 4 * n_embd**2) / (4 * n_embd**2) < 0.01
    biased = sum(p.numel() for p in build_attention(cfg.replace(bias=True), 0).parameters())
    assert biased == 3 * n_embd * m + 2 * m + n_embd
    assert sum(p.numel() for p in build_attention(cfg.replace(attention_options={"hidden": 10}), 0).parameters()) == (
        3 * n_embd * 10
    )


@pytest.mark.parametrize("name", ["approximate", "non_approximate", "static_emb_qk", "rnd_emb_qk", "fixed_seq_qk"])
def test_parameter_counts_equal_standard(name):
    def count(cfg):
        return sum(p.numel() for p in build_attention(cfg, 0).parameters())

    assert count(config(name)) == 4 * C * C
    assert count(config(name, bias=True)) == 4 * C * C + 4 * C
    assert count(config(name, {"qk_norm": True})) == 4 * C * C + 2 * (C // NH)


@pytest.mark.parametrize("name", VARIANTS)
def test_models_build_on_the_meta_device(name):
    """FLOP and parameter counting builds models on `meta`; the fixed inputs must not break (or poison a cache)."""
    with torch.device("meta"):
        count = GPT(config(name)).num_parameters()["total"]
    assert count == GPT(config(name)).num_parameters()["total"]
    assert load_token_ids("builtin:python_docs", 4).device.type == "cpu"


def test_kv_cache_values_per_token():
    cfg = config("standard")
    expected = {"mlp": 0, "approximate": 0, "non_approximate": 0, "static_emb_qk": 2 * C, "rnd_emb_qk": C}
    expected["fixed_seq_qk"] = C
    for name, values in expected.items():
        cls = get_attention(name)
        assert cls.kv_cache_values_per_token(cfg, cls.Options()) == values, name


def measured_flops(model: GPT, B: int, T_: int) -> int:
    idx = torch.randint(0, model.config.vocab_size, (B, T_))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "name,options",
    [
        ("mlp", {}),
        # recompute false: the counter would also count the backward's recomputation, which analytic FLOPs omit
        ("approximate", {"chunk_size": 8, "recompute": False}),  # 5 chunks, the last one ragged
        ("approximate", {"chunk_size": 8, "normalization": "joint", "recompute": False}),
        ("approximate", {"recompute": False}),  # one chunk: quadratic
        ("non_approximate", {"chunk_size": 3}),  # 14 chunks, then 5, then 2: three levels
        ("non_approximate", {}),
    ],
)
def test_analytic_flops_equal_the_flop_counter_exactly(name, options):
    # These fast paths are plain matmuls (no SDPA call), so the count is exact up to the rounding of the per-token
    # figure to an integer (at most 1/2 FLOP per layer and token, times 3).
    torch.manual_seed(0)
    model = GPT(config(name, options, block_size=40))
    B, T_ = 2, 40
    analytic = training_flops_per_token(model.config, T_) * B * T_
    assert abs(measured_flops(model, B, T_) - analytic) <= 3 * model.config.n_layer * B * T_ / 2


@pytest.mark.parametrize("name", ["rnd_emb_qk", "fixed_seq_qk"])
@pytest.mark.parametrize("B", [1, 2, 8])
def test_fixed_input_flops_are_per_token_plus_one_stream_per_step(name, B):
    """Per-token analytic count + the per-step stream (L tokens through layer 0, the q/k projections of the
    stream in both layers) == the FLOP counter. The attention products are SDPA calls, which the counter sees or
    not depending on the torch release: they are taken out of the analytic count and replaced by what the counter
    reports for the same calls (`flop_counting.counted_sdpa_flops`; 0 on torch <= 2.13 on CPU)."""
    torch.manual_seed(0)
    cfg = config(name, block_size=32, n_embd=64, mlp_hidden=128)
    Cm, T_, L_ = cfg.n_embd, 32, 32  # the stream is block_size long
    mlp = MLP_MATRICES[cfg.ffn] * 2 * Cm * cfg.mlp_hidden
    sdpa = analytic_sdpa_training_flops(B, NH, T_, Cm // NH)  # per layer, in training_flops_per_token
    without_sdpa = training_flops_per_token(cfg, T_) * B * T_ - cfg.n_layer * sdpa
    stream = T_ * (4 * 2 * Cm * Cm + mlp) + cfg.n_layer * 2 * 2 * Cm * Cm * T_  # block 0 without SDPA + q/k
    # SDPA calls: one (B, nh, T, hs) per layer on the batch, one (1, nh, L, hs) in block 0 on the stream
    counted = cfg.n_layer * counted_sdpa_flops(B, NH, T_, Cm // NH) + counted_sdpa_flops(1, NH, L_, Cm // NH)
    assert measured_flops(GPT(cfg), B, T_) == without_sdpa + 3 * stream + counted


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
def test_backends_and_the_stream_compile_without_graph_breaks():
    """fullgraph=True fails on any graph break (host sync, data-dependent branch); aot_eager also traces backward.
    One model holds every variant that mixes tokens, and the stream of its last layer passes through all of them."""
    overrides = [
        {"layers": [0], "attention": "static_emb_qk"},
        {"layers": [1], "attention": "approximate", "attention_options": {"chunk_size": 4, "normalization": "joint"}},
        {"layers": [2], "attention": "non_approximate", "attention_options": {"chunk_size": 4}},
    ]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(config("rnd_emb_qk", n_layer=4, layer_overrides=overrides)).double()
    idx = torch.randint(0, 61, (2, T))
    logits = torch.compile(model, backend="aot_eager", fullgraph=True)(idx)
    logits.sum().backward()
    torch.testing.assert_close(logits, model(idx), rtol=0, atol=1e-12)
    assert all(p.grad is not None for p in model.parameters())
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------------------------
# Shipped configs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_shipped_config_lists_every_option_at_its_default(name):
    fragment = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    assert list(fragment) == ["model"] and list(fragment["model"]) == ["config"]
    model_cfg = fragment["model"]["config"]
    assert model_cfg["attention"] == name
    assert model_cfg["attention_options"] == dataclasses.asdict(get_attention(name).Options())
    cfg = ModelConfig(preset="tiny", vocab_size=257, **model_cfg)
    assert cfg.attention == name
