"""Shared Q/K/V projections and grouped K/V heads (options of `standard`; arXiv 2606.04032), and QK-norm.

Checks, for every `qkv_sharing` x `n_kv_groups` setting (SDPA == math in fp64, causality, finiteness and learning bytes
are in the contract harness, `tests/contract/test_contract.py`, over the settings of `tests/backend_cases.py`): tied
roles are one parameter, exact equality with a standard MHA twin whose weights are the tied/repeated copies (the
degenerate cases) including the gradient of every tied matrix, hand-counted parameters, the paper's 300M attention
totals, KV-cache reductions of the paper's table, analytic FLOPs against `torch.utils.flop_counter`, config errors, the
shipped YAML fragments, and that every setting compiles with fullgraph=True. Also the QK-norm option of `standard`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from flop_counting import analytic_sdpa_training_flops, counted_sdpa_flops
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_cqk.attention import AttentionContext, StandardAttention, build_attention
from lightning_cqk.attention.backends.standard import StandardOptions
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import training_flops_per_token
from lightning_cqk.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[4]
C, NH, HS, T = 32, 4, 8, 12

# (qkv_sharing, n_kv_groups) at NH = 4 heads, and the paper's names for them.
SETTINGS = [
    ("none", None),
    ("none", 2),
    ("none", 1),
    ("k_eq_v", None),
    ("k_eq_v", 2),
    ("k_eq_v", 1),
    ("q_eq_k", None),
    ("q_eq_k_eq_v", None),
]
IDS = ["QKV", "GQA-2", "MQA", "Q-K=V", "Q-GQA-2", "Q-MQA", "Q=K-V", "Q=K=V"]
Q_TIED = {"q_eq_k", "q_eq_k_eq_v"}
V_TIED = {"k_eq_v", "q_eq_k_eq_v"}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def make(sharing="none", groups=None, *, impl="sdpa", qk_norm=False, bias=False, position="rope", seed=0):
    """(config, fp64 backend with random weights and norm gains) for one setting."""
    options = dict(impl=impl, qk_norm=qk_norm, qkv_sharing=sharing, n_kv_groups=groups)
    cfg = ModelConfig(
        n_embd=C, n_head=NH, n_layer=1, vocab_size=11, block_size=T, bias=bias, position=position,
        attention_options=options,
    )  # fmt: skip
    torch.manual_seed(seed)
    attn = build_attention(cfg, 0).double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            # Random gains and biases too, so that a wrong tie or a misplaced norm cannot hide behind 1s and 0s.
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return cfg, attn


def context(cfg: ModelConfig) -> AttentionContext:
    if cfg.position != "rope":
        return AttentionContext()
    cos, sin = build_rope_cache(T, cfg.head_size)
    return AttentionContext(cos=cos.double(), sin=sin.double())


def run_fwd_bwd(attn: nn.Module, x: torch.Tensor, ctx: AttentionContext, g: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    attn.zero_grad()
    y = attn(x, ctx)
    y.backward(g)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in attn.named_parameters()}


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
def test_every_setting_compiles_without_graph_breaks():
    """fullgraph=True fails on any graph break (host sync, data-dependent branch); aot_eager also traces backward.
    Three settings cover every branch (tied q, tied v, grouped K/V heads), keeping the compile time down."""
    for sharing, groups in [("none", 1), ("k_eq_v", 2), ("q_eq_k", None)]:
        torch._dynamo.reset()
        cfg, attn = make(sharing, groups, qk_norm=True)
        compiled = torch.compile(attn, backend="aot_eager", fullgraph=True)
        x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
        y = compiled(x, context(cfg))
        y.sum().backward()
        torch.testing.assert_close(y, attn(x, context(cfg)), rtol=0, atol=1e-12)
        assert x.grad is not None and attn.k_proj.weight.grad is not None


# ------------------------------------------------------------------------------------------ tying
@pytest.mark.parametrize("sharing,groups", SETTINGS, ids=IDS)
def test_tied_roles_are_one_parameter(sharing, groups):
    cfg, attn = make(sharing, groups, qk_norm=True)
    nkv = NH if groups is None else groups
    assert (attn.q_proj is None) == (sharing in Q_TIED)
    assert (attn.v_proj is None) == (sharing in V_TIED)
    assert (attn.q_norm is None) == (sharing in Q_TIED), "a tied q shares k's norm"
    assert attn.k_proj.weight.shape == (nkv * HS, C)
    n_linear = sum(isinstance(m, nn.Linear) for m in attn.modules())
    assert n_linear == 4 - (sharing in Q_TIED) - (sharing in V_TIED)
    x = torch.randn(2, T, C, dtype=torch.float64)
    q, k, v = attn.project(x)
    assert q.shape == (2, NH, T, HS) and k.shape == v.shape == (2, nkv, T, HS)
    assert (q is k) == (sharing in Q_TIED)
    assert (v is k) == (sharing in V_TIED)
    q2, k2 = attn.transform_qk(q, k, context(cfg))
    assert (q2 is k2) == (sharing in Q_TIED)
    if sharing in V_TIED:
        # V is the raw projection: neither normalised nor rotated (only the k used for scoring is).
        torch.testing.assert_close(v, attn.split_heads(F.linear(x, attn.k_proj.weight)), rtol=0, atol=0)
        assert not torch.allclose(k2, v)


def expand_heads(w: torch.Tensor, rep: int) -> torch.Tensor:
    """(nkv * hs, ...) -> (nkv * rep * hs, ...): each K/V head's rows repeated for its query group."""
    return w.unflatten(0, (-1, HS)).repeat_interleave(rep, dim=0).flatten(0, 1)


def fold_heads(g: torch.Tensor, rep: int) -> torch.Tensor:
    """Adjoint of `expand_heads`: sum the gradients of a group's copies back onto its K/V head."""
    return g.unflatten(0, (-1, rep, HS)).sum(dim=1).flatten(0, 1)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("sharing,groups", SETTINGS, ids=IDS)
def test_equals_standard_mha_with_tied_and_repeated_weights(sharing, groups, qk_norm):
    """The degenerate cases: q_eq_k == standard with W_Q := W_K; k_eq_v == standard with W_V := W_K (V without
    RoPE); q_eq_k_eq_v == standard with all three := W_K; GQA-g == standard whose K/V rows are repeated per group.
    The tied matrix's gradient must be the sum of the twin's gradients over the roles (and copies) it plays."""
    cfg, shared = make(sharing, groups, qk_norm=qk_norm, bias=True)
    _, twin = make("none", None, qk_norm=qk_norm, bias=True, seed=1)
    rep = NH // (NH if groups is None else groups)
    q_src = shared.k_proj if shared.q_proj is None else shared.q_proj
    v_src = shared.k_proj if shared.v_proj is None else shared.v_proj
    with torch.no_grad():
        for part in ("weight", "bias"):
            twin.q_proj.get_parameter(part).copy_(q_src.get_parameter(part))
            twin.k_proj.get_parameter(part).copy_(expand_heads(shared.k_proj.get_parameter(part), rep))
            twin.v_proj.get_parameter(part).copy_(expand_heads(v_src.get_parameter(part), rep))
            twin.out_proj.get_parameter(part).copy_(shared.out_proj.get_parameter(part))
        if qk_norm:
            twin.q_norm.weight.copy_((shared.q_norm or shared.k_norm).weight)
            twin.k_norm.weight.copy_(shared.k_norm.weight)
    x = torch.randn(2, T, C, dtype=torch.float64)
    g = torch.randn(2, T, C, dtype=torch.float64)
    ys, gxs, gps = run_fwd_bwd(shared, x, context(cfg), g)
    yt, gxt, gpt = run_fwd_bwd(twin, x, context(cfg), g)
    torch.testing.assert_close(ys, yt, rtol=0, atol=1e-12)
    torch.testing.assert_close(gxs, gxt, rtol=0, atol=1e-12)
    for part in ("weight", "bias"):
        expected_k = fold_heads(gpt[f"k_proj.{part}"], rep)
        if sharing in Q_TIED:
            expected_k = expected_k + gpt[f"q_proj.{part}"]
        else:
            torch.testing.assert_close(gps[f"q_proj.{part}"], gpt[f"q_proj.{part}"], rtol=0, atol=1e-12)
        if sharing in V_TIED:
            expected_k = expected_k + fold_heads(gpt[f"v_proj.{part}"], rep)
        else:
            torch.testing.assert_close(
                gps[f"v_proj.{part}"], fold_heads(gpt[f"v_proj.{part}"], rep), rtol=0, atol=1e-12
            )
        torch.testing.assert_close(gps[f"k_proj.{part}"], expected_k, rtol=0, atol=1e-12)
        torch.testing.assert_close(gps[f"out_proj.{part}"], gpt[f"out_proj.{part}"], rtol=0, atol=1e-12)
    if qk_norm:
        expected_gain = gpt["k_norm.weight"] + (gpt["q_norm.weight"] if sharing in Q_TIED else 0)
        torch.testing.assert_close(gps["k_norm.weight"], expected_gain, rtol=0, atol=1e-12)


def test_gqa_with_n_head_groups_is_standard():
    cfg, mha = make("none", None, qk_norm=True, bias=True)
    _, grouped = make("none", NH, qk_norm=True, bias=True, seed=1)
    assert {k: v.shape for k, v in grouped.state_dict().items()} == {k: v.shape for k, v in mha.state_dict().items()}
    grouped.load_state_dict(mha.state_dict())
    x = torch.randn(2, T, C, dtype=torch.float64)
    torch.testing.assert_close(grouped(x, context(cfg)), mha(x, context(cfg)), rtol=0, atol=0)


def test_k_eq_v_differs_from_standard_with_independent_v():
    """Control for the twin test: with an independent W_V the outputs differ, so the equality above is not vacuous."""
    cfg, shared = make("k_eq_v")
    _, twin = make("none", None, seed=1)
    twin.load_state_dict(shared.state_dict(), strict=False)
    x = torch.randn(2, T, C, dtype=torch.float64)
    assert rel(shared(x, context(cfg)), twin(x, context(cfg))) > 1e-3


def test_default_standard_is_unchanged():
    assert StandardOptions() == StandardOptions(impl="sdpa", qk_norm=False, qkv_sharing="none", n_kv_groups=None)
    attn = build_attention(ModelConfig(n_embd=C, n_head=NH, vocab_size=11), 0)
    assert sorted(attn.state_dict()) == sorted(f"{p}_proj.weight" for p in ("q", "k", "v", "out"))
    assert all(attn.get_parameter(f"{p}_proj.weight").shape == (C, C) for p in ("q", "k", "v", "out"))


@pytest.mark.parametrize("sharing", ["q_eq_k", "q_eq_k_eq_v", "none"])
@pytest.mark.parametrize("position,qk_norm", [("none", False), ("rope", True)], ids=["nopos", "rope+qk_norm"])
def test_q_eq_k_pre_mask_scores_are_symmetric(sharing, position, qk_norm):
    """Q=K-V scores k_i . k_j are symmetric before the mask (with RoPE too: (R_i k_i) . (R_j k_j)); QKV's are not."""
    cfg, attn = make(sharing, position=position, qk_norm=qk_norm)
    q, k, _ = attn.project(torch.randn(2, T, C, dtype=torch.float64))
    q, k = attn.transform_qk(q, k, context(cfg))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(HS)  # (B, nh, T, T), as attention_probs forms them
    if sharing == "none":
        assert rel(scores, scores.transpose(-2, -1)) > 0.1
    else:
        torch.testing.assert_close(scores, scores.transpose(-2, -1), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ counts
# Hand counts at C = 32, NH = 4, HS = 8 (weights, then biases): out + q + k + v, with k and v C x (nkv * 8).
HAND_COUNTS = {
    "QKV": (1024 + 1024 + 1024 + 1024, 32 + 32 + 32 + 32),
    "GQA-2": (1024 + 1024 + 512 + 512, 32 + 32 + 16 + 16),
    "MQA": (1024 + 1024 + 256 + 256, 32 + 32 + 8 + 8),
    "Q-K=V": (1024 + 1024 + 1024, 32 + 32 + 32),
    "Q-GQA-2": (1024 + 1024 + 512, 32 + 32 + 16),
    "Q-MQA": (1024 + 1024 + 256, 32 + 32 + 8),
    "Q=K-V": (1024 + 1024 + 1024, 32 + 32 + 32),
    "Q=K=V": (1024 + 1024, 32 + 32),
}


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("sharing,groups,paper_name", [(*s, i) for s, i in zip(SETTINGS, IDS)], ids=IDS)
def test_parameter_count_matches_hand_count(sharing, groups, paper_name, bias, qk_norm):
    _, attn = make(sharing, groups, bias=bias, qk_norm=qk_norm)
    weights, biases = HAND_COUNTS[paper_name]
    norms = (HS if sharing in Q_TIED else 2 * HS) if qk_norm else 0
    assert sum(p.numel() for p in attn.parameters()) == weights + (biases if bias else 0) + norms


@pytest.mark.parametrize(
    "sharing,millions,exact",
    [("none", 83.97, 83_968_000), ("k_eq_v", 62.98, 62_976_000), ("q_eq_k", 62.98, 62_976_000),
     ("q_eq_k_eq_v", 41.98, 41_984_000)],
)  # fmt: skip
def test_paper_300m_attention_parameter_totals(sharing, millions, exact):
    """arXiv 2606.04032 at 300M (20 layers, d 1024, 16 heads, biases): attention params 83.97M / 62.98M / 41.98M."""
    cfg = ModelConfig(
        n_layer=20, n_embd=1024, n_head=16, mlp_hidden=4096, block_size=2048, vocab_size=50304, bias=True,
        position="learned", attention_options={"qkv_sharing": sharing},
    )  # fmt: skip
    with torch.device("meta"):
        total = sum(p.numel() for i in range(cfg.n_layer) for p in build_attention(cfg, i).parameters())
    assert total == exact
    assert round(total / 1e6, 2) == millions


def test_60m_preset_parameter_drops():
    def total(**options):
        with torch.device("meta"):
            return GPT(ModelConfig(preset="60m", attention_options=options)).num_parameters()["total"]

    L, C60 = 10, 512
    base = total()
    assert base - total(qkv_sharing="k_eq_v") == L * C60 * C60  # one C x C matrix per layer, no bias
    assert base - total(qkv_sharing="q_eq_k") == L * C60 * C60
    assert base - total(qkv_sharing="q_eq_k_eq_v") == 2 * L * C60 * C60
    assert base - total(n_kv_groups=2) == L * 2 * C60 * (C60 - 2 * 64)  # K and V shrink to 2 heads of 64
    # Q-MQA: V gone (C x C) and K shrinks to one head of 64.
    assert base - total(qkv_sharing="k_eq_v", n_kv_groups=1) == L * (C60 * C60 + C60 * (C60 - 64))


def test_kv_cache_values_per_token():
    expected = {"QKV": 64, "GQA-2": 32, "MQA": 16, "Q-K=V": 32, "Q-GQA-2": 16, "Q-MQA": 8, "Q=K-V": 64, "Q=K=V": 32}
    cfg = ModelConfig(n_embd=C, n_head=NH, vocab_size=11)
    for (sharing, groups), paper_name in zip(SETTINGS, IDS):
        options = StandardOptions(qkv_sharing=sharing, n_kv_groups=groups)
        assert StandardAttention.kv_cache_values_per_token(cfg, options) == expected[paper_name], paper_name


@pytest.mark.parametrize(
    "sharing,groups,reduction",
    [("k_eq_v", None, 0.5), ("q_eq_k", None, 0.0), ("q_eq_k_eq_v", None, 0.5), ("none", 4, 0.75),
     ("none", 1, 0.9375), ("k_eq_v", 4, 0.875), ("k_eq_v", 1, 0.96875)],
    ids=["Q-K=V", "Q=K-V", "Q=K=V", "GQA-4", "MQA", "Q-GQA-4", "Q-MQA"],
)  # fmt: skip
def test_kv_cache_reductions_match_paper_table(sharing, groups, reduction):
    """arXiv 2606.04032's table at 16 heads: 50%, 0%, 50%, 75%, 93.8%, 87.5%, 96.9% less cache than MHA."""
    cfg = ModelConfig(n_layer=1, n_embd=1024, n_head=16, mlp_hidden=4096, vocab_size=11)
    mha = StandardAttention.kv_cache_values_per_token(cfg, StandardOptions())
    assert mha == 2 * 1024
    ours = StandardAttention.kv_cache_values_per_token(cfg, StandardOptions(qkv_sharing=sharing, n_kv_groups=groups))
    assert 1 - ours / mha == reduction


# ------------------------------------------------------------------------------------------ FLOPs
def counted_training_flops(config: ModelConfig, B: int, T_: int) -> int:
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (B, T_))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("sharing,groups", SETTINGS, ids=IDS)
def test_analytic_flops_match_flop_counter(sharing, groups):
    """Math path: every matmul is visible to the counter, so the analytic count is exact. SDPA: exact too once the
    attention products are replaced by what the counter reports for the same SDPA call on this torch (it may not see
    the CPU kernel at all, and counts its backward as five products rather than four: `flop_counting`)."""
    B, T_, nh, hs = 2, 32, 4, 16
    for impl in ("math", "sdpa"):
        options = dict(impl=impl, qkv_sharing=sharing, n_kv_groups=groups)
        cfg = ModelConfig(vocab_size=97, n_layer=2, n_embd=64, n_head=nh, block_size=T_, attention_options=options)
        analytic = training_flops_per_token(cfg, T_) * B * T_
        if impl == "sdpa":
            per_layer = counted_sdpa_flops(B, nh, T_, hs, kv_heads=groups) - analytic_sdpa_training_flops(B, nh, T_, hs)
            analytic += cfg.n_layer * per_layer
        assert counted_training_flops(cfg, B, T_) == analytic, impl


def test_forward_flops_formula_by_hand():
    cfg = ModelConfig(n_embd=64, n_head=4, vocab_size=11)
    flops = lambda **o: StandardAttention.forward_flops_per_token(cfg, StandardOptions(**o), 100)  # noqa: E731
    attend = 4 * 100 * 64  # scores and values: per query head, unchanged by sharing and grouping
    assert flops() == 8 * 64 * 64 + attend
    assert flops(qkv_sharing="k_eq_v") == 6 * 64 * 64 + attend
    assert flops(qkv_sharing="q_eq_k") == 6 * 64 * 64 + attend
    assert flops(qkv_sharing="q_eq_k_eq_v") == 4 * 64 * 64 + attend
    assert flops(n_kv_groups=1) == 4 * 64 * 64 + 2 * 2 * 64 * 16 + attend
    assert flops(qkv_sharing="k_eq_v", n_kv_groups=2) == 4 * 64 * 64 + 2 * 64 * 32 + attend


# ------------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    "options,match",
    [
        ({"n_kv_groups": 3}, "n_head=4 is not divisible by n_kv_groups=3.*among \\[1, 2, 4\\]"),
        ({"n_kv_groups": 8}, "n_kv_groups=8 exceeds n_head=4"),
        ({"n_kv_groups": 0}, "positive integer"),
        ({"n_kv_groups": 2.0}, "positive integer"),
        ({"qkv_sharing": "q_eq_k", "n_kv_groups": 2}, "ties q to k.*n_kv_groups=null"),
        ({"qkv_sharing": "q_eq_k_eq_v", "n_kv_groups": 1}, "ties q to k"),
        ({"qkv_sharing": "k=v"}, "qkv_sharing='k=v' is not one of"),
        ({"n_kv_gruops": 2}, "Did you mean 'n_kv_groups'"),
    ],
)
def test_impossible_options_fail_at_config_time(options, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(n_embd=C, n_head=NH, vocab_size=11, attention_options=options)


def test_q_eq_k_with_n_head_groups_is_accepted():
    ModelConfig(n_embd=C, n_head=NH, vocab_size=11, attention_options={"qkv_sharing": "q_eq_k", "n_kv_groups": NH})


# ------------------------------------------------------------------------------------------ QK-norm (standard)
def test_qk_norm_modules_present_only_when_enabled():
    _, plain = make()
    _, normed = make(qk_norm=True)
    assert plain.q_norm is None and plain.k_norm is None
    assert not any(isinstance(m, nn.RMSNorm) for m in plain.modules())
    assert isinstance(normed.q_norm, nn.RMSNorm) and isinstance(normed.k_norm, nn.RMSNorm)
    assert normed.q_norm.weight.shape == normed.k_norm.weight.shape == (HS,)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(normed) == count(plain) + 2 * HS


def test_qk_norm_normalises_each_head_and_changes_the_output():
    cfg, normed = make(qk_norm=True, position="none")
    _, plain = make(seed=1, position="none")
    plain.load_state_dict(normed.state_dict(), strict=False)  # same projections, no norms
    with torch.no_grad():
        normed.q_norm.weight.fill_(1.0)
        normed.k_norm.weight.fill_(1.0)
    x = torch.randn(2, T, C, dtype=torch.float64)
    q, k, _ = normed.project(x)
    q, k = normed.transform_qk(q, k, context(cfg))
    ones = torch.ones(2, NH, T, dtype=torch.float64)
    torch.testing.assert_close(q.square().mean(-1), ones, rtol=1e-4, atol=0)  # unit RMS per head (up to eps)
    torch.testing.assert_close(k.square().mean(-1), ones, rtol=1e-4, atol=0)
    assert rel(normed(x, context(cfg)), plain(x, context(cfg))) > 1e-3


# ------------------------------------------------------------------------------------------ YAML
FRAGMENTS = {
    "k_eq_v": ("k_eq_v", None),
    "q_eq_k": ("q_eq_k", None),
    "q_eq_k_eq_v": ("q_eq_k_eq_v", None),
    "gqa": ("none", 2),
    "mqa": ("none", 1),
}


@pytest.mark.parametrize("fragment", sorted(FRAGMENTS))
def test_yaml_fragment_composes_with_quickstart(fragment):
    path = REPO / "configs" / "attention" / f"{fragment}.yaml"
    text = path.read_text()
    assert text.startswith("#") and "arXiv 2606.04032" in text.split("model:")[0]
    doc = yaml.safe_load(text)
    assert list(doc) == ["model"] and list(doc["model"]) == ["config"]
    assert set(doc["model"]["config"]) == {"attention", "attention_options"}
    assert doc["model"]["config"]["attention"] == "standard"
    options = doc["model"]["config"]["attention_options"]
    assert list(options) == [f.name for f in dataclasses.fields(StandardOptions)], "list every option"
    assert (options["qkv_sharing"], options["n_kv_groups"]) == FRAGMENTS[fragment]
    # As `--config configs/quickstart.yaml --config <fragment>` would: the fragment's keys win.
    model_cfg = dict(yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())["model"]["config"])
    model_cfg.update(doc["model"]["config"])
    cfg = ModelConfig(**model_cfg, vocab_size=257)
    model = GPT(cfg)
    assert model(torch.randint(0, 257, (1, 16))).shape == (1, 16, 257)
