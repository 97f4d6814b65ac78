"""Coupled QK dynamics (`coupled`) and the uncoupled control (`uncoupled_mlp`), arXiv 2604.01683 v1.

Checks (SDPA == math, causality and learning: the contract harness, `tests/contract/test_contract.py`): dt = 0 equals
`standard` with the same weights exactly; the batched per-head MLP equals a loop of independent MLPs; closed-form
-grad V equals autograd; leapfrog preserves volume and is reversible, and is symplectic (M^T J M = J) only for a
gradient field; Euler's Jacobian determinant is det(I - dt^2 J_f); leapfrog of a gradient field conserves energy to
second order; hand-counted parameters, the 60m fraction and the exact parameter parity of the uncoupled control at
every head size and hidden width; cross-layer sharing; analytic FLOPs; option validation; shipped YAMLs. That a tiny
GPT learns bytes is a contract check too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from lightning_cqk.attention import AttentionContext, build_attention, get_attention
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.attention.transforms.dynamics import HeadMLPBank, HeadPotentialBank
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import forward_flops_per_token
from lightning_cqk.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[4]
NAMES = ["coupled", "uncoupled_mlp"]
C, NH, T = 32, 4, 12


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def make(name: str, seed: int = 0, n_embd: int = C, n_head: int = NH, **options):
    """One fp64 backend of `name` (layer 0) and a RoPE context for T positions."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        n_embd=n_embd, n_head=n_head, n_layer=1, vocab_size=10, block_size=T, attention=name, attention_options=options
    )
    backend = build_attention(cfg, 0).double()
    cos, sin = build_rope_cache(T, cfg.head_size)
    return backend, AttentionContext(cos=cos.double(), sin=sin.double())


def _standard_extras() -> list[dict]:
    """Projection options of `standard` that the dynamics must compose with (those present in this checkout)."""
    fields = {f.name for f in dataclasses.fields(get_attention("standard").Options)}
    extras = [{}, {"qk_norm": True}]
    if "qkv_sharing" in fields:
        extras += [{"qkv_sharing": "k_eq_v"}, {"qkv_sharing": "q_eq_k", "qk_norm": True}]
    return extras


@pytest.mark.parametrize("extra", _standard_extras())
@pytest.mark.parametrize("rope_order", ["pre", "post"])
@pytest.mark.parametrize("name", NAMES)
def test_dt_zero_equals_standard_exactly(name, rope_order, extra):
    std, ctx = make("standard", **extra)
    dyn, _ = make(name, seed=1, dt_param="raw", dt_init=0.0, steps=3, rope_order=rope_order, **extra)
    missing, unexpected = dyn.load_state_dict(std.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("qk_transform.") for k in missing)
    x = torch.randn(2, T, C, dtype=torch.float64)
    assert torch.equal(dyn(x, ctx), std(x, ctx))
    # ...and the dynamics do act once dt != 0.
    with torch.no_grad():
        dyn.dt_raw.fill_(0.3)
    assert not torch.allclose(dyn(x, ctx), std(x, ctx))


def test_v_is_not_evolved_with_k_eq_v():
    if "qkv_sharing" not in {f.name for f in dataclasses.fields(get_attention("standard").Options)}:
        pytest.skip("standard has no qkv_sharing option in this checkout")
    a, ctx = make("coupled", qkv_sharing="k_eq_v")
    seen, attend = {}, a.attend

    def spy(q, k, v):  # record the v that reaches the attention product
        seen["v"] = v
        return attend(q, k, v)

    a.attend = spy
    x = torch.randn(1, T, C, dtype=torch.float64)
    a(x, ctx)
    torch.testing.assert_close(seen["v"], a.split_heads(a.k_proj(x)), rtol=0, atol=0)


def test_mlp_bank_equals_per_head_loop():
    torch.manual_seed(0)
    bank = HeadMLPBank(3, 4, 5).double()
    with torch.no_grad():
        for p in bank.parameters():
            p.normal_()
    x = torch.randn(2, 3, 6, 4, dtype=torch.float64)
    ref = torch.stack(
        [F.linear(F.silu(F.linear(x[:, h], bank.w1[h].T, bank.b1[h])), bank.w2[h].T, bank.b2[h]) for h in range(3)], 1
    )
    assert rel_err(bank(x), ref) < 1e-12


def test_gradient_field_is_minus_grad_potential():
    torch.manual_seed(0)
    bank = HeadPotentialBank(3, 4, 6).double()
    with torch.no_grad():
        bank.b1.normal_()
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(bank.potential(x).sum(), x)
    assert rel_err(bank(x), -grad) < 1e-12
    # Per-head potential: loop over heads with a plain MLP to a scalar.
    ref = torch.stack([F.silu(x[:, h] @ bank.w1[h] + bank.b1[h]) @ bank.w2[h] for h in range(3)], 1)
    assert rel_err(bank.potential(x), ref) < 1e-12


def _token_map(backend, dt):
    """The per-token map R^{2 hs} -> R^{2 hs} of head-stacked (q, k) for one token: z = [q (nh*hs), k (nh*hs)]."""
    nh, hs = backend.n_head, backend.head_size

    def fn(z):
        q, k = z[: nh * hs].view(1, nh, 1, hs), z[nh * hs :].view(1, nh, 1, hs)
        q, k = backend.evolve(q, k, dt=dt)
        return torch.cat([q.flatten(), k.flatten()])

    return fn


def _per_head_jacobians(backend, z, dt):
    """(nh, 2 hs, 2 hs): each head's block of the Jacobian (heads do not interact)."""
    nh, hs = backend.n_head, backend.head_size
    J = torch.autograd.functional.jacobian(_token_map(backend, dt), z)  # (2 nh hs, 2 nh hs)
    idx = [
        torch.cat([torch.arange(h * hs, (h + 1) * hs), nh * hs + torch.arange(h * hs, (h + 1) * hs)]) for h in range(nh)
    ]
    for h in range(nh):  # off-diagonal head blocks vanish
        others = torch.tensor([i for i in range(2 * nh * hs) if i not in set(idx[h].tolist())])
        assert J[idx[h]][:, others].abs().max() == 0
    return torch.stack([J[i][:, i] for i in idx])


@pytest.mark.parametrize("options", [{}, {"steps": 3}, {"gradient_field": True, "steps": 2}])
def test_leapfrog_preserves_volume_and_is_reversible(options):
    backend, _ = make("coupled", n_embd=8, n_head=2, **options)  # hs = 4
    dt = torch.tensor(0.7, dtype=torch.float64)
    z = torch.randn(16, dtype=torch.float64)
    J = _per_head_jacobians(backend, z, dt)
    assert (torch.linalg.det(J) - 1).abs().max() < 1e-10
    assert (J - torch.eye(8, dtype=torch.float64)).abs().max() > 0.1  # a non-trivial map
    q, k = torch.randn(2, 2, 5, 4, dtype=torch.float64), torch.randn(2, 2, 5, 4, dtype=torch.float64)
    q1, k1 = backend.evolve(q, k, dt=dt)
    q0, k0 = backend.evolve(q1, k1, dt=-dt)
    assert (q0 - q).abs().max() < 1e-10 and (k0 - k).abs().max() < 1e-10


@pytest.mark.parametrize("steps", [1, 2])
def test_leapfrog_is_symplectic_only_for_a_gradient_field(steps):
    """M^T J M = J (J = [[0, I], [-I, 0]]) for the per-token Jacobian M of leapfrog with f = -grad V; with a free MLP
    f (non-symmetric Jacobian) M still has determinant 1 (volume-preserving) but is not symplectic."""
    dt = torch.tensor(0.7, dtype=torch.float64)
    z = torch.randn(16, dtype=torch.float64)
    eye, zero = torch.eye(4, dtype=torch.float64), torch.zeros(4, 4, dtype=torch.float64)
    J = torch.cat((torch.cat((zero, eye), 1), torch.cat((-eye, zero), 1)))  # (8, 8) for one head's (q, k)
    defects = {}
    for gradient_field in (True, False):
        backend, _ = make("coupled", n_embd=8, n_head=2, steps=steps, gradient_field=gradient_field)
        M = _per_head_jacobians(backend, z, dt)  # (2, 8, 8), one per head
        assert (torch.linalg.det(M) - 1).abs().max() < 1e-10
        defects[gradient_field] = (M.transpose(-1, -2) @ J @ M - J).abs().max().item()
    assert defects[True] < 1e-12
    assert defects[False] > 1e-2


def test_euler_does_not_preserve_volume():
    backend, _ = make("coupled", n_embd=8, n_head=2, integrator="euler")
    dt = torch.tensor(0.7, dtype=torch.float64)
    z = torch.randn(16, dtype=torch.float64)
    dets = torch.linalg.det(_per_head_jacobians(backend, z, dt))
    # One simultaneous step has Jacobian [[I, dt I], [dt J_f, I]], whose determinant is det(I - dt^2 J_f(q)).
    J_f = torch.autograd.functional.jacobian(lambda q: backend.dynamics(q.view(1, 2, 1, 4)).flatten(), z[:8])
    expected = torch.stack(
        [
            torch.linalg.det(torch.eye(4, dtype=torch.float64) - dt**2 * J_f[h * 4 : h * 4 + 4, h * 4 : h * 4 + 4])
            for h in (0, 1)
        ]
    )
    torch.testing.assert_close(dets, expected, rtol=1e-10, atol=1e-12)
    assert (dets - 1).abs().min() > 1e-3
    q, k = torch.randn(1, 2, 5, 4, dtype=torch.float64), torch.randn(1, 2, 5, 4, dtype=torch.float64)
    q0, _ = backend.evolve(*backend.evolve(q, k, dt=dt), dt=-dt)
    assert (q0 - q).abs().max() > 1e-3  # and it is not reversible by flipping dt


def _max_energy_error(backend, dt: float, total_time: float) -> float:
    torch.manual_seed(3)
    q, k = torch.randn(4, 2, 3, 4, dtype=torch.float64), torch.randn(4, 2, 3, 4, dtype=torch.float64)

    def energy(q, k):
        return 0.5 * (k * k).sum(-1) + backend.dynamics.potential(q)  # (B, nh, T)

    h0, worst = energy(q, k), 0.0
    for _ in range(round(total_time / dt)):
        q, k = backend.evolve(q, k, dt=dt)
        worst = max(worst, (energy(q, k) - h0).abs().max().item())
    return worst


def test_gradient_field_leapfrog_conserves_energy_to_second_order():
    leap, _ = make("coupled", n_embd=8, n_head=2, gradient_field=True)
    err_coarse, err_fine = _max_energy_error(leap, 0.1, 2.0), _max_energy_error(leap, 0.05, 2.0)
    assert err_coarse < 0.05
    assert 3.0 < err_coarse / err_fine < 5.0  # O(dt^2)
    euler, _ = make("coupled", n_embd=8, n_head=2, gradient_field=True, integrator="euler")
    euler.load_state_dict(leap.state_dict())
    e_coarse, e_fine = _max_energy_error(euler, 0.1, 2.0), _max_energy_error(euler, 0.05, 2.0)
    assert e_coarse > 5 * err_coarse and 1.5 < e_coarse / e_fine < 2.6  # Euler drifts at first order


def _hand_count(name: str, nh: int, hs: int, hidden: int, gradient_field: bool = False, dt_scope: str = "layer"):
    """Extra parameters of one layer's dynamics bank (+ its dt) on top of standard attention."""
    if name == "uncoupled_mlp":
        # g_q: ceil(H/2) hidden units and an output bias; g_k: floor(H/2) hidden units, no output bias.
        bank = nh * ((2 * hs + 1) * ((hidden + 1) // 2 + hidden // 2) + hs)
    elif gradient_field:
        bank = nh * (hs * hidden + 2 * hidden)  # W1, b1, w2 (no output bias: it changes no force)
    else:
        bank = nh * (2 * hs * hidden + hidden + hs)  # W1, b1, W2, b2
    return bank + (nh if dt_scope == "head" else 1)


@pytest.mark.parametrize(
    "name,options",
    [
        ("coupled", {}),
        ("coupled", {"hidden": 7, "dt_scope": "head"}),
        ("coupled", {"gradient_field": True, "hidden": 6}),
        ("uncoupled_mlp", {}),
        ("uncoupled_mlp", {"hidden": 7, "dt_scope": "head"}),
    ],
)
def test_layer_parameter_count_by_hand(name, options):
    backend, _ = make(name, **options)
    extra = _hand_count(name, NH, C // NH, options.get("hidden", C // NH), options.get("gradient_field", False),
                        options.get("dt_scope", "layer"))  # fmt: skip
    assert sum(p.numel() for p in backend.parameters()) == 4 * C * C + extra


def _count(preset: str, **kw) -> int:
    with torch.device("meta"):
        return GPT(ModelConfig(preset=preset, **kw)).num_parameters()["total"]


def test_60m_extra_parameters_match_paper_fraction_and_uncoupled_is_matched():
    base = _count("60m")
    coupled = _count("60m", attention="coupled") - base
    uncoupled = _count("60m", attention="uncoupled_mlp") - base
    assert coupled == 8 * (64 * 64 * 2 + 64 + 64) + 10 == 66_570  # one bank for 10 layers + one dt per layer
    assert 0.0009 <= coupled / base <= 0.0013  # paper: 0.11%
    assert uncoupled == 8 * (64 * 32 + 32 + 32 * 64 + 64) + 8 * (64 * 32 + 32 + 32 * 64) + 10 == coupled
    legacy = _count("60m", attention="uncoupled_mlp", attention_options={"g_k_output_bias": True}) - base
    assert legacy == coupled + 8 * 64  # the pre-parity form: g_k's output bias
    per_layer = _count("60m", attention="coupled", attention_options={"share_dynamics": "layer"}) - base
    assert per_layer == 10 * 66_561


@pytest.mark.parametrize("name", NAMES)
def test_share_model_ties_one_bank_and_counts_it_once(name):
    cfg = dict(vocab_size=11, n_layer=3, n_embd=16, n_head=2, block_size=8, attention=name)
    shared = GPT(ModelConfig(**cfg))
    separate = GPT(ModelConfig(**cfg, attention_options={"share_dynamics": "layer"}))
    s_params = [dict(b.attn.dynamics.named_parameters()) for b in shared.blocks]
    for params in s_params[1:]:
        assert all(params[n] is s_params[0][n] for n in params)
    assert all(b.attn.dt_raw is not shared.blocks[0].attn.dt_raw for b in shared.blocks[1:])  # dt stays per layer
    p_params = [dict(b.attn.dynamics.named_parameters()) for b in separate.blocks]
    assert all(p_params[1][n] is not p_params[0][n] for n in p_params[0])
    bank = sum(p.numel() for p in s_params[0].values())
    assert separate.num_parameters()["total"] - shared.num_parameters()["total"] == 2 * bank
    assert shared.num_parameters()["total"] == sum(p.numel() for p in shared.parameters())
    # A checkpoint round trip keeps one tensor.
    reloaded = GPT(ModelConfig(**cfg))
    reloaded.load_state_dict(shared.state_dict())
    assert (
        reloaded.blocks[2].attn.dynamics.parameters().__next__()
        is reloaded.blocks[0].attn.dynamics.parameters().__next__()
    )


@pytest.mark.parametrize(
    "name,options", [("coupled", {}), ("coupled", {"gradient_field": True}), ("uncoupled_mlp", {})]
)
def test_gradients_reach_dt_and_the_dynamics(name, options):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, n_layer=2, n_embd=16, n_head=2, block_size=8, attention=name,
                            attention_options=options))  # fmt: skip
    idx = torch.randint(0, 11, (2, 8))
    logits = model(idx)
    assert torch.isfinite(logits).all()
    F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    for block in model.blocks:
        assert torch.isfinite(block.attn.dt_raw.grad).all() and block.attn.dt_raw.grad.abs().sum() > 0
    for n, p in model.blocks[0].attn.dynamics.named_parameters():
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_zero_init_last_first_step_is_a_drift(integrator):
    backend, _ = make("coupled", zero_init_last=True, integrator=integrator)
    q, k = torch.randn(2, NH, 5, C // NH, dtype=torch.float64), torch.randn(2, NH, 5, C // NH, dtype=torch.float64)
    q1, k1 = backend.evolve(q, k)
    torch.testing.assert_close(q1, q + backend.effective_dt() * k, rtol=0, atol=1e-15)
    assert torch.equal(k1, k)
    unc, _ = make("uncoupled_mlp", zero_init_last=True)
    q1, k1 = unc.evolve(q, k)
    assert torch.equal(q1, q) and torch.equal(k1, k)


@pytest.mark.parametrize("dt_param", ["softplus", "exp", "raw"])
@pytest.mark.parametrize("dt_scope,shape", [("layer", ()), ("head", (NH,))])
def test_dt_parameterisation_starts_at_dt_init(dt_param, dt_scope, shape):
    backend, _ = make("coupled", dt_param=dt_param, dt_scope=dt_scope, dt_init=0.37)
    stats = backend.dynamics_stats()
    assert stats["dt"].shape == shape and not stats["dt"].requires_grad
    torch.testing.assert_close(stats["dt"], torch.full(shape, 0.37, dtype=torch.float64))


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("coupled", {"steps": 0}, "steps=0"),
        ("coupled", {"steps": 8}, "1..7"),
        ("coupled", {"integrator": "rk4"}, "leapfrog"),
        ("coupled", {"dt_init": 0.0}, "dt_param='raw'"),
        ("coupled", {"dt_init": -0.1, "dt_param": "exp"}, "positive dt_init"),
        ("coupled", {"dt_param": "log"}, "dt_param"),
        ("coupled", {"dt_scope": "global"}, "dt_scope"),
        ("coupled", {"share_dynamics": "all"}, "share_dynamics"),
        ("coupled", {"rope_order": "middle"}, "rope_order"),
        ("coupled", {"hidden": 0}, "hidden"),
        ("coupled", {"impl": "flash"}, "impl"),
        ("uncoupled_mlp", {"hidden": 1}, "hidden >= 2"),
        ("uncoupled_mlp", {"integrator": "euler"}, "Valid options"),
        ("coupled", {"step": 2}, "Did you mean 'steps'"),
    ],
)
def test_impossible_options_are_refused_at_config_time(name, options, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(n_embd=32, n_head=4, attention=name, attention_options=options)


@pytest.mark.parametrize("hs", [4, 8, 16, 6])
@pytest.mark.parametrize("hidden", [None, 1, 2, 3, 5, 8, 64])
def test_uncoupled_has_exactly_the_parameters_of_coupled(hs, hidden):
    """Issue 17 item 3: parity at every head size and hidden width (banks, dt, whole models)."""
    if hidden == 1:  # uncoupled needs a hidden unit for each of g_q and g_k
        with pytest.raises(ValueError, match="hidden >= 2"):
            make("uncoupled_mlp", n_embd=2 * hs, n_head=2, hidden=1)
        return
    counts = {}
    for name in NAMES:
        for scope in ("layer", "head"):
            backend, _ = make(name, n_embd=2 * hs, n_head=2, hidden=hidden, dt_scope=scope)
            counts[name, scope] = sum(p.numel() for p in backend.parameters())
    assert counts["coupled", "layer"] == counts["uncoupled_mlp", "layer"]
    assert counts["coupled", "head"] == counts["uncoupled_mlp", "head"]


@pytest.mark.parametrize(
    "name,options,evaluations",
    [
        ("coupled", {}, 2),
        ("coupled", {"steps": 3}, 4),
        ("coupled", {"integrator": "euler", "steps": 3}, 3),
        ("coupled", {"gradient_field": True}, 2),
        ("uncoupled_mlp", {"steps": 2}, 2),
    ],
)
def test_analytic_flops(name, options, evaluations):
    cfg = dict(vocab_size=100, n_layer=2, n_embd=64, n_head=4, mlp_hidden=256, block_size=16)
    std = forward_flops_per_token(ModelConfig(**cfg), 16)
    ours = forward_flops_per_token(ModelConfig(**cfg, attention=name, attention_options=options), 16)
    assert ours - std == 2 * evaluations * 2 * 2 * 64 * 16  # layers x evals x (2 matmuls of hs x hidden) x nh


@pytest.mark.parametrize("name", NAMES)
def test_shipped_yaml_lists_every_option_with_its_default(name):
    text = (REPO / "configs" / "attention" / f"{name}.yaml").read_text()
    assert text.startswith("#") and "2604.01683" in text.splitlines()[1]
    spec = yaml.safe_load(text)
    assert set(spec) == {"model"} and set(spec["model"]) == {"config"}
    assert spec["model"]["config"]["attention"] == name
    options = spec["model"]["config"]["attention_options"]
    defaults = {f.name: f.default for f in dataclasses.fields(get_attention(name).Options)}
    assert options == defaults
    ModelConfig(attention=name, attention_options=options, vocab_size=257)


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
@pytest.mark.parametrize(
    "name,options",
    [
        ("coupled", {"qk_norm": True}),
        ("coupled", {"integrator": "euler", "gradient_field": True, "dt_scope": "head", "rope_order": "post"}),
        ("uncoupled_mlp", {"steps": 2}),
        ("coupled", {"recompute": "qk", "qkv_sharing": "k_eq_v"}),
    ],
)
def test_compiles_without_graph_breaks(name, options):
    torch._dynamo.reset()
    backend, ctx = make(name, **options)
    x = torch.randn(2, T, C, dtype=torch.float64)
    compiled = torch.compile(backend, fullgraph=True, backend="eager")  # fullgraph: any break or host sync raises
    torch.testing.assert_close(compiled(x, ctx), backend(x, ctx))


@pytest.mark.parametrize("mode", ["flow", "qk"])
@pytest.mark.parametrize(
    "name,options",
    [
        ("coupled", {}),
        ("coupled", {"integrator": "euler", "gradient_field": True, "dt_scope": "head", "steps": 2}),
        ("coupled", {"qkv_sharing": "k_eq_v", "qk_norm": True}),
        ("coupled", {"qkv_sharing": "q_eq_k"}),
        ("uncoupled_mlp", {"steps": 2, "rope_order": "post", "qk_norm": True}),
    ],
)
def test_recompute_gives_the_same_outputs_and_gradients(name, options, mode):
    eager, ctx = make(name, recompute="none", **options)
    ckpt, _ = make(name, recompute=mode, **options)
    ckpt.load_state_dict(eager.state_dict())
    x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
    y_e, y_c = eager(x, ctx), ckpt(x, ctx)
    assert torch.equal(y_e, y_c)
    g = torch.randn_like(y_e)
    grads_e = torch.autograd.grad(y_e, [x, *eager.parameters()], g)
    grads_c = torch.autograd.grad(y_c, [x, *ckpt.parameters()], g)
    for a, b in zip(grads_e, grads_c):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _bytes_alive_after_forward(module, x, ctx) -> int:
    """Bytes allocated by the forward and still alive when it returns (what backward keeps), from the profiler."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = module(x, ctx)
    sizes = []

    def walk(nodes):
        for node in nodes:
            if node.tag == _EventType.Allocation:
                sizes.append(node.extra_fields.alloc_size)
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    del y
    return sum(sizes)


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
def test_compiled_flow_recompute_keeps_only_q_and_k():
    """Compiled, recompute="flow" still keeps only q and k beyond `standard`: the compiler would otherwise merge the
    fast path's recompute with its forward and keep the states (5 tensors here instead of 2), so under compile the
    checkpointed plain flow runs."""
    x = torch.randn(4, T, 64, dtype=torch.float64, requires_grad=True)
    kept = {}
    for name in ("coupled", "standard"):
        torch._dynamo.reset()
        backend, ctx = make(name, n_embd=64, n_head=4)
        compiled = torch.compile(backend, backend="aot_eager")
        compiled(x, ctx).sum().backward()  # compile outside the measurement
        kept[name] = _bytes_alive_after_forward(compiled, x, ctx)
    per_tensor = 4 * T * 64 * 8  # one (B, T, C) fp64 tensor
    assert abs(kept["coupled"] - (kept["standard"] + 2 * per_tensor)) <= 4096, kept


@pytest.mark.parametrize("sharing", ["none", "k_eq_v", "q_eq_k"])
def test_recompute_modes_keep_what_they_claim(sharing):
    """none keeps the flow's intermediates; flow the size of q and k (q and the first kick, or q and a k kept
    anyway: a tied v is the raw k, a tied q is k); qk nothing of size beyond standard (but the transform unties a
    tied q: attention then keeps q and k apart)."""
    cfg = dict(n_embd=64, n_head=4, qkv_sharing=sharing)
    x = torch.randn(4, T, 64, dtype=torch.float64, requires_grad=True)
    kept = {}
    for mode in ("none", "flow", "qk"):
        backend, ctx = make("coupled", recompute=mode, **cfg)
        kept[mode] = _bytes_alive_after_forward(backend, x, ctx)
    std, ctx = make("standard", **cfg)
    kept["standard"] = _bytes_alive_after_forward(std, x, ctx)
    per_tensor = 4 * T * 64 * 8  # one (B, T, C) fp64 tensor
    small = 4096  # dt, scalars
    untied = 1 if sharing == "q_eq_k" else 0
    assert abs(kept["qk"] - (kept["standard"] + untied * per_tensor)) <= small, kept
    extra = 2 if sharing == "none" else 1  # + q and k; a raw k tied to v is kept by attention anyway; a tied q is k
    assert abs(kept["flow"] - (kept["qk"] + extra * per_tensor)) <= small, kept
    assert kept["none"] >= kept["flow"] + 3 * per_tensor, kept
