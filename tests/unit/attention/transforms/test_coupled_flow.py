"""The coupled flow's fast path (`attention/transforms/coupled_flow.py`, arXiv 2604.01683 v1) against plain autograd.

The fast path is an autograd.Function with a hand-written backward. Checked in fp64: outputs and gradients w.r.t. q, k,
dt and every bank parameter equal, to round-off (1e-12), a plain-autograd reference written from the definition
(k + dt/2 f(q) etc., f formed as the implementation before the fast path did): leapfrog and Euler, steps 1..3, dt per
layer and per pair, negative dt, both `keep` modes, upstream gradients in either memory layout, a bank without output
bias, one output unused, frozen inputs. On a whole `coupled` layer (recompute modes, QK-norm, RoPE pre/post, shared and
grouped heads, steps up to 7) outputs are bit-identical to `CoupledDynamics.flow` under plain autograd and gradients
agree to round-off; causality is unaffected; torch.compile traces forward and backward without graph breaks; the
gradient field and an autocast that would cast inside the flow take the autograd path.
"""

from __future__ import annotations

import pytest
import torch

from lightning_cqk.attention import AttentionContext, build_attention
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.attention.transforms.coupled_flow import coupled_mlp_flow, heads_back, heads_first
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

B, T, P, D, H = 2, 5, 3, 4, 5
TOL = dict(rtol=1e-12, atol=1e-12)


def bank_tensors(seed: int, per_pair_dt: bool, bias: bool = True, dt_sign: float = 1.0) -> dict[str, torch.Tensor]:
    """Random fp64 inputs of the flow: q, k (B, P, T, d) laid out like per-head views of projections, dt, the bank."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()

    dt_shape = (P, 1, 1) if per_pair_dt else ()
    dt = (dt_sign * (0.2 + 0.3 * torch.rand(dt_shape, generator=g, dtype=torch.float64))).requires_grad_()
    return dict(
        q=rnd(B, T, P, D).transpose(1, 2),  # (B, P, T, d) in (B, T, P, d) memory, like split_heads of a projection
        k=rnd(B, T, P, D).transpose(1, 2),
        dt=dt,
        w1=rnd(P, D, H, scale=D**-0.5),
        b1=rnd(P, H, scale=0.3),
        w2=rnd(P, H, D, scale=H**-0.5),
        b2=rnd(P, D, scale=0.3) if bias else None,
    )


def reference(q, k, dt, w1, b1, w2, b2, integrator: str, steps: int):
    """The flow written plainly (autograd differentiates it): the definition in `dynamics.py`."""

    def f(x):
        y = torch.nn.functional.silu(x @ w1 + b1[:, None]) @ w2  # (B, P, T, d), pair p through its own MLP
        return y if b2 is None else y + b2[:, None]

    if integrator == "euler":
        for _ in range(steps):
            q, k = q + dt * k, k + dt * f(q)
        return q, k
    for _ in range(steps):
        k = k + dt / 2 * f(q)
        q = q + dt * k
        k = k + dt / 2 * f(q)
    return q, k


def leaves(t: dict) -> list[torch.Tensor]:
    return [v for v in t.values() if v is not None]


def upstream(like: torch.Tensor, layout: str) -> torch.Tensor:
    """A random gradient (B, P, T, d): contiguous (as RoPE's backward hands it) or in the (B, T, P, d) memory layout."""
    if layout == "contiguous":
        return torch.randn(like.shape, dtype=like.dtype)
    return torch.randn(B, T, P, D, dtype=like.dtype).transpose(1, 2)


@pytest.mark.parametrize(
    "keep, keys_kept", [("inputs", False), ("inputs", True), ("all", False)], ids=["inputs", "inputs-keys-kept", "all"]
)
@pytest.mark.parametrize("per_pair_dt", [False, True])
@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_fast_path_equals_autograd_reference(integrator, steps, per_pair_dt, keep, keys_kept):
    """keys_kept: leapfrog's recompute starts from k_0 (else from the kept first kick a_0)."""
    t = bank_tensors(steps * 10 + per_pair_dt, per_pair_dt)
    fast = coupled_mlp_flow(**t, integrator=integrator, steps=steps, keep=keep, keys_kept=keys_kept)
    ref = reference(**t, integrator=integrator, steps=steps)
    layout = "contiguous" if (steps + per_pair_dt) % 2 else "tokens_first"
    gq, gk = upstream(ref[0], layout), upstream(ref[1], "tokens_first" if layout == "contiguous" else "contiguous")
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, **TOL)
    grads_fast = torch.autograd.grad(fast, leaves(t), (gq, gk))
    grads_ref = torch.autograd.grad(ref, leaves(t), (gq, gk))
    for name, a, b in zip([n for n, v in t.items() if v is not None], grads_fast, grads_ref):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_fast_path_without_output_bias_and_negative_dt(integrator):
    t = bank_tensors(7, True, bias=False, dt_sign=-1.0)
    fast = coupled_mlp_flow(**t, integrator=integrator, steps=2)
    ref = reference(**t, integrator=integrator, steps=2)
    g = [torch.randn_like(r) for r in ref]
    for a, b in zip(torch.autograd.grad(fast, leaves(t), g), torch.autograd.grad(ref, leaves(t), g)):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("keep", ["inputs", "all"])
@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_backward_twice_with_retain_graph(integrator, keep):
    """The reverse sweep writes dL/ds and dL/dz into its own buffer, never into a saved state: a second backward over
    the same graph (retain_graph) gives the same gradients as the first, both equal to the reference's."""
    t = bank_tensors(5, True)
    fast = coupled_mlp_flow(**t, integrator=integrator, steps=2, keep=keep)
    ref = reference(**t, integrator=integrator, steps=2)
    g = [torch.randn_like(r) for r in ref]
    first = torch.autograd.grad(fast, leaves(t), g, retain_graph=True)
    second = torch.autograd.grad(fast, leaves(t), g)
    for a, b, c in zip(first, second, torch.autograd.grad(ref, leaves(t), g)):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, **TOL)


@pytest.mark.parametrize("keep", ["inputs", "all"])
@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_tied_q_and_k(integrator, keep):
    """q is k (a tied q, Q=K-V): one tensor enters twice; its gradient is the sum of both roles' (leapfrog then keeps
    k_0, which is q_0, instead of a_0)."""
    t = bank_tensors(11, False)
    t["k"] = t["q"]
    fast = coupled_mlp_flow(**t, integrator=integrator, steps=2, keep=keep)
    ref = reference(**t, integrator=integrator, steps=2)
    g = [torch.randn_like(r) for r in ref]
    wrt = [v for name, v in t.items() if v is not None and name != "k"]
    for a, b in zip(torch.autograd.grad(fast, wrt, g), torch.autograd.grad(ref, wrt, g)):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_one_output_unused_and_frozen_inputs(integrator):
    """Only k_n reaches the loss (autograd hands zeros for q_n); dt and b1 need no gradient."""
    t = bank_tensors(3, False)
    t["dt"], t["b1"] = t["dt"].detach(), t["b1"].detach()
    fast = coupled_mlp_flow(**t, integrator=integrator, steps=2)
    ref = reference(**t, integrator=integrator, steps=2)
    wrt = [t["q"], t["k"], t["w1"], t["w2"], t["b2"]]
    for a, b in zip(torch.autograd.grad(fast[1].sum(), wrt), torch.autograd.grad(ref[1].sum(), wrt)):
        torch.testing.assert_close(a, b, **TOL)


def _layer(seed: int, **options):
    torch.manual_seed(seed)
    T = 8
    cfg = ModelConfig(
        n_embd=16, n_head=4, n_layer=1, vocab_size=10, block_size=T, attention="coupled", attention_options=options
    )
    backend = build_attention(cfg, 0).double()
    with torch.no_grad():  # move the bank off its init (zero biases) so every gradient term is exercised
        for p in backend.qk_transform.dynamics.parameters():
            p.add_(0.3 * torch.randn_like(p))
    cos, sin = build_rope_cache(T, cfg.head_size)
    return backend, AttentionContext(cos=cos.double(), sin=sin.double())


def plain_autograd_flow(self, q, k, dt, keys_kept=False):
    """`CoupledDynamics.flow` differentiated by autograd (no checkpoint), on (B, P, T, d) q and k."""
    q_n, k_n = self.flow(heads_first(q), heads_first(k), dt)  # (P, N, d) each
    return heads_back(q_n, q.size(0)), heads_back(k_n, q.size(0))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"recompute": "none"},
        {"recompute": "qk", "qk_norm": True},
        {"integrator": "euler", "steps": 3, "dt_scope": "head"},
        {"steps": 2, "dt_scope": "head", "dt_param": "raw", "dt_init": -0.2, "rope_order": "post"},
        {"integrator": "euler", "steps": 2, "qkv_sharing": "k_eq_v", "recompute": "none"},
        {"qkv_sharing": "q_eq_k"},
        {"n_kv_groups": 2, "integrator": "euler"},
        {"steps": 7},
    ],
)
def test_layer_fast_path_equals_autograd_flow(options, monkeypatch):
    """A whole `coupled` layer: outputs bit-identical, gradients to round-off, vs `flow` under plain autograd."""
    fast, ctx = _layer(0, **options)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    y_fast = fast(x, ctx)
    g = torch.randn_like(y_fast)
    grads_fast = torch.autograd.grad(y_fast, [x, *fast.parameters()], g)

    transform = type(fast.qk_transform)
    monkeypatch.setattr(transform, "flow_with_grad", plain_autograd_flow)
    y_ref = fast(x, ctx)
    grads_ref = torch.autograd.grad(y_ref, [x, *fast.parameters()], g)
    assert torch.equal(y_fast, y_ref)
    for (name, _), a, b in zip([("x", None), *fast.named_parameters()], grads_fast, grads_ref):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_layer_tells_the_flow_when_its_keys_are_kept(monkeypatch):
    """A tied v (Q-K=V) is the raw k, kept by attention anyway: the layer says so when that k reaches the flow
    unchanged; after QK-norm, or repeated for grouped heads, it does not."""
    import lightning_cqk.attention.transforms.dynamics as dynamics

    seen = []
    real = dynamics.coupled_mlp_flow

    def spy(*args, **kwargs):
        seen.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(dynamics, "coupled_mlp_flow", spy)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    cases = [
        ({}, False),
        ({"qkv_sharing": "k_eq_v"}, True),
        ({"qkv_sharing": "k_eq_v", "qk_norm": True}, False),
        ({"qkv_sharing": "k_eq_v", "n_kv_groups": 2}, False),
        ({"qkv_sharing": "q_eq_k"}, False),
    ]
    for options, expected in cases:
        seen.clear()
        backend, ctx = _layer(0, **options)
        backend(x, ctx).sum().backward()
        assert seen == [expected], options


def test_fast_path_is_taken_and_gradient_field_is_not(monkeypatch):
    import lightning_cqk.attention.transforms.dynamics as dynamics

    calls = []
    real = dynamics.coupled_mlp_flow

    def spy(*args, **kwargs):
        calls.append(args[7])
        return real(*args, **kwargs)

    monkeypatch.setattr(dynamics, "coupled_mlp_flow", spy)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    for options, expected in [({"integrator": "euler"}, ["euler"]), ({"gradient_field": True}, [])]:
        calls.clear()
        backend, ctx = _layer(0, **options)
        backend(x, ctx).sum().backward()
        assert calls == expected
    calls.clear()
    with torch.no_grad():  # no backward: the plain flow, nothing saved
        backend, ctx = _layer(0)
        backend(x, ctx)
    assert calls == []


@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_causality_unaffected(integrator):
    """Through the fast path, position t's output has an exactly zero gradient w.r.t. later inputs, and a GPT's logits
    up to t do not change when later tokens do."""
    backend, ctx = _layer(2, integrator=integrator, steps=2)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    t = 3
    (grad,) = torch.autograd.grad(backend(x, ctx)[:, t].sum(), x)
    assert torch.equal(grad[:, t + 1 :], torch.zeros_like(grad[:, t + 1 :]))
    assert grad[:, : t + 1].abs().sum() > 0

    torch.manual_seed(0)
    cfg = ModelConfig(n_embd=16, n_head=4, n_layer=2, vocab_size=11, block_size=8, attention="coupled")
    model = GPT(cfg).double()
    idx = torch.randint(0, 11, (2, 8))
    other = idx.clone()
    other[:, t + 1 :] = (idx[:, t + 1 :] + 1) % 11
    a, b = model(idx), model(other)  # grad mode: the fast path runs
    assert a.requires_grad
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.equal(a[:, t + 1 :], b[:, t + 1 :])


@pytest.mark.slow  # torch.compile traces: seconds to a minute on CPU (make test runs it)
@pytest.mark.parametrize("recompute", ["none", "flow"])
@pytest.mark.parametrize("integrator", ["leapfrog", "euler"])
def test_fast_path_compiles_without_graph_breaks(integrator, recompute):
    """recompute="none": the fast path's Function is traced; "flow": compiled, the checkpointed plain flow runs
    (`CoupledDynamics.flow_with_grad`)."""
    torch._dynamo.reset()
    backend, ctx = _layer(1, integrator=integrator, steps=2, recompute=recompute)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(backend, fullgraph=True, backend="aot_eager")  # traces backward too; breaks raise
    y_c = compiled(x, ctx)
    y_e = backend(x, ctx)
    torch.testing.assert_close(y_c, y_e, **TOL)
    g = torch.randn_like(y_e)
    for a, b in zip(
        torch.autograd.grad(y_c, [x, *backend.parameters()], g), torch.autograd.grad(y_e, [x, *backend.parameters()], g)
    ):
        torch.testing.assert_close(a, b, **TOL)


def test_autocast_that_would_cast_inside_the_flow_takes_the_autograd_path(monkeypatch):
    """Under CPU autocast to bf16, an fp32 q would be cast by the flow's matmuls: the fast path (which computes in q's
    dtype) steps aside; a bf16 q (what autocast's projections produce) keeps it."""
    import lightning_cqk.attention.transforms.dynamics as dynamics

    calls = []
    real = dynamics.coupled_mlp_flow
    monkeypatch.setattr(dynamics, "coupled_mlp_flow", lambda *a, **kw: calls.append(a[0].dtype) or real(*a, **kw))
    backend, _ = _layer(0)
    transform = backend.qk_transform.float()
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(2, 4, 8, 4, dtype=dtype, requires_grad=True)
        k = torch.randn(2, 4, 8, 4, dtype=dtype, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q_n, k_n = transform(q, k)
        (q_n.float().sum() + k_n.float().sum()).backward()
        assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert calls == [torch.bfloat16]
