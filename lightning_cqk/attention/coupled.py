"""Coupled query-key dynamics (`coupled`) and its uncoupled control (`uncoupled_mlp`).

Paper: B. Gahtan and A. M. Bronstein, "Coupled Query-Key Dynamics for Attention", arXiv 2604.01683 v1 (2026).
Only the abstract and a third-party summary of v1 could be read (`shared/papers.md` section 1), so every choice
below that the digest tags [NS] is an option, with the default we picked and why.

Per head, after the q/k projections (and QK-norm) and before scoring, the pair (q, k) of every token is evolved
for `steps` steps of a learned step size dt (all shapes (B, nh, T, hs); the map acts on each token on its own, so
causality and KV caching are untouched: a cache stores the evolved k):

    euler     (simultaneous, the summary's formula):   q' = q + dt k,   k' = k + dt f(q)
    leapfrog  (kick-drift-kick, symplectic):           k_half = k + dt/2 f(q),  q' = q + dt k_half,
                                                        k' = k_half + dt/2 f(q')
    scores    softmax(q_n k_n^T / sqrt(hs) + causal mask) v       (v is never evolved)

f is a per-head two-layer SiLU MLP, f_h(q) = W2_h silu(W1_h q + b1_h) + b2_h, batched over heads (parameters
(nh, hs, hidden), (nh, hidden), (nh, hidden, hs), (nh, hs)). With `gradient_field=True`, f = -grad V(q) of a
per-head scalar potential V_h(q) = w2_h . silu(W1_h q + b1_h), in closed form
-grad V = -W1_h (w2_h * silu'(z)), silu'(z) = s(z) (1 + z (1 - s(z))), s = sigmoid; then leapfrog is the
Stormer-Verlet integrator of H(q, k) = |k|^2 / 2 + V(q), a true Hamiltonian flow. Leapfrog steps share the force
evaluation between the closing kick of one step and the opening kick of the next: n steps cost n + 1 evaluations
of f, Euler costs n.

`uncoupled_mlp` is the paper's "uncoupled MLP of matched capacity", whose form is [NS]; we use the residual form
q' = q + dt g_q(q), k' = k + dt g_k(k) for `steps` steps (per-head two-layer SiLU MLPs g_q, g_k). Matched capacity:
with `hidden = H` (same option as `coupled`), g_q gets ceil(H/2) and g_k floor(H/2) hidden units, so the banks hold
nh ((2 hs + 1) H + 2 hs) parameters against coupled's nh ((2 hs + 1) H + hs); the gap nh*hs is about 1/(2H) of
the bank (0.77% at hs = H = 64, the 60m/150m/350m presets; 1.5% at the tiny preset's hs = H = 32). No integer
split does better: a hidden unit costs 2 hs + 1 parameters and the gap is hs.

Extra parameters at the `60m` preset with defaults (8 heads, hs = 64, hidden = 64, f shared by all 10 layers, dt
per layer): 8 * (64*64 + 64 + 64*64 + 64) = 66,560 for the MLP bank + 10 dt scalars = 66,570, i.e. 0.1164% of the
57,199,616-parameter standard model (the paper states 0.11%). `uncoupled_mlp`: 8 * 2 * (64*32 + 32 + 32*64 + 64)
+ 10 = 67,082 (+0.77% vs coupled).

Options (`CoupledOptions`, `UncoupledMLPOptions`; defaults in brackets, [NS] = not stated in the paper):
    impl ["sdpa"], qk_norm [False]: as `standard` (the dynamics run after QK-norm).
    steps [1]: integration steps, 1..7 (the paper sweeps 1-7 and finds 1 enough); the loop is unrolled.
    integrator ["leapfrog"] (coupled only) [NS which is default]: "leapfrog" or "euler"; the paper finds them equal,
        we default to the one whose invariants (volume, reversibility) we can test.
    gradient_field [False] (coupled only) [NS]: f = -grad V(q) in closed form instead of a free MLP. At the same
        `hidden` the potential has about half of f's parameters, nh (hs + 2) hidden (33,802 extra at 60m);
        hidden = 2 hs roughly restores the 0.11% budget.
    hidden [None = head_size] [NS]: hidden width of f (coupled) or the budget split between g_q and g_k
        (uncoupled). head_size reproduces the paper's 0.11% at 60m.
    zero_init_last [False] [NS]: zero-init the last layer of f (or of V). Consequence: with leapfrog the first
        step at init is q' = q + dt k, k' = k (the kicks vanish, but the closing kick still passes gradient to
        the last layer); with euler likewise q' = q + dt k, k' = k; `uncoupled_mlp` starts as the identity.
    share_dynamics ["model"] [NS]: "model" ties one dynamics bank for all layers (through `share_across_layers`),
        "layer" gives each layer its own. "model" is the reading of "shared learned dynamics" that lands on 0.11%.
    dt_scope ["layer"] [NS]: one dt per layer, or one per head ("head").
    dt_init [0.1] [NS]: the effective dt at init (the digest's suggestion).
    dt_param ["softplus"] [NS]: dt = softplus(raw) (positive, raw initialised to softplus^-1(dt_init)),
        "exp" (dt = exp(raw), positive) or "raw" (dt = raw; may turn negative; the only way to get dt = 0 exactly).
    rope_order ["pre"] [NS]: run the dynamics before RoPE ("pre", keeps RoPE's relative-position property since f
        is not rotation-equivariant) or after it ("post").
    recompute ["flow"] (implementation, not a modelling choice): what backward keeps and what it recomputes.
        "none": plain autograd keeps every intermediate of the flow (hidden activations, forces, half-steps:
        about 8 C numbers per token and layer at steps=1 beyond `standard`). "flow": the flow runs under
        `torch.utils.checkpoint`; backward keeps only its inputs q and k (2 C beyond `standard`) and recomputes the
        small per-head matmuls. "qk": the q/k projections, QK-norm, flow and RoPE are one checkpointed region whose
        inputs (the attention input, and the raw k projection when v is tied to it) `standard` keeps anyway, so
        nothing is kept beyond `standard`, at the price of recomputing the q and k projections (2 x 2 C^2 FLOPs
        per token and layer). Outputs and gradients are identical in all three (tested).

Speed [implementation]: the flow runs heads-first, (nh, B*T, hs), a view of the projections' (B, T, nh, hs) layout,
so each MLP bank is two `torch.baddbmm` calls batched over heads (no loop over heads, no copy), and every update is
one fused multiply-add (`torch.addcmul`) that keeps the input's layout, so SDPA receives q and k laid out exactly as
in `standard`. `python benchmarks/bench.py --only backends` compares step time and activation memory with `standard`.

Init [NS]: MLP weights N(0, 1/fan_in) (LeCun normal, the scale of a default per-head nn.Linear, so f(q) is of the
order of q at init), biases zero; GPT-2's N(0, 0.02) would make f nearly zero at every width.
Projection options of `standard`: grouped-query attention (`n_kv_groups` < n_head) is refused, since the dynamics
pair each q head with its own k head. With `qkv_sharing` "k_eq_v", v stays the un-evolved projection (the dynamics
act on the scoring q and k only); with "q_eq_k", q and k enter the dynamics equal and leave it different, so the
score matrix is no longer symmetric.

Invariants checked by `tests/attention/test_coupled.py`: causality; SDPA path == math path in fp64 (forward and
all gradients); dt = 0 equals `standard` with the same weights exactly; the batched MLP bank equals per-head
nn.functional.linear loops; closed-form -grad V equals torch.autograd.grad; leapfrog has Jacobian determinant 1
per token and is reversible (evolving with -dt returns the input), Euler's determinant is det(I - dt^2 J_f);
leapfrog with a gradient field conserves H up to O(dt^2); parameter counts equal the hand counts above (and the
60m fraction lies in [0.09%, 0.13%]); uncoupled matches coupled within 1% at 60m; sharing ties one tensor; the
backends compile with fullgraph=True (no graph breaks, no host syncs); every `recompute` mode gives the same outputs and
gradients, and keeps what it claims alive after the forward (none > flow > qk = standard); a tiny GPT trains on
real text.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_cqk.attention.base import AttentionBackend, AttentionContext
from lightning_cqk.attention.rope import apply_rope
from lightning_cqk.attention.standard import StandardAttention, StandardOptions

if TYPE_CHECKING:
    from lightning_cqk.config import ModelConfig

MAX_STEPS = 7


@dataclass
class DynamicsOptions(StandardOptions):
    """Options shared by `coupled` and `uncoupled_mlp` (see the module docstring for defaults and [NS] choices).

    Attributes:
        steps: integration steps (1..7), unrolled.
        hidden: hidden width of the dynamics MLP (None: head_size).
        zero_init_last: zero-init the last layer of the dynamics MLP(s).
        share_dynamics: "model" (one bank tied across all layers) or "layer" (one per layer).
        dt_scope: "layer" (one learned dt per layer) or "head" (one per head).
        dt_init: effective dt at init.
        dt_param: "softplus", "exp" or "raw" parameterisation of dt.
        rope_order: run the dynamics "pre" (before) or "post" (after) RoPE.
        recompute: "none", "flow" (keep only the flow's inputs) or "qk" (keep nothing beyond standard).
    """

    steps: int = 1
    hidden: int | None = None
    zero_init_last: bool = False
    share_dynamics: Literal["model", "layer"] = "model"
    dt_scope: Literal["layer", "head"] = "layer"
    dt_init: float = 0.1
    dt_param: Literal["softplus", "exp", "raw"] = "softplus"
    rope_order: Literal["pre", "post"] = "pre"
    recompute: Literal["none", "flow", "qk"] = "flow"


@dataclass
class CoupledOptions(DynamicsOptions):
    """Options of `coupled`.

    Attributes:
        integrator: "leapfrog" (kick-drift-kick, symplectic) or "euler" (simultaneous explicit Euler).
        gradient_field: f = -grad V(q) of a learned scalar potential (closed form) instead of a free MLP.
    """

    integrator: Literal["leapfrog", "euler"] = "leapfrog"
    gradient_field: bool = False


@dataclass
class UncoupledMLPOptions(DynamicsOptions):
    """Options of `uncoupled_mlp`; `hidden` is the coupled width being matched (split between g_q and g_k)."""


def _lecun_normal_(weight: torch.Tensor, fan_in: int) -> None:
    nn.init.normal_(weight, mean=0.0, std=fan_in**-0.5)


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """(B, nh, T, hs) -> (nh, B*T, hs) for matmuls batched over heads.

    A view (no copy) for the layout `split_heads` produces, (B, T, nh, hs) in memory; other layouts are copied.
    """
    B, nh, T, hs = x.shape
    return x.transpose(1, 2).reshape(B * T, nh, hs).transpose(0, 1)  # (nh, B*T, hs)


def heads_back(y: torch.Tensor, batch: int) -> torch.Tensor:
    """(nh, B*T, hs) -> (B, nh, T, hs), a view; the inverse of `heads_first`."""
    nh, n, hs = y.shape
    return y.unflatten(1, (batch, n // batch)).transpose(0, 1)  # (B, nh, T, hs)


class HeadMLPBank(nn.Module):
    """nh independent two-layer SiLU MLPs R^hs -> R^hs, applied to (B, nh, T, hs) in one batched einsum."""

    def __init__(self, n_head: int, head_size: int, hidden: int, zero_init_last: bool = False) -> None:
        super().__init__()
        self.zero_init_last = zero_init_last
        self.w1 = nn.Parameter(torch.empty(n_head, head_size, hidden))
        self.b1 = nn.Parameter(torch.empty(n_head, hidden))
        self.w2 = nn.Parameter(torch.empty(n_head, hidden, head_size))
        self.b2 = nn.Parameter(torch.empty(n_head, head_size))
        # Per-head bias banks are 2-D but are biases: exempt from weight decay (read by optim.weight_decay_groups).
        self.b1._no_weight_decay = self.b2._no_weight_decay = True
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _lecun_normal_(self.w1, self.w1.size(1))
        nn.init.zeros_(self.b1)
        if self.zero_init_last:
            nn.init.zeros_(self.w2)
        else:
            _lecun_normal_(self.w2, self.w2.size(1))
        nn.init.zeros_(self.b2)

    def heads_first(self, x: torch.Tensor) -> torch.Tensor:
        """(nh, N, hs) -> (nh, N, hs): two batched matmuls over heads (bias fused), one SiLU; no loop over heads."""
        z = torch.baddbmm(self.b1.unsqueeze(1).to(x.dtype), x, self.w1.to(x.dtype))  # (nh, N, hidden)
        return torch.baddbmm(self.b2.unsqueeze(1).to(x.dtype), F.silu(z), self.w2.to(x.dtype))  # (nh, N, hs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, nh, T, hs) -> (B, nh, T, hs), head h through its own MLP."""
        return heads_back(self.heads_first(heads_first(x)), x.size(0))  # (B, nh, T, hs)


class HeadPotentialBank(nn.Module):
    """nh scalar potentials V_h(q) = w2_h . silu(W1_h q + b1_h); calling it returns the force -grad V in closed form.

    No output bias: a constant offset of V changes no force.
    """

    def __init__(self, n_head: int, head_size: int, hidden: int, zero_init_last: bool = False) -> None:
        super().__init__()
        self.zero_init_last = zero_init_last
        self.w1 = nn.Parameter(torch.empty(n_head, head_size, hidden))
        self.b1 = nn.Parameter(torch.empty(n_head, hidden))
        self.w2 = nn.Parameter(torch.empty(n_head, hidden))
        self.b1._no_weight_decay = True  # a per-head bias bank: exempt from weight decay
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _lecun_normal_(self.w1, self.w1.size(1))
        nn.init.zeros_(self.b1)
        if self.zero_init_last:
            nn.init.zeros_(self.w2)
        else:
            _lecun_normal_(self.w2, self.w2.size(1))

    def _pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bnts,nsh->bnth", x, self.w1) + self.b1[:, None, :]  # (B, nh, T, hidden)

    def potential(self, x: torch.Tensor) -> torch.Tensor:
        """V(x): (B, nh, T, hs) -> (B, nh, T)."""
        return (F.silu(self._pre_activation(x)) * self.w2[:, None, :]).sum(-1)  # (B, nh, T)

    def heads_first(self, x: torch.Tensor) -> torch.Tensor:
        """-grad V(x) on (nh, N, hs) -> (nh, N, hs), written out so no autograd.grad (double backward) is used."""
        z = torch.baddbmm(self.b1.unsqueeze(1).to(x.dtype), x, self.w1.to(x.dtype))  # (nh, N, hidden)
        s = torch.sigmoid(z)
        dsilu = s * (1.0 + z * (1.0 - s))  # silu'(z), (nh, N, hidden)
        # The minus sign goes on the small (nh, hidden, hs) weight, not on the (nh, N, hs) result.
        return torch.bmm(dsilu * self.w2.unsqueeze(1).to(x.dtype), self.w1.to(x.dtype).transpose(1, 2).neg())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """-grad V(x): (B, nh, T, hs) -> (B, nh, T, hs)."""
        return heads_back(self.heads_first(heads_first(x)), x.size(0))  # (B, nh, T, hs)


class UncoupledBank(nn.Module):
    """g_q and g_k: two per-head MLP banks, each acting on q or k alone."""

    def __init__(self, n_head: int, head_size: int, hidden: int, zero_init_last: bool = False) -> None:
        super().__init__()
        self.g_q = HeadMLPBank(n_head, head_size, (hidden + 1) // 2, zero_init_last)
        self.g_k = HeadMLPBank(n_head, head_size, hidden // 2, zero_init_last)

    def reset_parameters(self) -> None:
        self.g_q.reset_parameters()
        self.g_k.reset_parameters()


def _inverse_dt(dt: float, param: str) -> float:
    """The raw parameter value whose parameterised dt equals `dt`."""
    if param == "softplus":
        return dt + math.log(-math.expm1(-dt))  # softplus^-1, stable for small and large dt
    if param == "exp":
        return math.log(dt)
    return dt


class _QKDynamicsAttention(StandardAttention):
    """Standard attention whose q and k are evolved by a learned per-token map before scoring."""

    Options = DynamicsOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: DynamicsOptions) -> None:
        super().__init__(config, layer_idx, options)
        self.hidden = options.hidden or self.head_size
        self.dynamics = self.build_dynamics()
        dt_shape = (self.n_head,) if options.dt_scope == "head" else ()
        self.dt_raw = nn.Parameter(torch.empty(dt_shape))  # fp32 like every parameter; cast at use
        self._reset_dt()

    def build_dynamics(self) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reset_dt(self) -> None:
        with torch.no_grad():
            self.dt_raw.fill_(_inverse_dt(self.options.dt_init, self.options.dt_param))

    def reset_backend_parameters(self) -> None:
        self.dynamics.reset_parameters()
        self._reset_dt()

    def effective_dt(self) -> torch.Tensor:
        """The step size: () for dt_scope "layer", (nh,) for "head"."""
        if self.options.dt_param == "softplus":
            return F.softplus(self.dt_raw)
        if self.options.dt_param == "exp":
            return self.dt_raw.exp()
        return self.dt_raw

    def _broadcast_dt(self, dt: torch.Tensor | float | None, like: torch.Tensor) -> torch.Tensor:
        """dt as a tensor of `like`'s dtype: () or (nh, 1, 1), which broadcasts over heads-first (nh, N, hs)."""
        if dt is None:
            dt = self.effective_dt()
        dt = torch.as_tensor(dt, dtype=like.dtype, device=like.device)
        return dt.view(-1, 1, 1) if dt.dim() == 1 else dt

    def evolve(
        self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor | float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token map (q, k) -> (q_n, k_n) on (B, nh, T, hs) tensors; `dt` overrides the learned step.

        The work runs heads-first, (nh, B*T, hs), where each MLP bank is two batched matmuls over heads
        (`torch.baddbmm`), and the updates are fused multiply-adds (`torch.addcmul`) whose results keep the
        input's memory layout, so SDPA sees q and k laid out as in `standard`. With recompute="flow" (default) the
        flow runs under `torch.utils.checkpoint`: backward keeps only q, k and dt and recomputes the few small
        matmuls of the dynamics, instead of keeping every intermediate ("qk" checkpoints a larger region, `forward`).
        """
        batch = q.size(0)
        dt = self._broadcast_dt(dt, q)
        q_h, k_h = heads_first(q), heads_first(k)  # (nh, B*T, hs) each, views of the projections
        needs_grad = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or dt.requires_grad or self.dt_raw.requires_grad
        )
        if self.options.recompute == "flow" and needs_grad:
            q_h, k_h = checkpoint(self.flow, q_h, k_h, dt, use_reentrant=False, preserve_rng_state=False)
        else:
            q_h, k_h = self.flow(q_h, k_h, dt)
        return heads_back(q_h, batch), heads_back(k_h, batch)  # (B, nh, T, hs) each

    def flow(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The integrator on heads-first tensors q, k (nh, N, hs) with dt () or (nh, 1, 1)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if self.options.recompute != "qk" or not torch.is_grad_enabled():
            return super().forward(x, ctx)
        # recompute="qk": q and k are recomputed from x (which every projection keeps for its own backward) in one
        # checkpointed region; a tied v is the raw k projection, computed once outside and passed in (SDPA keeps it).
        k_raw = self.split_heads(self.k_proj(x)) if self.v_proj is None else None  # (B, nkv, T, hs)
        v = k_raw if k_raw is not None else self.split_heads(self.v_proj(x))  # (B, nkv, T, hs)

        def scoring_qk(x: torch.Tensor, k_raw: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            k = self.split_heads(self.k_proj(x)) if k_raw is None else k_raw  # (B, nkv, T, hs)
            q = k if self.q_proj is None else self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
            return self.transform_qk(q, k, ctx)

        q, k = checkpoint(scoring_qk, x, k_raw, use_reentrant=False, preserve_rng_state=False)  # (B, nh, T, hs)
        y = self.attend(q, k, v)  # (B, nh, T, hs)
        return self.resid_dropout(self.out_proj(self.merge_heads(y)))  # (B, T, C)

    def dynamics_stats(self) -> dict[str, torch.Tensor]:
        """Detached quantities worth logging per layer (no host sync): {"dt": () or (nh,)}."""
        return {"dt": self.effective_dt().detach()}

    def transform_qk(
        self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm (optional), then the dynamics and RoPE in the order `rope_order` asks for.

        The parent's stage (norm, then RoPE; it also handles projection sharing) is reused: for "pre" it runs
        without rotary tables, so it only normalises, and the rotation follows the dynamics.
        """
        if self.options.rope_order == "post":
            q, k = super().transform_qk(q, k, ctx)  # (B, nh, T, hs) each, normed and rotated
            return self.evolve(q, k)
        q, k = super().transform_qk(q, k, dataclasses.replace(ctx, cos=None, sin=None))  # normed only
        q, k = self.evolve(q, k)  # (B, nh, T, hs) each
        return apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)

    @classmethod
    def share_across_layers(cls, backends: list[AttentionBackend]) -> None:
        """With share_dynamics="model", every layer uses the first layer's bank (per bank shape, for hybrids)."""
        owners: dict[tuple, nn.Module] = {}
        for backend in backends:
            if backend.options.share_dynamics != "model":
                continue
            key = (type(backend.dynamics), tuple((n, tuple(p.shape)) for n, p in backend.dynamics.named_parameters()))
            if key in owners:
                backend.dynamics = owners[key]
            else:
                owners[key] = backend.dynamics

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: DynamicsOptions) -> None:
        super().check_config(config, layer_idx, options)
        where = f"attention {cls.name!r} (layer {layer_idx})"
        choices = {
            "impl": ("sdpa", "math"),
            "share_dynamics": ("model", "layer"),
            "dt_scope": ("layer", "head"),
            "dt_param": ("softplus", "exp", "raw"),
            "rope_order": ("pre", "post"),
            "recompute": ("none", "flow", "qk"),
        }
        for key, allowed in choices.items():
            if getattr(options, key) not in allowed:
                raise ValueError(f"{where}: {key}={getattr(options, key)!r} is not one of {allowed}.")
        if not isinstance(options.steps, int) or not 1 <= options.steps <= MAX_STEPS:
            raise ValueError(
                f"{where}: steps={options.steps!r}; use an integer in 1..{MAX_STEPS} (the loop is unrolled and the "
                "paper sweeps 1-7)."
            )
        if options.hidden is not None and (not isinstance(options.hidden, int) or options.hidden < 1):
            raise ValueError(f"{where}: hidden={options.hidden!r}; use a positive integer or null (= head_size).")
        if not math.isfinite(options.dt_init) or (options.dt_param != "raw" and options.dt_init <= 0):
            raise ValueError(
                f"{where}: dt_init={options.dt_init} cannot be reached with dt_param={options.dt_param!r} "
                "(softplus and exp give dt > 0); use a positive dt_init or dt_param='raw'."
            )
        # getattr: grouped K/V heads are an option of `standard` that may be absent from older checkouts.
        n_kv = getattr(options, "n_kv_groups", None)
        if n_kv is not None and n_kv != config.n_head:
            raise ValueError(
                f"{where}: n_kv_groups={n_kv} < n_head={config.n_head} (grouped-query attention) is not supported: "
                "the dynamics pair every query head with its own key head. Set n_kv_groups to null (or n_head)."
            )

    @classmethod
    def dynamics_evaluations(cls, options: DynamicsOptions) -> int:
        """How many times per forward each token goes through a hidden-width-`hidden` MLP bank."""
        raise NotImplementedError

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: DynamicsOptions, seq_len: int) -> int:
        hidden = options.hidden or config.head_size
        # Each evaluation: two matmuls hs x hidden per head, i.e. 2 * 2 * C * hidden FLOPs over all heads (for the
        # gradient field the second matmul is the closed-form backward through W1, the same size).
        dynamics = cls.dynamics_evaluations(options) * 4 * config.n_embd * hidden
        return super().forward_flops_per_token(config, options, seq_len) + dynamics


class CoupledAttention(_QKDynamicsAttention):
    """Coupled query-key dynamics (arXiv 2604.01683 v1): (q, k) evolved jointly by a learned flow before scoring."""

    name = "coupled"
    Options = CoupledOptions

    def build_dynamics(self) -> nn.Module:
        bank = HeadPotentialBank if self.options.gradient_field else HeadMLPBank
        return bank(self.n_head, self.head_size, self.hidden, self.options.zero_init_last)

    def flow(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`steps` leapfrog or Euler steps on heads-first q, k (nh, N, hs); dt () or (nh, 1, 1)."""
        f = self.dynamics.heads_first
        if self.options.integrator == "euler":
            for _ in range(self.options.steps):
                q, k = torch.addcmul(q, dt, k), torch.addcmul(k, dt, f(q))  # simultaneous: both from the old state
            return q, k
        half = 0.5 * dt
        force = f(q)  # (nh, N, hs)
        for _ in range(self.options.steps):
            k = torch.addcmul(k, half, force)  # kick
            q = torch.addcmul(q, dt, k)  # drift
            force = f(q)  # reused by the next step's opening kick
            k = torch.addcmul(k, half, force)  # kick
        return q, k

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: CoupledOptions) -> None:
        super().check_config(config, layer_idx, options)
        if options.integrator not in ("leapfrog", "euler"):
            raise ValueError(
                f"attention 'coupled' (layer {layer_idx}): integrator={options.integrator!r}; use 'leapfrog' or "
                "'euler'."
            )

    @classmethod
    def dynamics_evaluations(cls, options: CoupledOptions) -> int:
        return options.steps + 1 if options.integrator == "leapfrog" else options.steps


class UncoupledMLPAttention(_QKDynamicsAttention):
    """The paper's uncoupled control: q and k each evolved by an MLP of itself only, capacity matched to `coupled`."""

    name = "uncoupled_mlp"
    Options = UncoupledMLPOptions

    def build_dynamics(self) -> nn.Module:
        return UncoupledBank(self.n_head, self.head_size, self.hidden, self.options.zero_init_last)

    def flow(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q <- q + dt g_q(q), k <- k + dt g_k(k), `steps` times, on heads-first q, k (nh, N, hs)."""
        g_q, g_k = self.dynamics.g_q.heads_first, self.dynamics.g_k.heads_first
        for _ in range(self.options.steps):
            q, k = torch.addcmul(q, dt, g_q(q)), torch.addcmul(k, dt, g_k(k))
        return q, k

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: UncoupledMLPOptions) -> None:
        super().check_config(config, layer_idx, options)
        if (options.hidden or config.head_size) < 2:
            raise ValueError(
                f"attention 'uncoupled_mlp' (layer {layer_idx}): hidden={options.hidden} leaves g_k no hidden unit "
                "(g_q and g_k split it); use hidden >= 2."
            )

    @classmethod
    def dynamics_evaluations(cls, options: UncoupledMLPOptions) -> int:
        # g_q and g_k together hold `hidden` hidden units, i.e. one hidden-width bank per step.
        return options.steps
