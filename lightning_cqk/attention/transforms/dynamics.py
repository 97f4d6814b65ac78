"""v1 coupled query-key dynamics and its uncoupled control, as q/k transforms (`qk_transform: {kind: coupled}`).

Paper: B. Gahtan and A. M. Bronstein, "Coupled Query-Key Dynamics for Attention", arXiv 2604.01683 v1 (2026).
Only the abstract and a third-party summary of v1 could be read (`docs/papers.md` section 1), so every choice
below that the digest tags [NS] is an option, with the default we picked and why.

Per pair (q, k) of a token (shapes (B, P, T, d); P pairs, see `transform.py` for what a pair is per backend), for
`steps` steps of a learned step size dt:

    euler     (simultaneous, the summary's formula):   q' = q + dt k,   k' = k + dt f(q)
    leapfrog  (kick-drift-kick):                        k_half = k + dt/2 f(q),  q' = q + dt k_half,
                                                        k' = k_half + dt/2 f(q')

What these integrators are (arXiv 2604.01683 v1 calls both "Hamiltonian"/"symplectic" vs "non-symplectic"; the
precise statements, tested in `tests/unit/attention/transforms/test_coupled.py`): leapfrog is a composition of three
shears, so for
*any* f it is volume-preserving (Jacobian determinant 1) and reversible (stepping with -dt undoes it), but it is
**symplectic** (its one-step Jacobian M satisfies M^T J M = J, J = [[0, I], [-I, 0]]) only when f is a gradient
field, f = -grad V, i.e. has a symmetric Jacobian: then it is the Stormer-Verlet integrator of H(q, k) = |k|^2 / 2 +
V(q). With the default free MLP f, leapfrog is volume-preserving and reversible but not symplectic. Simultaneous
Euler is neither (det = det(I - dt^2 J_f)).

f is a per-pair two-layer SiLU MLP, f_h(q) = W2_h silu(W1_h q + b1_h) + b2_h, batched over pairs (parameters
(P, d, hidden), (P, hidden), (P, hidden, d), (P, d)). With `gradient_field=True`, f = -grad V(q) of a per-pair scalar
potential V_h(q) = w2_h . silu(W1_h q + b1_h), in closed form -grad V = -W1_h (w2_h * silu'(z)),
silu'(z) = s(z) (1 + z (1 - s(z))), s = sigmoid. Leapfrog steps share the force evaluation between the closing kick
of one step and the opening kick of the next: n steps cost n + 1 evaluations of f, Euler costs n.

`uncoupled_mlp` is the paper's "uncoupled MLP of matched capacity", whose form is [NS]; we use the residual form
q' = q + dt g_q(q), k' = k + dt g_k(k) for `steps` steps (per-pair two-layer SiLU MLPs g_q, g_k). Matched capacity,
exact at every head size d and hidden width H: g_q gets ceil(H/2) hidden units and an output bias, g_k floor(H/2)
hidden units and no output bias, so the banks hold P ((2 d + 1) H + d) parameters, exactly coupled's (free-MLP f)
P ((2 d + 1) H + d); dt is the same in both. (Before this parity, g_k had an output bias too: P d more parameters.
`g_k_output_bias: true` builds that form, and a checkpoint written with it brings the bias back when loaded, so old
runs resume with identical outputs.)

Extra parameters at the `60m` preset with defaults (8 heads, d = 64, hidden = 64, f shared by all 10 layers, dt per
layer): 8 * (64*64 + 64 + 64*64 + 64) = 66,560 for the MLP bank + 10 dt scalars = 66,570, i.e. 0.1164% of the
57,199,616-parameter standard model (the paper states 0.11%). `uncoupled_mlp`: the same 66,570.

Options (`CoupledDynamicsOptions`, `UncoupledDynamicsOptions`; defaults: docs/backends.md; [NS] = not stated):
    steps: integration steps, 1..7 (the paper sweeps 1-7 and finds 1 enough); the loop is unrolled.
    integrator (coupled only) [NS which is default]: "leapfrog" or "euler"; the paper finds them equal,
        we default to the one whose invariants (volume, reversibility) we can test.
    gradient_field (coupled only) [NS]: f = -grad V(q) in closed form instead of a free MLP. At the same
        `hidden` the potential has about half of f's parameters, P (d + 2) hidden; hidden = 2 d roughly restores the
        0.11% budget.
    hidden (None: d) [NS]: hidden width of f (coupled) or the budget split between g_q and g_k (uncoupled).
    zero_init_last [NS]: zero-init the last layer of f (or of V). With leapfrog the first step at init is
        then q' = q + dt k, k' = k; `uncoupled_mlp` starts as the identity.
    share_dynamics [NS]: "model" ties one bank for all layers of one backend class with equal shapes,
        "layer" gives each layer its own. "model" is the reading of "shared learned dynamics" that lands on 0.11%.
    dt_scope [NS]: one dt per layer, or one per pair ("head").
    dt_init [NS]: the effective dt at init (the digest's suggestion).
    dt_param [NS]: dt = softplus(raw) (positive), "exp" (dt = exp(raw)) or "raw" (dt = raw; may turn
        negative; the only way to get dt = 0 exactly).
    rope_order [NS]: before RoPE ("pre") or after it ("post").
    recompute (implementation): "none": backward keeps every state of the flow it reads. "flow": backward keeps
        only as much as the flow's inputs q and k and recomputes the rest (the free-MLP fast path in its own
        backward, keeping q and leapfrog's first kick; the gradient field, and any flow under torch.compile, under
        `torch.utils.checkpoint`). "qk" (standard family only):
        projections, QK-norm, flow and RoPE are one checkpointed region, so nothing is kept beyond `standard`, at the
        price of recomputing the q and k projections. Outputs and gradients are identical in all three (tested).
    g_k_output_bias (uncoupled only): the pre-parity form with an output bias on g_k (see above).

Fast path (implementation): with a free-MLP f, the flow that backward will differentiate is
`coupled_flow.coupled_mlp_flow`, an autograd.Function with a hand-written backward (its docstring says why: plain
autograd spent more time on elementwise passes than on the matmuls); each kick is computed as
k + c b2 + silu(q W1 + b1) (c W2), so f(q) is never formed. There, recompute="flow" is the Function keeping q and,
for leapfrog, its first kick (k when attention keeps k anyway: a tied v or q), the size of q and k, and recomputing
the states in its backward (no `torch.utils.checkpoint`); "none" (and "qk") the Function keeping the states its
backward reads; gradients agree with plain autograd's to round-off. Under torch.compile recompute="flow" runs the
checkpointed plain flow instead (`CoupledDynamics.flow_with_grad` says why). The gradient field and
`uncoupled_mlp` stay on plain autograd as described under recompute. Tested against a plain-autograd reference in
fp64 (`tests/unit/attention/transforms/test_coupled_flow.py`).

Init [NS]: MLP weights N(0, 1/fan_in) (LeCun normal, so f(q) is of the order of q at init), biases zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_cqk.attention.transform import QKTransform, TransformOptions
from lightning_cqk.attention.transforms.coupled_flow import coupled_mlp_flow, heads_back, heads_first, integrate

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig

MAX_STEPS = 7


@dataclass
class DynamicsOptions(TransformOptions):
    """Options shared by the v1 transforms (see the module docstring for defaults and [NS] choices)."""

    steps: int = 1
    hidden: int | None = None
    zero_init_last: bool = False
    share_dynamics: str = "model"
    dt_scope: str = "layer"
    dt_init: float = 0.1
    dt_param: str = "softplus"
    recompute: str = "flow"


@dataclass
class CoupledDynamicsOptions(DynamicsOptions):
    """Options of `qk_transform: {kind: coupled}`: integrator ("leapfrog" | "euler") and gradient_field."""

    integrator: str = "leapfrog"
    gradient_field: bool = False


@dataclass
class UncoupledDynamicsOptions(DynamicsOptions):
    """Options of `qk_transform: {kind: uncoupled_mlp}`; `hidden` is the coupled width matched."""

    g_k_output_bias: bool = False


def _autocast_keeps(x: torch.Tensor) -> bool:
    """True when autocast, if on for x's device, computes in x's dtype (it would cast nothing inside the flow)."""
    kind = x.device.type
    if not torch.amp.is_autocast_available(kind) or not torch.is_autocast_enabled(kind):
        return True
    return torch.get_autocast_dtype(kind) == x.dtype


def _lecun_normal_(weight: torch.Tensor, fan_in: int) -> None:
    nn.init.normal_(weight, mean=0.0, std=fan_in**-0.5)


class HeadMLPBank(nn.Module):
    """P independent two-layer SiLU MLPs R^d -> R^d, batched over pairs; optional output bias."""

    def __init__(
        self, n_head: int, head_size: int, hidden: int, zero_init_last: bool = False, output_bias: bool = True
    ) -> None:
        super().__init__()
        self.zero_init_last = zero_init_last
        self.w1 = nn.Parameter(torch.empty(n_head, head_size, hidden))
        self.b1 = nn.Parameter(torch.empty(n_head, hidden))
        self.w2 = nn.Parameter(torch.empty(n_head, hidden, head_size))
        # Per-pair bias banks are 2-D but are biases: exempt from weight decay (read by optim.weight_decay_groups).
        self.b1._no_weight_decay = True
        if output_bias:
            self.b2 = nn.Parameter(torch.empty(n_head, head_size))
            self.b2._no_weight_decay = True
        else:
            self.register_parameter("b2", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _lecun_normal_(self.w1, self.w1.size(1))
        nn.init.zeros_(self.b1)
        if self.zero_init_last:
            nn.init.zeros_(self.w2)
        else:
            _lecun_normal_(self.w2, self.w2.size(1))
        if self.b2 is not None:
            nn.init.zeros_(self.b2)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        # A checkpoint of the pre-parity uncoupled bank carries an output bias this bank was built without: take it
        # (old runs resume with identical outputs). Lightning restores weights before building optimizers.
        if self.b2 is None and prefix + "b2" in state_dict:
            bias = state_dict[prefix + "b2"]
            self.b2 = nn.Parameter(torch.zeros(bias.shape, dtype=self.w2.dtype, device=self.w2.device))
            self.b2._no_weight_decay = True
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def heads_first(self, x: torch.Tensor) -> torch.Tensor:
        """(P, N, d) -> (P, N, d): two batched matmuls over pairs (bias fused), one SiLU; no loop over pairs."""
        z = torch.baddbmm(self.b1.unsqueeze(1).to(x.dtype), x, self.w1.to(x.dtype))  # (P, N, hidden)
        if self.b2 is None:
            return torch.bmm(F.silu(z), self.w2.to(x.dtype))  # (P, N, d)
        return torch.baddbmm(self.b2.unsqueeze(1).to(x.dtype), F.silu(z), self.w2.to(x.dtype))  # (P, N, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, P, T, d) -> (B, P, T, d), pair h through its own MLP."""
        return heads_back(self.heads_first(heads_first(x)), x.size(0))  # (B, P, T, d)


class HeadPotentialBank(nn.Module):
    """P scalar potentials V_h(q) = w2_h . silu(W1_h q + b1_h); calling it returns the force -grad V in closed form.

    No output bias: a constant offset of V changes no force.
    """

    def __init__(self, n_head: int, head_size: int, hidden: int, zero_init_last: bool = False) -> None:
        super().__init__()
        self.zero_init_last = zero_init_last
        self.w1 = nn.Parameter(torch.empty(n_head, head_size, hidden))
        self.b1 = nn.Parameter(torch.empty(n_head, hidden))
        self.w2 = nn.Parameter(torch.empty(n_head, hidden))
        self.b1._no_weight_decay = True  # a per-pair bias bank: exempt from weight decay
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _lecun_normal_(self.w1, self.w1.size(1))
        nn.init.zeros_(self.b1)
        if self.zero_init_last:
            nn.init.zeros_(self.w2)
        else:
            _lecun_normal_(self.w2, self.w2.size(1))

    def _pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bnts,nsh->bnth", x, self.w1) + self.b1[:, None, :]  # (B, P, T, hidden)

    def potential(self, x: torch.Tensor) -> torch.Tensor:
        """V(x): (B, P, T, d) -> (B, P, T)."""
        return (F.silu(self._pre_activation(x)) * self.w2[:, None, :]).sum(-1)  # (B, P, T)

    def heads_first(self, x: torch.Tensor) -> torch.Tensor:
        """-grad V(x) on (P, N, d) -> (P, N, d), written out so no autograd.grad (double backward) is used."""
        z = torch.baddbmm(self.b1.unsqueeze(1).to(x.dtype), x, self.w1.to(x.dtype))  # (P, N, hidden)
        s = torch.sigmoid(z)
        dsilu = s * (1.0 + z * (1.0 - s))  # silu'(z), (P, N, hidden)
        # The minus sign goes on the small (P, hidden, d) weight, not on the (P, N, d) result.
        return torch.bmm(dsilu * self.w2.unsqueeze(1).to(x.dtype), self.w1.to(x.dtype).transpose(1, 2).neg())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """-grad V(x): (B, P, T, d) -> (B, P, T, d)."""
        return heads_back(self.heads_first(heads_first(x)), x.size(0))  # (B, P, T, d)


class UncoupledBank(nn.Module):
    """g_q and g_k: two per-pair MLP banks, each acting on q or k alone (g_k without output bias: exact parity)."""

    def __init__(
        self, n_head: int, head_size: int, hidden: int, zero_init_last: bool = False, g_k_output_bias: bool = False
    ) -> None:
        super().__init__()
        self.g_q = HeadMLPBank(n_head, head_size, (hidden + 1) // 2, zero_init_last)
        self.g_k = HeadMLPBank(n_head, head_size, hidden // 2, zero_init_last, output_bias=g_k_output_bias)

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


class _Dynamics(QKTransform):
    """A learned flow of (q, k) with step size dt; subclasses build the bank and the integrator (`flow`).

    Attributes:
        dynamics: the MLP bank(s) (shared across layers with share_dynamics="model").
        dt_raw: (1,) or (P,) raw step-size parameter (dt_scope "layer" or "head").
    """

    Options = DynamicsOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: DynamicsOptions, n_pairs: int, dim: int) -> None:
        super().__init__(config, layer_idx, options, n_pairs, dim)
        self.hidden = options.hidden or dim
        self.recompute = options.recompute
        self.dynamics = self.build_dynamics()
        # (1,) rather than () for one step per layer: FSDP2 shards no 0-dim parameter; `effective_dt` returns ().
        dt_shape = (n_pairs,) if options.dt_scope == "head" else (1,)
        self.dt_raw = nn.Parameter(torch.empty(dt_shape))  # fp32 like every parameter; cast at use
        self._reset_dt()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        # Checkpoints written before dt_raw became (1,) hold a 0-dim dt_raw for dt_scope "layer": same value, reshaped.
        old = state_dict.get(prefix + "dt_raw")
        if isinstance(old, torch.Tensor) and old.dim() == 0:
            state_dict[prefix + "dt_raw"] = old.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def build_dynamics(self) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reset_dt(self) -> None:
        with torch.no_grad():
            self.dt_raw.fill_(_inverse_dt(self.options.dt_init, self.options.dt_param))

    def reset_parameters(self) -> None:
        self.dynamics.reset_parameters()
        self._reset_dt()

    def share_key(self):
        if self.options.share_dynamics != "model":
            return None
        return (type(self.dynamics), tuple((n, tuple(p.shape)) for n, p in self.dynamics.named_parameters()))

    def shared_module_name(self) -> str:
        return "dynamics"

    def effective_dt(self) -> torch.Tensor:
        """The step size: () for dt_scope "layer", (P,) for "head"."""
        raw = self.dt_raw if self.options.dt_scope == "head" else self.dt_raw.squeeze(0)  # (P,) or ()
        if self.options.dt_param == "softplus":
            return F.softplus(raw)
        if self.options.dt_param == "exp":
            return raw.exp()
        return raw

    def stats(self) -> dict[str, torch.Tensor]:
        return {"dt": self.effective_dt().detach()}

    def _broadcast_dt(self, dt: torch.Tensor | float | None, like: torch.Tensor) -> torch.Tensor:
        """dt as a tensor of `like`'s dtype: () or (P, 1, 1), which broadcasts over pairs-first (P, N, d)."""
        if dt is None:
            dt = self.effective_dt()
        dt = torch.as_tensor(dt, dtype=like.dtype, device=like.device)
        return dt.view(-1, 1, 1) if dt.dim() == 1 else dt

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor | float | None = None, keys_kept: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, k) -> (q_n, k_n) on (B, P, T, d) tensors; `dt` overrides the learned step; `keys_kept` as
        `QKTransform.forward`.

        The work runs pairs-first, (P, B*T, d): each MLP bank is two batched matmuls, the updates fused
        multiply-adds. When backward will run, `flow_with_grad` chooses how (the fast path of `CoupledDynamics`, or
        `flow` under `torch.utils.checkpoint` with recompute="flow", which keeps only q, k and dt).
        """
        dt = self._broadcast_dt(dt, q)
        needs_grad = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or dt.requires_grad or self.dt_raw.requires_grad
        )
        if needs_grad:
            return self.flow_with_grad(q, k, dt, keys_kept)
        q_h, k_h = self.flow(heads_first(q), heads_first(k), dt)  # (P, B*T, d) each
        return heads_back(q_h, q.size(0)), heads_back(k_h, q.size(0))  # (B, P, T, d) each

    def flow_with_grad(
        self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor, keys_kept: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The flow of (B, P, T, d) q and k when backward will run: `flow` under `torch.utils.checkpoint` with
        recompute="flow" (which keeps q and k whatever `keys_kept`), else under plain autograd."""
        q_h, k_h = heads_first(q), heads_first(k)  # (P, B*T, d) each, views of the projections
        if self.recompute == "flow":
            q_h, k_h = checkpoint(self.flow, q_h, k_h, dt, use_reentrant=False, preserve_rng_state=False)
        else:
            q_h, k_h = self.flow(q_h, k_h, dt)
        return heads_back(q_h, q.size(0)), heads_back(k_h, q.size(0))  # (B, P, T, d) each

    def flow(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError  # pragma: no cover - abstract

    @classmethod
    def check(cls, config: ModelConfig, layer_idx: int, options: DynamicsOptions, n_pairs: int, dim: int) -> None:
        super().check(config, layer_idx, options, n_pairs, dim)
        choices = {
            "share_dynamics": ("model", "layer"),
            "dt_scope": ("layer", "head"),
            "dt_param": ("softplus", "exp", "raw"),
            "recompute": ("none", "flow", "qk"),
        }
        for key, allowed in choices.items():
            if getattr(options, key) not in allowed:
                raise ValueError(f"{key}={getattr(options, key)!r} is not one of {allowed}.")
        if isinstance(options.steps, bool) or not isinstance(options.steps, int) or not 1 <= options.steps <= MAX_STEPS:
            raise ValueError(
                f"steps={options.steps!r}; use an integer in 1..{MAX_STEPS} (the loop is unrolled and the paper sweeps "
                "1-7)."
            )
        if options.hidden is not None and (
            isinstance(options.hidden, bool) or not isinstance(options.hidden, int) or options.hidden < 1
        ):
            raise ValueError(f"hidden={options.hidden!r}; use a positive integer or null (= head size).")
        if not math.isfinite(options.dt_init) or (options.dt_param != "raw" and options.dt_init <= 0):
            raise ValueError(
                f"dt_init={options.dt_init} cannot be reached with dt_param={options.dt_param!r} (softplus and exp "
                "give dt > 0); use a positive dt_init or dt_param='raw'."
            )

    @classmethod
    def evaluations(cls, options: DynamicsOptions) -> int:
        """How many times per forward each token goes through a hidden-width-`hidden` MLP bank."""
        raise NotImplementedError

    @classmethod
    def flops_per_token(cls, options: DynamicsOptions, n_pairs: int, dim: int) -> int:
        hidden = options.hidden or dim
        # Each evaluation: two matmuls d x hidden per pair (for the gradient field the second one is the closed-form
        # backward through W1, the same size).
        return cls.evaluations(options) * 4 * n_pairs * dim * hidden


class CoupledDynamics(_Dynamics):
    """Coupled query-key dynamics (arXiv 2604.01683 v1): (q, k) evolved jointly by a learned flow."""

    kind = "coupled"
    Options = CoupledDynamicsOptions

    def build_dynamics(self) -> nn.Module:
        bank = HeadPotentialBank if self.options.gradient_field else HeadMLPBank
        return bank(self.n_pairs, self.dim, self.hidden, self.options.zero_init_last)

    def flow_with_grad(
        self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor, keys_kept: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`flow` when backward will run. A free-MLP bank takes the fast path `coupled_flow.coupled_mlp_flow` (the
        same forward, a hand-written backward; recompute="flow" keeps only as much as q and k there too); the gradient
        field (and a q whose dtype autocast would change inside the flow) goes through autograd (`_Dynamics`), and so
        does recompute="flow" under torch.compile: the compiler would merge the fast path's recompute with its forward
        and keep every state (5 C per token and layer instead of 2 C,
        `tests/unit/attention/transforms/test_coupled.py`), while it
        keeps a checkpoint's recompute and fuses the plain flow's elementwise work itself."""
        if (
            not isinstance(self.dynamics, HeadMLPBank)
            or not _autocast_keeps(q)
            or (torch.compiler.is_compiling() and self.recompute == "flow")
        ):
            return super().flow_with_grad(q, k, dt, keys_kept)
        keep = "inputs" if self.recompute == "flow" else "all"  # "qk": an outer checkpoint reruns this forward anyway
        o = self.options
        weights = self._bank_weights(q.dtype)
        return coupled_mlp_flow(q, k, dt, *weights, o.integrator, o.steps, keep, keys_kept)  # (B, P, T, d) each

    def _bank_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """w1, b1, w2, b2 of the free-MLP bank in the compute dtype (b2 None without an output bias)."""
        bank = self.dynamics
        b2 = None if bank.b2 is None else bank.b2.to(dtype)
        return bank.w1.to(dtype), bank.b1.to(dtype), bank.w2.to(dtype), b2

    def flow(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`steps` leapfrog or Euler steps on pairs-first q, k (P, N, d); dt () or (P, 1, 1). Plain ops (autograd
        differentiates them): the path without gradients, and the gradient field's path. A free-MLP bank runs the
        forward of the fast path (`coupled_flow.integrate`: each kick as (k + c b2) + s (c W2), f never formed)."""
        if isinstance(self.dynamics, HeadMLPBank):
            o = self.options
            return integrate(q, k, dt, *self._bank_weights(q.dtype), o.integrator, o.steps)
        f = self.dynamics.heads_first
        if self.options.integrator == "euler":
            for _ in range(self.options.steps):
                q, k = torch.addcmul(q, dt, k), torch.addcmul(k, dt, f(q))  # simultaneous: both from the old state
            return q, k
        half = 0.5 * dt
        force = f(q)  # (P, N, d)
        for _ in range(self.options.steps):
            k = torch.addcmul(k, half, force)  # kick
            q = torch.addcmul(q, dt, k)  # drift
            force = f(q)  # reused by the next step's opening kick
            k = torch.addcmul(k, half, force)  # kick
        return q, k

    @classmethod
    def check(cls, config, layer_idx, options: CoupledDynamicsOptions, n_pairs: int, dim: int) -> None:
        super().check(config, layer_idx, options, n_pairs, dim)
        if options.integrator not in ("leapfrog", "euler"):
            raise ValueError(f"integrator={options.integrator!r}; use 'leapfrog' or 'euler'.")

    @classmethod
    def evaluations(cls, options: CoupledDynamicsOptions) -> int:
        return options.steps + 1 if options.integrator == "leapfrog" else options.steps


class UncoupledDynamics(_Dynamics):
    """The paper's uncoupled control: q and k each evolved by an MLP of itself only, capacity matched exactly."""

    kind = "uncoupled_mlp"
    Options = UncoupledDynamicsOptions

    def build_dynamics(self) -> nn.Module:
        o = self.options
        return UncoupledBank(self.n_pairs, self.dim, self.hidden, o.zero_init_last, o.g_k_output_bias)

    def flow(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q <- q + dt g_q(q), k <- k + dt g_k(k), `steps` times, on pairs-first q, k (P, N, d)."""
        g_q, g_k = self.dynamics.g_q.heads_first, self.dynamics.g_k.heads_first
        for _ in range(self.options.steps):
            q, k = torch.addcmul(q, dt, g_q(q)), torch.addcmul(k, dt, g_k(k))
        return q, k

    @classmethod
    def check(cls, config, layer_idx, options: UncoupledDynamicsOptions, n_pairs: int, dim: int) -> None:
        super().check(config, layer_idx, options, n_pairs, dim)
        if (options.hidden or dim) < 2:
            raise ValueError(
                f"hidden={options.hidden} leaves g_k no hidden unit (g_q and g_k split it); use hidden >= 2."
            )

    @classmethod
    def evaluations(cls, options: UncoupledDynamicsOptions) -> int:
        # g_q and g_k together hold `hidden` hidden units, i.e. one hidden-width bank per step.
        return options.steps
