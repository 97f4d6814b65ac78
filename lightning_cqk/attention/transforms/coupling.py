"""v2: invertible affine query-key coupling (`qk_transform: {kind: invertible}`).

Paper: B. Gahtan and A. M. Bronstein, "Invertible Query-Key Coupling Composes with Attention Mechanisms", the later
version of arXiv 2604.01683. Public: an identity-initialised transform that "jointly transforms each token's query and
key before attention scoring", about 0.3% extra parameters, RealNVP-style alternating affine maps stacked on existing
attention mechanisms (docs/papers.md §7). Not public: the conditioner, the number of layers, the sharing; every
such choice below is an option, [NS] marks them.

Per pair (q, k) of a token (d features each; what a pair is per backend: `transform.py`), `layers` affine coupling
layers (Dinh, Sohl-Dickstein & Bengio 2017, "Density estimation using Real NVP", arXiv 1605.08803, eq. 7) alternate
which half of the pair they update, starting with k:

    layer 1, 3, ...:   [s, t] = c_l(q),   k <- k * exp(S(s)) + t          (q unchanged)
    layer 2, 4, ...:   [s, t] = c_l(k),   q <- q * exp(S(s)) + t          (k unchanged)
    S(s) = a tanh(s / a)  (soft clamp of the log-scales to (-a, a), a = `scale_clamp`; None: S(s) = s)

The conditioner c_l is a two-layer SiLU MLP R^d -> R^{2d} (R^d with `additive`, the NICE form of Dinh et al. 2015,
arXiv 1410.8516: s = 0, t = c_l(.)): c_l(x) = W2 silu(W1 x + b1) + b2. W2 and b2 start at zero, so every layer is
exactly the identity at init (s = t = 0), and the model equals its base backend until training moves them.

Invertible by construction: layer l is undone by x <- (x - t) * exp(-S(s)) with [s, t] = c_l(the other half), layers
in reverse order (`inverse`). Its Jacobian is triangular with diagonal exp(S(s)), so log |det J| of the whole map is
the sum of all clamped log-scales (`log_det`), 0 in the additive form (volume-preserving). The map acts on each token
alone: causality is untouched, and the transformed k is what an inference cache holds.

Options (`InvertibleOptions`; defaults: docs/backends.md):
    layers [NS]: coupling layers (>= 1); 2 updates k then q once each, the smallest stack in which both change.
    hidden [NS]: hidden width of every conditioner.
    share_heads [NS]: one conditioner per layer for all pairs of a layer (instead of one per pair).
    share_layers [NS]: one conditioner set for all layers of one backend class with equal shapes.
    scale_clamp [NS]: the soft clamp a above (None: no clamp). exp(S(s)) then lies in (e^-2, e^2).
    additive [NS]: NICE form (shift only).
    rope_order [NS]: before RoPE (keeps RoPE's relative-position property) or after it ("post").
    fused (implementation, not a modelling choice): the stack is one `torch.autograd.Function` with a
        hand-written backward (`InvertibleCouplingFunction`: token-major, block-diagonal conditioner GEMMs, in-place
        elementwise work, the clamp's derivative written out; it keeps only q and k and recomputes the rest in
        backward); False runs the same equations through plain autograd (the reference the fused path is tested
        against in fp64, forward and every gradient; it keeps every intermediate). Inside `torch.compile` the
        reference equations are traced whatever `fused` says (the compiler fuses the elementwise work itself).

Default size: per layer and pair, layers * (d hidden + hidden + hidden 2d + 2d) parameters. At the `150m` preset
(16 layers, 12 heads, d = 64): 16 * 12 * 2 * (64*6 + 6 + 6*128 + 128) = 493,824, 0.325% of the standard model's
151,868,928 (the paper: "roughly 0.3%"); the forward costs 2 * layers * 3 d hidden multiply-adds per pair and token,
about 1% of a layer's FLOPs at head size 64. Init [NS]: W1 ~ N(0, 1/d) (LeCun normal), b1 = 0, W2 = b2 = 0.

Implementation: the conditioners run pairs-first, (P, B*T, d) views of the projections' layout, as batched matmuls
(`torch.baddbmm`; with share_heads the one weight is broadcast over the pairs, and its gradient summed over them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lightning_cqk.attention.transform import QKTransform, TransformOptions
from lightning_cqk.attention.transforms.dynamics import heads_back, heads_first

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig


@dataclass
class InvertibleOptions(TransformOptions):
    """Options of `qk_transform: {kind: invertible}` (see the module docstring)."""

    layers: int = 2
    hidden: int = 6
    share_heads: bool = False
    share_layers: bool = False
    scale_clamp: float | None = 2.0
    additive: bool = False
    fused: bool = True


def same_layout(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`out` laid out in memory as `like` (a copy only when they differ, e.g. after RoPE's concatenation), so the
    score matmuls see the base backend's layout and the identity at init is bitwise."""
    return out if out.stride() == like.stride() else torch.empty_like(like).copy_(out)


def block_diagonal(w: torch.Tensor, n: int) -> torch.Tensor:
    """(G, a, b) per-pair matrices (G = n, or 1: one shared by all n pairs) -> the (n a, n b) block-diagonal matrix."""
    return torch.block_diag(*w.expand(n, *w.shape[1:]).unbind(0))


def diagonal_blocks(full: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """The n diagonal (a, b) blocks of a (n a, n b) matrix as (n, a, b); summed to (1, a, b) when groups == 1."""
    a, b = full.size(0) // n, full.size(1) // n
    blocks = full.view(n, a, n, b).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (n, a, b)
    return blocks.sum(0, keepdim=True) if groups == 1 and n > 1 else blocks


def coupling_step_forward(cond, target, w1, b1, w2, b2, clamp: float | None, additive: bool):
    """One affine coupling layer on token-major tensors: target <- target * exp(S(s)) + t, [s, t] = c(cond).

    Shapes: cond, target (N, P d) (a token's P pairs side by side: the projections' own layout, so no copy); w1
    (G, d, H), b1 (G, H), w2 (G, H, d_out), b2 (G, d_out) with G = P or 1 (one conditioner for all pairs). The P
    per-pair conditioners run as two dense matmuls with block-diagonal weights, (N, P d) @ (P d, P H) and
    (N, P H) @ (P H, P d): a few wasted multiply-adds on zero blocks buy one efficient GEMM instead of P skinny ones.
    Returns the new target (N, P d) and what `coupling_step_backward` needs.
    """
    groups, d = w1.size(0), w1.size(1)
    P = cond.size(1) // d
    W1 = block_diagonal(w1, P)  # (P d, P H)
    z = torch.addmm(b1.expand(P, -1).reshape(-1), cond, W1)  # (N, P H)
    h = F.silu(z)  # (N, P H)
    if additive:
        W2 = block_diagonal(w2, P)  # (P H, P d)
        out = torch.addmm(b2.expand(P, -1).reshape(-1), h, W2).add_(target)  # target + t, (N, P d)
        return out, (cond, None, z, None, W1, W2, None, None, groups, P)
    W2s, W2t = block_diagonal(w2[..., :d], P), block_diagonal(w2[..., d:], P)  # (P H, P d) each
    b2s = b2[:, :d].expand(P, -1).reshape(-1)  # (P d,)
    t = torch.addmm(b2[:, d:].expand(P, -1).reshape(-1), h, W2t)  # (N, P d)
    th = None
    if clamp is not None:
        # 1/a folded into the small weights: s / a = h (W2_s / a) + b2_s / a, one pass over (N, P d) fewer.
        th = _at_least_fp32(torch.addmm(b2s / clamp, h, W2s / clamp)).tanh_()  # tanh(s / a)
        e = torch.mul(th, clamp).exp_()  # exp(a tanh(s / a))
    else:
        e = _at_least_fp32(torch.addmm(b2s, h, W2s)).exp_()
    out = t.addcmul_(target, e)  # target * e + t, (N, P d): computed in e's precision, rounded once to target's
    return out, (cond, target, z, e, W1, W2s, W2t, th, groups, P)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """`x` in fp32 when it is narrower (bf16/fp16 under autocast): the scale exp(S(s)) and tanh are computed in fp32,
    as a compiler's fused kernel computes them, and rounded once, in the product; fp32 and fp64 stay as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def coupling_step_backward(saved, g):
    """Gradients of one coupling layer by hand, from `coupling_step_forward`'s saved tensors and g = dL/d target'.

    With e = exp(S(s)), th = tanh(s / a):
        dL/d target = g e,   dL/dt = g,   dL/ds = g e target (1 - th^2)   (1 - th^2: the soft clamp; 1 without)
        dL/dh = dL/ds W2_s^T + dL/dt W2_t^T,   dL/dz = dL/dh silu'(z),   dL/d cond = dL/dz W1^T
    and the weight gradients as the diagonal blocks of the matching dense products (summed over pairs when shared).
    Returns (dL/d cond, dL/d target, dL/d w1, dL/d b1, dL/d w2, dL/d b2).
    """
    cond, target, z, e, W1, W2s, W2t, th, groups, P = saved
    if target is None:  # additive: target' = target + t
        W2 = W2s
        g_target = g
        g_h = g @ W2.t()  # (N, P H)
    else:
        g_e = g * e  # (N, P d), in e's precision (fp32 under autocast)
        g_s = g_e * target  # dL/d S(s)
        g_target = g_e.to(g.dtype)
        if th is not None:  # through the soft clamp: dS/ds = 1 - tanh^2(s / a)
            g_s = torch.addcmul(g_s, g_s * th, th, value=-1.0)
        g_s = g_s.to(g.dtype)  # the matmuls below take the forward's dtypes
        g_h = torch.addmm(g_s @ W2s.t(), g, W2t.t())  # (N, P H)
    h = F.silu(z)  # (N, P H), recomputed (small)
    sig = torch.sigmoid(z)
    g_z = g_h.mul_(sig * (1.0 + z * (1.0 - sig)))  # silu'(z), (N, P H)
    g_cond = g_z @ W1.t()  # (N, P d)
    g_w1 = diagonal_blocks(cond.t() @ g_z, P, groups)  # (G, d, H)
    g_b1 = g_z.sum(0).view(P, -1)  # (P, H)
    h_t = h.t()
    if target is None:
        g_w2 = diagonal_blocks(h_t @ g, P, groups)  # (G, H, d)
        g_b2 = g.sum(0).view(P, -1)
    else:
        g_w2 = torch.cat((diagonal_blocks(h_t @ g_s, P, groups), diagonal_blocks(h_t @ g, P, groups)), dim=-1)
        g_b2 = torch.cat((g_s.sum(0).view(P, -1), g.sum(0).view(P, -1)), dim=-1)  # (P, 2d)
    if groups == 1 and P > 1:
        g_b1, g_b2 = g_b1.sum(0, keepdim=True), g_b2.sum(0, keepdim=True)
    return g_cond, g_target, g_w1, g_b1, g_w2, g_b2


class InvertibleCouplingFunction(torch.autograd.Function):
    """The whole coupling stack on token-major q, k (N, P d), with a hand-written backward that keeps only its inputs.

    Forward runs `layers` steps (even layers update k from q, odd layers q from k) without keeping intermediates;
    backward recomputes them from the saved q, k (two small GEMMs and a few elementwise passes per layer) and applies
    `coupling_step_backward` in reverse order. Memory beyond the base backend: q and k (2 x (N, P d)) per attention
    layer. Weights are the full banks (L, G, ...).

    Under CUDA autocast the backward runs in the forward's autocast state (`torch.amp.custom_fwd/custom_bwd`), so its
    matmuls take the dtypes of the forward's and of the compiled reference path's (bf16 parity: tests/gpu).
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, q, k, w1, b1, w2, b2, clamp: float | None, additive: bool):
        ctx.save_for_backward(q, k, w1, b1, w2, b2)
        ctx.conf = (clamp, additive)
        for layer in range(w1.size(0)):
            if layer % 2 == 0:
                k, _ = coupling_step_forward(q, k, w1[layer], b1[layer], w2[layer], b2[layer], clamp, additive)
            else:
                q, _ = coupling_step_forward(k, q, w1[layer], b1[layer], w2[layer], b2[layer], clamp, additive)
        return q, k

    @staticmethod
    @torch.autograd.function.once_differentiable
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g_q, g_k):
        q, k, w1, b1, w2, b2 = ctx.saved_tensors
        clamp, additive = ctx.conf
        saved = []
        for layer in range(w1.size(0)):  # recompute the forward, keeping what each step's backward needs
            if layer % 2 == 0:
                k, keep = coupling_step_forward(q, k, w1[layer], b1[layer], w2[layer], b2[layer], clamp, additive)
            else:
                q, keep = coupling_step_forward(k, q, w1[layer], b1[layer], w2[layer], b2[layer], clamp, additive)
            saved.append(keep)
        g_q = torch.zeros_like(q) if g_q is None else g_q.contiguous()  # (N, P d)
        g_k = torch.zeros_like(k) if g_k is None else g_k.contiguous()
        grads = [torch.zeros_like(w) for w in (w1, b1, w2, b2)]
        for layer in reversed(range(w1.size(0))):
            if layer % 2 == 0:  # k' = step(q, k)
                g_cond, g_k, *g_w = coupling_step_backward(saved[layer], g_k)
                g_q = g_q + g_cond
            else:  # q' = step(k, q)
                g_cond, g_q, *g_w = coupling_step_backward(saved[layer], g_q)
                g_k = g_k + g_cond
            for total, part in zip(grads, g_w, strict=True):
                total[layer] = part
            saved[layer] = None
        return g_q, g_k, *grads, None, None


class ConditionerBank(nn.Module):
    """`layers` two-layer SiLU MLPs per group of pairs (G = 1 when shared by all pairs, else P), last layer zero.

    Parameters (L = layers): w1 (L, G, d, hidden), b1 (L, G, hidden), w2 (L, G, hidden, d_out), b2 (L, G, d_out),
    d_out = 2 d (log-scale and shift) or d (shift only).
    """

    def __init__(self, layers: int, groups: int, dim: int, hidden: int, additive: bool) -> None:
        super().__init__()
        d_out = dim if additive else 2 * dim
        self.w1 = nn.Parameter(torch.empty(layers, groups, dim, hidden))
        self.b1 = nn.Parameter(torch.empty(layers, groups, hidden))
        self.w2 = nn.Parameter(torch.empty(layers, groups, hidden, d_out))
        self.b2 = nn.Parameter(torch.empty(layers, groups, d_out))
        self.b1._no_weight_decay = self.b2._no_weight_decay = True  # bias banks (read by optim.weight_decay_groups)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.w1, mean=0.0, std=self.w1.size(2) ** -0.5)
        nn.init.zeros_(self.b1)
        nn.init.zeros_(self.w2)
        nn.init.zeros_(self.b2)

    def forward(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Conditioner `layer` on pairs-first x (P, N, d) -> (P, N, d_out)."""
        P, dtype = x.size(0), x.dtype
        w1, b1 = self.w1[layer].to(dtype), self.b1[layer].to(dtype)  # (G, d, hidden), (G, hidden)
        w2, b2 = self.w2[layer].to(dtype), self.b2[layer].to(dtype)  # (G, hidden, d_out), (G, d_out)
        if w1.size(0) != P:  # shared by all pairs: broadcast the one weight
            w1, b1, w2, b2 = w1.expand(P, -1, -1), b1.expand(P, -1), w2.expand(P, -1, -1), b2.expand(P, -1)
        z = torch.baddbmm(b1.unsqueeze(1), x, w1)  # (P, N, hidden)
        return torch.baddbmm(b2.unsqueeze(1), F.silu(z), w2)  # (P, N, d_out)


class InvertibleCoupling(QKTransform):
    """Alternating affine coupling of (q, k), identity at init (see the module docstring).

    Attributes:
        conditioners: the `ConditionerBank` (shared across layers with share_layers).
    """

    kind = "invertible"
    Options = InvertibleOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: InvertibleOptions, n_pairs: int, dim: int) -> None:
        super().__init__(config, layer_idx, options, n_pairs, dim)
        groups = 1 if options.share_heads else n_pairs
        self.conditioners = ConditionerBank(options.layers, groups, dim, options.hidden, options.additive)

    def reset_parameters(self) -> None:
        self.conditioners.reset_parameters()

    def share_key(self):
        if not self.options.share_layers:
            return None
        return ("invertible", tuple(self.conditioners.w1.shape), tuple(self.conditioners.w2.shape))

    def shared_module_name(self) -> str:
        return "conditioners"

    def _scale_shift(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(S(s), t) of conditioner `layer` on pairs-first x (P, N, d); S(s) is None in the additive form."""
        out = self.conditioners(layer, x)  # (P, N, d_out)
        if self.options.additive:
            return None, out
        s, t = out.chunk(2, dim=-1)  # (P, N, d) each
        clamp = self.options.scale_clamp
        if clamp is not None:
            s = clamp * torch.tanh(s / clamp)
        return s, t

    def forward_with_log_det(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q', k', log |det J|) with q, k (B, P, T, d) and log |det J| (B, P, T), the sum of the clamped log-scales."""
        batch = q.size(0)
        q_h, k_h = heads_first(q), heads_first(k)  # (P, B*T, d) each
        log_det = q_h.new_zeros(q_h.shape[:-1])  # (P, B*T)
        for layer in range(self.options.layers):
            source, target = (q_h, k_h) if layer % 2 == 0 else (k_h, q_h)
            s, t = self._scale_shift(layer, source)
            if s is None:
                target = target + t  # (P, N, d)
            else:
                target = (target * s.exp()).add_(t)  # target * exp(s) + t, in target's memory layout
                log_det = log_det + s.sum(-1)
            if layer % 2 == 0:
                k_h = target
            else:
                q_h = target
        return heads_back(q_h, batch), heads_back(k_h, batch), log_det.view(-1, batch, q.size(2)).transpose(0, 1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, keys_kept: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, k) -> (q', k') on (B, P, T, d) tensors (`keys_kept` is not needed: the fused path keeps q and k)."""
        if self.options.fused and not torch.compiler.is_compiling():
            # Under torch.compile the reference equations are traced instead: the compiler fuses them itself.
            return self.forward_fused(q, k)
        batch = q.size(0)
        q_h, k_h = heads_first(q), heads_first(k)  # (P, B*T, d) each
        for layer in range(self.options.layers):
            if layer % 2 == 0:
                s, t = self._scale_shift(layer, q_h)
                # k * exp(s) + t; the product is laid out as k (the projections' layout), so SDPA sees q and k as
                # in the base backend and the identity at init is bitwise.
                k_h = k_h + t if s is None else (k_h * s.exp()).add_(t)  # (P, N, d)
            else:
                s, t = self._scale_shift(layer, k_h)
                q_h = q_h + t if s is None else (q_h * s.exp()).add_(t)  # (P, N, d)
        return same_layout(heads_back(q_h, batch), q), same_layout(heads_back(k_h, batch), k)  # (B, P, T, d) each

    def forward_fused(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` through `InvertibleCouplingFunction` (hand-written backward, recomputation), token-major."""
        B, P, T, d = q.shape
        dtype, bank, o = q.dtype, self.conditioners, self.options
        q_t = q.transpose(1, 2).reshape(B * T, P * d)  # (N, P d): a view for the projections' layout
        k_t = k.transpose(1, 2).reshape(B * T, P * d)  # (N, P d)
        weights = tuple(w.to(dtype) for w in (bank.w1, bank.b1, bank.w2, bank.b2))
        q_t, k_t = InvertibleCouplingFunction.apply(q_t, k_t, *weights, o.scale_clamp, o.additive)
        q_out = q_t.view(B, T, P, d).transpose(1, 2)  # (B, P, T, d)
        k_out = k_t.view(B, T, P, d).transpose(1, 2)  # (B, P, T, d)
        return same_layout(q_out, q), same_layout(k_out, k)

    def inverse(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact inverse map: (q', k') -> (q, k) on (B, P, T, d) tensors (layers undone in reverse order)."""
        batch = q.size(0)
        q_h, k_h = heads_first(q), heads_first(k)
        for layer in reversed(range(self.options.layers)):
            if layer % 2 == 0:
                s, t = self._scale_shift(layer, q_h)
                k_h = k_h - t if s is None else (k_h - t) * (-s).exp()
            else:
                s, t = self._scale_shift(layer, k_h)
                q_h = q_h - t if s is None else (q_h - t) * (-s).exp()
        return heads_back(q_h, batch), heads_back(k_h, batch)

    @classmethod
    def check(cls, config, layer_idx, options: InvertibleOptions, n_pairs: int, dim: int) -> None:
        super().check(config, layer_idx, options, n_pairs, dim)
        for key in ("layers", "hidden"):
            value = getattr(options, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r}; use a positive integer.")
        clamp = options.scale_clamp
        if clamp is not None and (isinstance(clamp, bool) or not isinstance(clamp, (int, float)) or not clamp > 0):
            raise ValueError(f"scale_clamp={clamp!r}; use a positive number (the largest |log-scale|) or null.")
        for key in ("share_heads", "share_layers", "additive", "fused"):
            if not isinstance(getattr(options, key), bool):
                raise ValueError(f"{key}={getattr(options, key)!r}; use true or false.")

    @classmethod
    def flops_per_token(cls, options: InvertibleOptions, n_pairs: int, dim: int) -> int:
        d_out = dim if options.additive else 2 * dim
        return options.layers * n_pairs * 2 * (dim * options.hidden + options.hidden * d_out)
