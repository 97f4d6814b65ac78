"""The q/k transform stage composed with every backend that forms per-head q and k (issue 15).

For every composition {standard MHA, k_eq_v, q_eq_k, GQA, MQA + k_eq_v, differential, mla (with and without
QK-norm)} x {coupled (v1), uncoupled_mlp (v1), invertible (v2)}: parameter counts by hand (identity at init,
causality and SDPA path == math path in fp64 for these compositions are in the contract harness,
`tests/contract/test_contract.py`, over `tests/backend_cases.py`). For v2 on its
own: the inverse recovers (q, k) to 1e-12 in fp64, log |det J| equals the sum of the clamped scales, the additive form
preserves volume, the soft clamp bounds the scales, sharing counts, the default size at the 150m preset. Old
configs and a checkpoint saved by the pre-stage code load and give the same logits; `coupled` is exactly `standard`
+ the coupled transform; grouped K/V heads pair each query head with its key head; refusals say why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_cqk.attention import AttentionContext, MultiHeadLatentAttention, build_attention
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.attention.transforms.coupling import InvertibleCoupling
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

FIXTURE = Path(__file__).parent / "fixtures" / "legacy_coupled_v1.pt"
C, NH, T = 32, 4, 10
HS = C // NH

COMPOSITIONS = {
    "mha": ("standard", {}),
    "k_eq_v": ("standard", {"qkv_sharing": "k_eq_v"}),
    "q_eq_k": ("standard", {"qkv_sharing": "q_eq_k", "qk_norm": True}),
    "gqa": ("standard", {"n_kv_groups": 2}),
    "mqa_k_eq_v": ("standard", {"n_kv_groups": 1, "qkv_sharing": "k_eq_v"}),
    "differential": ("differential", {}),
    "mla": ("mla", {}),
    "mla_qk_norm": ("mla", {"qk_norm": True}),
}
TRANSFORMS = {
    "coupled": {"kind": "coupled", "hidden": 5},
    "uncoupled": {"kind": "uncoupled_mlp", "hidden": 5, "rope_order": "post"},
    "invertible": {"kind": "invertible", "hidden": 3},
    "invertible_post_shared": {"kind": "invertible", "hidden": 3, "rope_order": "post", "share_heads": True},
}


def pair_shape(name: str) -> tuple[int, int]:
    """(pairs P, pair width d) the stage sees for a backend at C, NH (mla: d_nope + d_rope = 2 hs)."""
    return (NH, 2 * HS) if name == "mla" else (NH, HS)


def make(name: str, options: dict, transform: dict | None = None, seed: int = 0, impl: str = "sdpa"):
    torch.manual_seed(seed)
    options = dict(options, impl=impl)
    if transform is not None:
        options["qk_transform"] = dict(transform)
    cfg = ModelConfig(n_embd=C, n_head=NH, n_layer=1, vocab_size=10, block_size=T, attention=name,
                      attention_options=options)  # fmt: skip
    backend = build_attention(cfg, 0).double()
    cos, sin = build_rope_cache(T, cfg.head_size)
    return backend, AttentionContext(cos=cos.double(), sin=sin.double())


def perturb_transform(backend, scale: float = 0.3, seed: int = 5) -> None:
    """Move every transform parameter off its init (so zero-initialised last layers act too)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.qk_transform.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def hand_count(kind: dict, P: int, d: int) -> int:
    """Parameters of one layer's transform, counted by hand."""
    H = kind.get("hidden") or d
    if kind["kind"] in ("coupled", "uncoupled_mlp"):
        return P * (2 * d * H + H + d) + 1  # f (or g_q + g_k, exact parity) + one dt per layer
    layers, groups = kind.get("layers", 2), 1 if kind.get("share_heads") else P
    d_out = d if kind.get("additive") else 2 * d
    return layers * groups * (d * H + H + H * d_out + d_out)


CASES = [(c, t) for c in COMPOSITIONS for t in TRANSFORMS]


@pytest.mark.parametrize("composition,transform", CASES)
def test_parameter_count_by_hand(composition, transform):
    name, options = COMPOSITIONS[composition]
    base, _ = make(name, options)
    composed, _ = make(name, options, TRANSFORMS[transform])
    P, d = pair_shape(name)
    count = sum(p.numel() for p in composed.parameters()) - sum(p.numel() for p in base.parameters())
    assert count == hand_count(TRANSFORMS[transform], P, d)


def test_grouped_heads_pair_each_query_head_with_its_key_head():
    """GQA + transform == MHA + transform whose key heads are the GQA key heads repeated per group."""
    spec = TRANSFORMS["invertible"]
    gqa, ctx = make("standard", {"n_kv_groups": 2}, spec)
    perturb_transform(gqa)
    mha, _ = make("standard", {}, spec, seed=1)
    state = gqa.state_dict()
    k_rows = state["k_proj.weight"].view(2, HS, C).repeat_interleave(NH // 2, dim=0).reshape(C, C)
    v_rows = state["v_proj.weight"].view(2, HS, C).repeat_interleave(NH // 2, dim=0).reshape(C, C)
    mha.load_state_dict({**state, "k_proj.weight": k_rows, "v_proj.weight": v_rows})
    x = torch.randn(2, T, C, dtype=torch.float64)
    torch.testing.assert_close(gqa(x, ctx), mha(x, ctx), rtol=0, atol=1e-13)
    cfg = ModelConfig(n_embd=C, n_head=NH, attention="standard",
                      attention_options={"n_kv_groups": 2, "qk_transform": spec})  # fmt: skip
    # The cache holds the transformed key of every query head plus the grouped values.
    assert type(gqa).kv_cache_values_per_token(cfg, gqa.options) == C + 2 * HS


def coupling(P: int = 3, d: int = 4, seed: int = 0, **options) -> InvertibleCoupling:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_embd=P * d, n_head=P, n_layer=1, vocab_size=10, block_size=8, position="none")
    module = InvertibleCoupling(cfg, 0, InvertibleCoupling.Options(**options), P, d).double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module


@pytest.mark.parametrize(
    "options", [{}, {"layers": 3, "scale_clamp": None}, {"layers": 4, "share_heads": True}, {"additive": True}]
)
def test_inverse_recovers_q_and_k(options):
    module = coupling(**options)
    q, k = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
    q1, k1 = module(q, k)
    assert (q1 - q).abs().max() > 0.1 and (k1 - k).abs().max() > 0.1
    q0, k0 = module.inverse(q1, k1)
    torch.testing.assert_close(q0, q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k0, k, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", [{}, {"layers": 3, "scale_clamp": 0.5}, {"additive": True}])
def test_log_det_jacobian_is_the_sum_of_scales(options):
    module = coupling(P=2, d=3, **options)
    z = torch.randn(2 * 2 * 3, dtype=torch.float64)  # one token: q (1, 2, 1, 3) and k (1, 2, 1, 3)

    def flat_map(z: torch.Tensor) -> torch.Tensor:
        q, k = module(z[:6].view(1, 2, 1, 3), z[6:].view(1, 2, 1, 3))
        return torch.cat((q.flatten(), k.flatten()))

    J = torch.autograd.functional.jacobian(flat_map, z)  # (12, 12)
    _, _, log_det = module.forward_with_log_det(z[:6].view(1, 2, 1, 3), z[6:].view(1, 2, 1, 3))  # (1, 2, 1)
    assert torch.allclose(torch.linalg.slogdet(J)[1], log_det.sum(), atol=1e-12)
    q1, k1, _ = module.forward_with_log_det(z[:6].view(1, 2, 1, 3), z[6:].view(1, 2, 1, 3))
    torch.testing.assert_close(torch.cat((q1.flatten(), k1.flatten())), flat_map(z), rtol=0, atol=1e-15)
    if options.get("additive"):
        assert log_det.abs().max() == 0 and torch.allclose(torch.linalg.det(J), torch.ones((), dtype=J.dtype))
    else:
        assert log_det.abs().max() > 1e-3
        # Per pair: the Jacobian is block-diagonal over pairs, each block's log det its own sum of scales.
        for h in range(2):
            idx = torch.tensor([3 * h + i for i in range(3)] + [6 + 3 * h + i for i in range(3)])
            assert torch.allclose(torch.linalg.slogdet(J[idx][:, idx])[1], log_det[0, h, 0], atol=1e-12)


def test_soft_clamp_bounds_the_scales():
    module = coupling(scale_clamp=0.25)
    with torch.no_grad():
        module.conditioners.w2.mul_(100.0)
    s, _ = module._scale_shift(0, torch.randn(3, 40, 4, dtype=torch.float64))  # pairs-first (P, N, d)
    assert s.abs().max() <= 0.25 and s.abs().max() > 0.24  # saturates at the clamp, never beyond


def _count(preset: str, **kw) -> int:
    with torch.device("meta"):
        return GPT(ModelConfig(preset=preset, **kw)).num_parameters()["total"]


def test_default_invertible_is_about_0_3_percent_of_150m():
    base = _count("150m")
    extra = _count("150m", attention_options={"qk_transform": {"kind": "invertible"}}) - base
    assert extra == 16 * 12 * 2 * (64 * 6 + 6 + 6 * 128 + 128) == 493_824
    assert 0.0025 <= extra / base <= 0.0035
    shared = _count("150m", attention_options={"qk_transform": {"kind": "invertible", "share_layers": True}}) - base
    assert shared == extra // 16  # one conditioner set for all layers, counted once


def test_coupled_name_is_standard_plus_the_coupled_transform():
    options = {"integrator": "euler", "hidden": 5, "steps": 2, "dt_scope": "head", "qk_norm": True}
    legacy, ctx = make("coupled", options)
    spec = {"kind": "coupled", **{k: v for k, v in options.items() if k != "qk_norm"}}
    composed, _ = make("standard", {"qk_norm": True}, spec, seed=1)
    composed.load_state_dict(legacy.state_dict())
    x = torch.randn(2, T, C, dtype=torch.float64)
    assert torch.equal(composed(x, ctx), legacy(x, ctx))


def test_checkpoint_saved_by_the_pre_stage_code_loads_with_identical_logits():
    data = torch.load(FIXTURE, weights_only=True)
    assert {case["config"]["attention"] for case in data["cases"].values()} >= {"coupled", "uncoupled_mlp"}
    for label, case in data["cases"].items():
        model = GPT(ModelConfig(**case["config"]))
        model.load_state_dict(case["state_dict"])  # strict: every old key is used, none is missing
        with torch.no_grad():
            logits = model.double().eval()(data["idx"])
        torch.testing.assert_close(logits, case["logits"], rtol=0, atol=1e-12, msg=label)
    # The pre-parity uncoupled bank's g_k output bias came back with the checkpoint.
    assert model is not None


def test_refusals_say_why():
    with pytest.raises(ValueError, match="already is standard attention"):
        ModelConfig(
            n_embd=C, n_head=NH, attention="coupled", attention_options={"qk_transform": {"kind": "invertible"}}
        )
    with pytest.raises(ValueError, match="Did you mean 'invertible'"):
        ModelConfig(n_embd=C, n_head=NH, attention_options={"qk_transform": {"kind": "invertable"}})
    with pytest.raises(ValueError, match="Did you mean 'layers'"):
        ModelConfig(n_embd=C, n_head=NH, attention_options={"qk_transform": {"kind": "invertible", "layer": 2}})
    with pytest.raises(ValueError, match="recompute='qk'"):
        ModelConfig(n_embd=C, n_head=NH, attention="differential",
                    attention_options={"qk_transform": {"kind": "coupled", "recompute": "qk"}})  # fmt: skip
    with pytest.raises(ValueError, match="scale_clamp"):
        ModelConfig(n_embd=C, n_head=NH, attention_options={"qk_transform": {"kind": "invertible", "scale_clamp": 0}})
    options = MultiHeadLatentAttention.parse_options({"qk_transform": {"kind": "invertible"}})
    assert "cannot be rewritten" in MultiHeadLatentAttention.absorbed_path_refusal(options)
    assert MultiHeadLatentAttention.absorbed_path_refusal(MultiHeadLatentAttention.parse_options({})) is None


@pytest.mark.parametrize(
    "options",
    [{}, {"scale_clamp": None, "layers": 3}, {"share_heads": True}, {"additive": True, "share_heads": True}],
    ids=["default", "no_clamp_3_layers", "shared_heads", "additive_shared"],
)
@pytest.mark.parametrize("layout", ["projection", "contiguous"])
def test_fused_equals_autograd_reference_fp64(options, layout):
    """The hand-written backward (`InvertibleCouplingFunction`, token-major, block-diagonal weights) against plain
    autograd on the pairs-first equations: outputs, q/k gradients and every parameter gradient."""
    P, d, B, T = 3, 4, 2, 5
    fused = coupling(P, d, **options, fused=True)
    reference = coupling(P, d, seed=1, **options, fused=False)
    reference.load_state_dict(fused.state_dict())
    if layout == "projection":  # views of a (B, T, P d) projection, as `split_heads` makes them
        q0 = torch.randn(B, T, P, d, dtype=torch.float64).transpose(1, 2)
        k0 = torch.randn(B, T, P, d, dtype=torch.float64).transpose(1, 2)
    else:
        q0, k0 = torch.randn(B, P, T, d, dtype=torch.float64), torch.randn(B, P, T, d, dtype=torch.float64)
    outs, grads = [], []
    for module in (fused, reference):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        q1, k1 = module(q, k)
        assert q1.stride() == q.stride() and k1.stride() == k.stride()  # the input's memory layout
        ((q1 * torch.linspace(-1, 2, d, dtype=q1.dtype)).sum() + (k1**2).sum()).backward()
        outs.append((q1.detach(), k1.detach()))
        grads.append([q.grad, k.grad] + [p.grad for p in module.parameters()])
    for a, b in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_shipped_yaml_lists_every_option_with_its_default():
    import dataclasses

    import yaml

    text = (Path(__file__).resolve().parents[3] / "configs" / "attention" / "invertible.yaml").read_text()
    options = yaml.safe_load(text)["model"]["config"]["attention_options"]
    spec = dict(options.pop("qk_transform"))
    assert spec.pop("kind") == "invertible"
    assert spec == {f.name: f.default for f in dataclasses.fields(InvertibleCoupling.Options)}
    ModelConfig(attention_options={**options, "qk_transform": {"kind": "invertible", **spec}}, vocab_size=257)


@pytest.mark.parametrize("options", [{}, {"scale_clamp": None}], ids=["clamped", "no_clamp"])
def test_fused_computes_the_scale_in_fp32_for_bf16_inputs(options):
    """Issue 32 item 5: in bf16 the fused path computed exp(S(s)) in bf16 (rounded twice before the product); now the
    scale is fp32 and the product is rounded once, as a compiler's fused kernel does. Pure bf16 (no autocast) runs
    forward and backward, with gradients in the inputs' dtype."""
    from lightning_cqk.attention.transforms.coupling import coupling_step_forward

    P, d = 3, 4
    module = coupling(P, d, **options, fused=True).to(torch.bfloat16)
    bank = module.conditioners
    cond, target = torch.randn(8, P * d, dtype=torch.bfloat16), torch.randn(8, P * d, dtype=torch.bfloat16)
    _, saved = coupling_step_forward(cond, target, bank.w1[0], bank.b1[0], bank.w2[0], bank.b2[0],
                                     module.options.scale_clamp, False)  # fmt: skip
    assert saved[3].dtype == torch.float32, "exp(S(s)) in fp32"
    q = torch.randn(2, P, 5, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, P, 5, d, dtype=torch.bfloat16, requires_grad=True)
    q1, k1 = module(q, k)
    (q1.float().sum() + k1.float().square().sum()).backward()
    assert q1.dtype == k1.dtype == q.grad.dtype == k.grad.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in module.parameters())
