"""Deconstructed attention, part 1: what mixes tokens and how (`mlp`, `approximate`, `non_approximate`).

Paper: H. Xue, N. S. Moosavi and N. Aletras, "Deconstructing Attention: Investigating Design Principles for
Effective Language Modeling", arXiv 2510.11602 (2025), §3 and Appendix I (digest: `docs/papers.md` §4, §6 items
12-13). The paper relaxes one principle of attention at a time at matched parameter counts, in every layer
("uniform") or interleaved with standard attention ("hybrid", see `lightning_cqk.attention.hybrid`). This file holds
the variants that change token mixing or the form of the scores; `deconstructed_qk.py` holds those that change
where q and k come from. Per head, with x the layer input (B, T, C) and s the scaled dot product:

    mlp              (no token mixing)  y = W_dn (SiLU(x W_gt) * (x W_up))              gated MLP, hidden m
    approximate      (form relaxed)     q, k, v = x W_{Q,K,V};  e^s ~ 1 + s + s^2/2      s_ij = q_i . k_j / sqrt(hs)
        separate (Appendix I as extracted):  o_i = o0_i + o1_i + o2_i,  op_i = sum_j s_ij^p v_j / sum_j s_ij^p
        joint (Based, arXiv 2402.18668):     o_i = sum_j (1 + s_ij + s_ij^2/2) v_j / sum_j (1 + s_ij + s_ij^2/2)
    non_approximate  (form broken)      q = SiLU(x W_Q), k, v = x W_{K,V};  s_j = q_j . k_j / sqrt(hs), one score
                                        per key position;  o_i = sum_{j<=i} e^{s_j} v_j / sum_{j<=i} e^{s_j}
    all              y = concat_heads(o) W_O,  every sum over j <= i (causal)

The `mlp` backend replaces the attention sub-layer with a gated MLP; it is unrelated to `ModelConfig.mlp` (the
feed-forward sub-layer of every block, which stays as configured).

Fast and reference paths (`impl`; neither variant calls SDPA, the option keeps the backend contract's names):
    approximate, "sdpa": causal linear attention on the Taylor feature map phi(x) = [1, x / hs^(1/4),
        vec(x x^T) / (sqrt(2) sqrt(hs))] (phi(q) . phi(k) = 1 + s + s^2/2, feature dimension 1 + hs + hs^2), chunked:
        exact quadratic blocks of `chunk_size` on the diagonal plus the prefix sums of per-chunk states
        sum_j phi_p(k_j) [v_j, 1]^T of all earlier chunks, kept per order p so both normalisations come out. Cost
        per token and head O(c hs + hs^3) instead of O(T hs), so with the default `chunk_size` (auto) the fast
        path is a single chunk, i.e. the quadratic form, until T exceeds about hs^2 and the linear form wins.
        Memory: phi_2(q), phi_2(k) are (B, nh, T, hs^2) and the states (B, nh, T/c, hs^2, hs + 1); at hs = 64
        that is 4096 features per token and head (the reason Based projects q and k to 16 dimensions first, which
        the paper does not state [NS] and we do not do).
    approximate, "math": the O(T^2) masked form of the same sums (the test oracle).
    non_approximate, "sdpa": a chunked log-space scan, linear in T: within chunks of `chunk_size` an exact masked
        softmax; across chunks the same pooling applied recursively to the chunk summaries (log-mass, normalised
        mean), merged with logaddexp. Every exponent is <= 0, so scores of any size are safe. A plain running-max
        cumsum cannot do this: o_i needs sum_j e^{s_j - m_i} v_j with a reference m_i that depends on i, and a
        single reference for all i either overflows (m below the later scores) or underflows the early prefixes.
    non_approximate, "math": softmax over the score row [s_1..s_i] broadcast to every query row i, masked, O(T^2).

Options (defaults: docs/backends.md; [NS] = not stated in the paper, our choice and why):
    mlp (`DeconMLPOptions`):
        impl: accepted for the common contract; there is nothing to fuse (both values run the same code).
        hidden (None: round(4 C / 3)) [NS]: the paper matches attention's parameters without giving the width;
            3 C m = 4 C^2 gives m = 4C/3 (within 0.5% of 4 C^2 for C >= 64; exact count in `hidden_width`).
    approximate (`ApproximateOptions`):
        impl: chunked linear-time form, or "math" (quadratic oracle).
        qk_norm: per-head RMSNorm with a learned gain on q and k before RoPE (as `standard`).
        normalization [NS]: "joint" is Based's single normaliser over the whole Taylor kernel;
            "separate" is Appendix I as extracted (each Taylor order normalised on its own). We default to "joint",
            against the digest's reading, because (1) the paper says it follows Based, whose normaliser is joint;
            (2) "separate" divides o1 by sum_j s_ij, which has no sign and crosses zero, so o1 is unbounded; (3) in
            the 40-step smoke test below "separate" spikes (loss 5.5 -> 4.9 -> 6.7 -> ..., seeds 0 and 1, also with
            eps 1e-2) while "joint" falls steadily to 3.3, and the paper's uniform Approx model trains well (Wiki
            PPL 47.9). "separate" keeps o1's denominator at least `eps` away from 0 (sign preserved) and adds `eps`
            to o2's (>= 0); "joint" needs no guard (1 + s + s^2/2 >= 1/2). The digest flags the extraction as
            unverified against the official code, which could not be read.
        chunk_size (None: auto) [NS]: block length of the fast path (any value gives the same result up to
            rounding). The chunked form costs about 4 (hs + hs^2)(hs + 1) FLOPs per token and head for the states
            whatever the chunk, so it only beats the quadratic form (one chunk of T) once T exceeds roughly hs^2
            (T ~ 1100 at hs = 32, ~ 4200 at hs = 64), and below that it also needs more memory. None picks, per
            sequence length, whichever of one chunk (T) and chunks of 64 has fewer FLOPs (`taylor_chunk_size`); an
            integer forces that chunk length (chunk_size >= T is the quadratic form).
        eps [NS]: the denominator guard of "separate" (unused by "joint").
        [NS] Positions: q and k are rotated by RoPE (when the model uses it) before the feature map, as the base
            model's attention does; phi(R_i q) . phi(R_j k) is then a function of (R_i q) . (R_j k), so the linear
            form stays exact. No attention dropout (Based has none); `dropout` acts on the output.
    non_approximate (`NonApproximateOptions`):
        impl: chunked scan, or "math" (quadratic oracle).
        qk_norm [NS placement]: RMSNorm on the q projection before the SiLU and on k, per head (the paper
            credits Qwen3's QK-RMSNorm for uniform Non-apx converging at 1.7B, without saying where the SiLU sits).
        chunk_size [NS]: block length of the scan (at least 2).
        [NS] Positions: RoPE is not applied, since R_j q_j . R_j k_j = q_j . k_j (it cancels at equal positions).

Decoding (`new_cache`, the decode contract of `attention.base`). `kv_cache_values_per_token` counts what grows with
the tokens held; a recurrent state has a fixed size per sequence, reported by `DecodeCache.fixed_nbytes()` and by
`recurrent_state_values(config, options)` (values per layer and sequence), kept in at least fp32 (`state_dtype`:
a running sum in bf16 stops registering new tokens after a few hundred); one decode path serves both `impl`s:
    mlp: nothing (no token mixing): `new_cache` returns None; 0 per token.
    approximate: 0 per token; the recurrent state of the linear form, per head the sums over the tokens held of
        phi_p(k_j) [v_j, 1]^T for p = 0, 1, 2 (kept per order, so both normalisations come out): nh (1 + hs + hs^2)
        (hs + 1) values ("s0" (B, nh, hs + 1), "s1" (B, nh, hs, hs + 1), "s2" (B, nh, hs^2, hs + 1)). New tokens are
        processed in blocks of the fast path's chunk: exact quadratic within the block plus phi_p(q) . state, then
        the block's keys are added to the state (pads are not: their [v, 1] rows are zeroed).
    non_approximate: 0 per token; per head the running pooled state of the keys held, nh (hs + 2) values: the
        largest score m ("m" (B, nh)), the mass sum_j e^{s_j - m} ("den" (B, nh), 0 for an empty row) and the
        normalised output sum_j e^{s_j - m} v_j / den ("o" (B, nh, hs)). New tokens are pooled in blocks of
        `chunk_size` with the state entering as one more key of log-mass m + log den and value o.

Invariants checked by `tests/unit/attention/backends/test_deconstructed_qk_and_mixing.py`: causality (fp64, earlier
positions exactly
unchanged); forward and backward finite; fast path == reference path in fp64, forward and gradients of the input
and every parameter, with several chunks (and several recursion levels for the scan); the chunked functions equal
independent loops over positions; the scan is finite for scores of size 1e4; joint normalisation equals a Taylor
kernel attention written out; the auto chunk is quadratic below the crossover; parameter counts (mlp within 1% of
4 C^2; the others 4 C^2 like standard); analytic FLOPs equal a FLOP counter on the fast path; the fast paths compile
with fullgraph=True (no graph breaks, no host syncs); a tiny GPT of each variant trains on real text. Decoding
(`tests/inference`): fp64 parity with the full forward to 1e-10 (token by token, chunked, left-padded prefill then
a multi-token block), 0 cache bytes per token and a state whose size does not depend on max_len or the tokens held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.cache import LayerCache
from lightning_cqk.attention.kernels.functional import causal_mask
from lightning_cqk.attention.kernels.matched_norm import MatchedRMSNorm
from lightning_cqk.attention.rope import apply_rope

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig

IMPLS = ("sdpa", "math")


def check_impl(name: str, impl: str) -> None:
    """ValueError unless `impl` is one of the two paths every backend has."""
    if impl not in IMPLS:
        raise ValueError(f"{name}: impl={impl!r} is not one of 'sdpa' (fast path) or 'math' (reference path).")


# ----------------------------------------------------------------------------------------------------------------------
# Shared projections
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class DeconstructedOptions(AttentionOptions):
    """Options shared by the deconstructed variants that form q and k.

    Attributes:
        qk_norm: per-head RMSNorm with a learned gain on q and k (the QK-norm baseline of arXiv 2511.21377).
    """

    qk_norm: bool = False


class ProjectedAttention(AttentionBackend):
    """Base of the variants with q, k, v and output projections, named as in `standard` so weights carry over.

    Subclasses implement `forward`; this class holds the four C x C projections, the optional per-head QK norms and
    the head split/merge helpers.
    """

    Options = DeconstructedOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: DeconstructedOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, self.n_head, self.head_size = config.n_embd, config.n_head, config.head_size
        self.q_proj = nn.Linear(C, C, bias=config.bias)
        self.k_proj = nn.Linear(C, C, bias=config.bias)
        self.v_proj = nn.Linear(C, C, bias=config.bias)
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        if options.qk_norm:
            self.q_norm = MatchedRMSNorm(self.head_size, eps=config.norm_eps)
            self.k_norm = MatchedRMSNorm(self.head_size, eps=config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, nh, T, hs)."""
        B, T, _ = t.shape
        return t.view(B, T, self.n_head, self.head_size).transpose(1, 2)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """Per-head outputs (B, nh, T, hs) -> merged, projected and dropped out (B, T, C)."""
        B, _, T, _ = y.shape
        return self.resid_dropout(self.out_proj(y.transpose(1, 2).reshape(B, T, -1)))  # (B, T, C)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Optional per-head RMSNorm of q and k (B, nh, T, hs)."""
        if self.q_norm is None:
            return q, k
        return self.q_norm(q), self.k_norm(k)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: DeconstructedOptions) -> None:
        check_impl(cls.name, options.impl)


# ----------------------------------------------------------------------------------------------------------------------
# mlp: no token mixing
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class DeconMLPOptions(AttentionOptions):
    """Options of `mlp`.

    Attributes:
        hidden: hidden width m of the gated MLP; None gives round(4 C / 3), which matches attention's 4 C^2.
    """

    hidden: int | None = None


def hidden_width(config: ModelConfig, options: DeconMLPOptions) -> int:
    """Hidden width m of the `mlp` backend: `options.hidden`, or round(4 C / 3) so that 3 C m ~ 4 C^2."""
    return options.hidden if options.hidden is not None else round(4 * config.n_embd / 3)


class DeconMLPAttention(AttentionBackend):
    """`mlp`: the attention sub-layer replaced by a gated SiLU MLP, so no information moves between tokens.

    y = out_proj(silu(gate_proj(x)) * up_proj(x)); three matrices C x m with m = round(4C/3) match attention's
    4 C^2 parameters. Not to be confused with `ModelConfig.mlp`, the block's feed-forward layer.
    """

    name = "mlp"
    Options = DeconMLPOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: DeconMLPOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, m = config.n_embd, hidden_width(config, options)
        self.gate_proj = nn.Linear(C, m, bias=config.bias)
        self.up_proj = nn.Linear(C, m, bias=config.bias)
        self.out_proj = nn.Linear(m, C, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, T, m)
        return self.resid_dropout(self.out_proj(h))  # (B, T, C)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> None:
        """No cache: each position's output depends on that position alone, so decode mode is the plain forward."""
        return None

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: DeconMLPOptions) -> None:
        check_impl(cls.name, options.impl)
        if options.hidden is not None and (isinstance(options.hidden, bool) or int(options.hidden) != options.hidden):
            raise ValueError(f"mlp: hidden must be an integer width or null, got {options.hidden!r}.")
        if hidden_width(config, options) < 1:
            raise ValueError(f"mlp: hidden must be >= 1, got {options.hidden}; null picks round(4 n_embd / 3).")

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: DeconMLPOptions, seq_len: int) -> int:
        return 3 * 2 * config.n_embd * hidden_width(config, options)  # gate, up, down

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: DeconMLPOptions) -> int:
        return 0  # nothing crosses positions, nothing to cache


# ----------------------------------------------------------------------------------------------------------------------
# approximate: second-order Taylor softmax
# ----------------------------------------------------------------------------------------------------------------------


def _combine_taylor(num: torch.Tensor, normalization: str, eps: float) -> torch.Tensor:
    """Per-order sums (..., 3, T, hs + 1) (last channel: the denominator) -> outputs (..., T, hs).

    Order p holds sum_j K_p(i, j) [v_j, 1] with K_0 = 1, K_1 = s, K_2 = s^2 / 2.
    """
    values, den = num[..., :-1], num[..., -1:]  # (..., 3, T, hs), (..., 3, T, 1)
    if normalization == "joint":
        return values.sum(-3) / den.sum(-3)  # (..., T, hs); denominator >= i / 2 > 0
    d0, d1, d2 = den.unbind(-3)  # (..., T, 1) each
    # o1's denominator sum_j s_ij has no sign: keep it eps away from zero, on its own side.
    d1 = torch.where(d1 >= 0, d1 + eps, d1 - eps)
    return values[..., 0, :, :] / d0 + values[..., 1, :, :] / d1 + values[..., 2, :, :] / (d2 + eps)  # (..., T, hs)


def _taylor_kernels(s: torch.Tensor, mask: torch.Tensor, normalization: str) -> torch.Tensor:
    """Masked Taylor kernels of scores s (..., Tq, Tk): (..., 3, Tq, Tk) for 1, s, s^2/2; joint sums them first."""
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    ones = torch.where(mask, torch.ones_like(s), zero)  # (..., Tq, Tk)
    first = torch.where(mask, s, zero)  # (..., Tq, Tk)
    second = first * first / 2  # (..., Tq, Tk)
    if normalization == "joint":
        # Only the sum is needed: one kernel, one matmul with [v, 1] instead of three.
        return (ones + first + second).unsqueeze(-3)  # (..., 1, Tq, Tk)
    return torch.stack((ones, first, second), dim=-3)  # (..., 3, Tq, Tk)


def taylor_attention_quadratic(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normalization: str = "joint", eps: float = 1e-6
) -> torch.Tensor:
    """Reference: O(T^2) masked second-order Taylor attention. q, k, v (B, nh, T, hs) -> (B, nh, T, hs)."""
    T, hs = q.size(-2), q.size(-1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)  # (B, nh, T, T)
    mask = causal_mask(T, T, q.device)  # (T, T)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    first = torch.where(mask, s, zero)  # (B, nh, T, T)
    kernels = torch.stack((torch.where(mask, torch.ones_like(s), zero), first, first * first / 2), dim=-3)
    v1 = F.pad(v, (0, 1), value=1.0)  # (B, nh, T, hs + 1): the ones column carries the denominators
    num = kernels @ v1.unsqueeze(-3)  # (B, nh, 3, T, hs + 1)
    return _combine_taylor(num, normalization, eps)


def taylor_attention_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    normalization: str = "joint",
    eps: float = 1e-6,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Fast path: causal linear-time second-order Taylor attention. q, k, v (B, nh, T, hs) -> (B, nh, T, hs).

    Diagonal blocks of `chunk_size` are computed exactly as in the quadratic form; the earlier chunks enter through
    prefix sums of the states sum_j phi_p(k_j) [v_j, 1]^T per Taylor order p (phi_0 = 1, phi_1(x) = x / hs^(1/4),
    phi_2(x) = vec(x x^T) / (sqrt(2) sqrt(hs)), so phi_p(q) . phi_p(k) = s^p / p!).
    """
    B, nh, T, hs = q.shape
    c = min(chunk_size, T)
    N = -(-T // c)  # number of chunks
    pad = N * c - T
    # Zero padding at the end only: causal, so it changes no real position.
    q, k, v = (F.pad(t, (0, 0, 0, pad)).view(B, nh, N, c, hs) for t in (q, k, v))  # (B, nh, N, c, hs) each
    v1 = F.pad(v, (0, 1), value=1.0)  # (B, nh, N, c, hs + 1): the ones column carries the denominators
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)  # (B, nh, N, c, c)
    kernels = _taylor_kernels(s, causal_mask(c, c, q.device), normalization)  # (B, nh, N, 1|3, c, c)
    intra = kernels @ v1.unsqueeze(-3)  # (B, nh, N, 1|3, c, hs + 1)
    if N == 1:
        inter = None
    else:
        scale1 = hs**-0.25
        scale2 = 1.0 / math.sqrt(2.0 * hs)
        f1q, f1k = q * scale1, k * scale1  # (B, nh, N, c, hs)
        f2q = (q.unsqueeze(-1) * q.unsqueeze(-2)).flatten(-2) * scale2  # (B, nh, N, c, hs^2)
        f2k = (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2) * scale2  # (B, nh, N, c, hs^2)
        states0 = v1.sum(-2)  # (B, nh, N, hs + 1)
        states1 = f1k.transpose(-1, -2) @ v1  # (B, nh, N, hs, hs + 1)
        states2 = f2k.transpose(-1, -2) @ v1  # (B, nh, N, hs^2, hs + 1)

        def earlier(states: torch.Tensor, dims: int) -> torch.Tensor:
            # Exclusive prefix over chunks: chunk n sees chunks 0..n-1 (a shifted cumsum, no subtraction).
            total = states.cumsum(2)  # (B, nh, N, ...)
            return F.pad(total.narrow(2, 0, N - 1), (0, 0) * dims + (1, 0))  # (B, nh, N, ...)

        inter0 = earlier(states0, 1).unsqueeze(-2).expand(B, nh, N, c, hs + 1)  # (B, nh, N, c, hs + 1)
        inter1 = f1q @ earlier(states1, 2)  # (B, nh, N, c, hs + 1)
        inter2 = f2q @ earlier(states2, 2)  # (B, nh, N, c, hs + 1)
        inter = torch.stack((inter0, inter1, inter2), dim=-3)  # (B, nh, N, 3, c, hs + 1)
    if normalization == "joint":
        num = intra.squeeze(-3) if inter is None else intra.squeeze(-3) + inter.sum(-3)  # (B, nh, N, c, hs + 1)
        out = num[..., :-1] / num[..., -1:]  # (B, nh, N, c, hs)
    else:
        num = intra if inter is None else intra + inter  # (B, nh, N, 3, c, hs + 1)
        out = _combine_taylor(num, normalization, eps)  # (B, nh, N, c, hs)
    return out.reshape(B, nh, N * c, hs)[:, :, :T]  # (B, nh, T, hs)


def taylor_chunked_flops(T: int, hs: int, chunk_size: int, normalization: str) -> int:
    """Matmul FLOPs of `taylor_attention_chunked` for one head and one sequence of length T."""
    c = min(chunk_size, T)
    N = -(-T // c)
    orders = 1 if normalization == "joint" else 3
    per_chunk = 2 * c * c * hs + orders * 2 * c * c * (hs + 1)  # scores, kernels @ [v, 1]
    if N > 1:
        # states and queries of orders 1 and 2 (order 0 is a plain sum)
        per_chunk += 2 * 2 * c * (hs + hs * hs) * (hs + 1)
    return N * per_chunk


def taylor_chunk_size(T: int, hs: int, chunk_size: int | None, normalization: str) -> int:
    """The chunk length the fast path uses: `chunk_size`, or (None) the cheaper of T (quadratic) and 64."""
    if chunk_size is not None:
        return chunk_size
    return min((T, 64), key=lambda c: taylor_chunked_flops(T, hs, c, normalization))


def taylor_decode_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    valid: torch.Tensor,
    state: dict[str, torch.Tensor],
    normalization: str = "joint",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Decode: c new tokens against the recurrent state of the tokens before them; the state is updated in place.

    Args:
        q, k, v: (B, nh, c, hs), RoPE already applied to q and k.
        valid: (B, 1, c, 1) bool, False for left padding (pad keys are not added; pad queries' outputs are 0).
        state: "s0" (B, nh, hs + 1), "s1" (B, nh, hs, hs + 1), "s2" (B, nh, hs^2, hs + 1): sum_j phi_p(k_j)
            [v_j, 1]^T over the tokens held (`taylor_attention_chunked`'s per-chunk states, summed).

    Returns:
        (B, nh, c, hs) in v's dtype: exactly one chunk of `taylor_attention_chunked` whose earlier chunks are the state
        (computed in the state's dtype, see `state_dtype`).
    """
    B, nh, c, hs = q.shape
    out_dtype = v.dtype
    q, k, v = (t.to(state["s0"].dtype) for t in (q, k, v))
    v1 = F.pad(v, (0, 1), value=1.0) * valid  # (B, nh, c, hs + 1): pads carry neither value nor mass
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)  # (B, nh, c, c)
    kernels = _taylor_kernels(s, causal_mask(c, c, q.device), normalization)  # (B, nh, 1|3, c, c)
    intra = kernels @ v1.unsqueeze(-3)  # (B, nh, 1|3, c, hs + 1)
    scale1, scale2 = hs**-0.25, 1.0 / math.sqrt(2.0 * hs)
    f1q, f1k = q * scale1, k * scale1  # (B, nh, c, hs)
    f2q = (q.unsqueeze(-1) * q.unsqueeze(-2)).flatten(-2) * scale2  # (B, nh, c, hs^2)
    f2k = (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2) * scale2  # (B, nh, c, hs^2)
    inter0 = state["s0"].unsqueeze(-2).expand(B, nh, c, hs + 1)  # (B, nh, c, hs + 1)
    inter = torch.stack((inter0, f1q @ state["s1"], f2q @ state["s2"]), dim=-3)  # (B, nh, 3, c, hs + 1)
    if normalization == "joint":
        num = intra.squeeze(-3) + inter.sum(-3)  # (B, nh, c, hs + 1)
        out = num[..., :-1] / num[..., -1:]  # (B, nh, c, hs)
    else:
        out = _combine_taylor(intra + inter, normalization, eps)  # (B, nh, c, hs)
    state["s0"].add_(v1.sum(-2))  # (B, nh, hs + 1)
    state["s1"].add_(f1k.transpose(-1, -2) @ v1)  # (B, nh, hs, hs + 1)
    state["s2"].add_(f2k.transpose(-1, -2) @ v1)  # (B, nh, hs^2, hs + 1)
    out = torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))  # pad rows: 0/0 -> 0
    return out.to(out_dtype)


def state_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a recurrent decode state is kept in: the cache's `dtype`, at least fp32. A state is a running sum
    over every token held, which in bf16 (8 significant bits) stops registering a new token's contribution once it
    holds a few hundred; its size does not grow with the tokens, so the wider type is cheap."""
    dtype = dtype or torch.get_default_dtype()
    return torch.promote_types(dtype, torch.float32)


@dataclass
class ApproximateOptions(DeconstructedOptions):
    """Options of `approximate`.

    Attributes:
        normalization: "joint" (one normaliser, as Based) or "separate" (each Taylor order normalised on its own,
            Appendix I as extracted; unstable in training, see the module docstring).
        chunk_size: block length of the chunked linear-time fast path; None picks the cheaper of T and 64.
        eps: keeps the signed first-order denominator of "separate" at least eps away from zero.
        recompute: backward keeps only q, k, v and recomputes the mixing (`torch.utils.checkpoint`): no (c, c)
            kernels (c = T below T ~ hs^2, 2.6 T^2 fp32 bytes per sequence and head) and no hs^2 feature maps are
            saved, for one more mixing forward (not credited by the analytic FLOPs). Default true; false keeps them.
    """

    normalization: Literal["separate", "joint"] = "joint"
    chunk_size: int | None = None
    eps: float = 1e-6
    recompute: bool = True


class ApproximateAttention(ProjectedAttention):
    """`approximate`: softmax replaced by its second-order Taylor expansion, in causal linear-time form."""

    name = "approximate"
    Options = ApproximateOptions

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q = self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
        k = self.split_heads(self.k_proj(x))  # (B, nh, T, hs)
        v = self.split_heads(self.v_proj(x))  # (B, nh, T, hs)
        q, k = self.norm_qk(q, k)
        q, k = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)  # (B, nh, T, hs) each
        o = self.options
        if ctx.decoding:
            return self.output(self.decode_mixing(q, k, v, ctx))  # (B, T, C)
        if o.impl == "math":
            y = taylor_attention_quadratic(q, k, v, o.normalization, o.eps)  # (B, nh, T, hs)
        else:
            chunk = taylor_chunk_size(q.size(2), self.head_size, o.chunk_size, o.normalization)
            if o.recompute and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                # Backward keeps q, k, v only and recomputes the mixing (option `recompute`; the same numbers).
                y = checkpoint(
                    taylor_attention_chunked, q, k, v, o.normalization, o.eps, chunk, use_reentrant=False
                )  # (B, nh, T, hs)
            else:
                y = taylor_attention_chunked(q, k, v, o.normalization, o.eps, chunk)  # (B, nh, T, hs)
        return self.output(y)  # (B, T, C)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache:
        """The recurrent state of the linear form (module docstring): no time-axis buffer, nh (1 + hs + hs^2)
        (hs + 1) values per sequence whatever `max_len`, in `state_dtype(dtype)` (at least fp32)."""
        nh, hs = self.n_head, self.head_size
        state = {"s0": (nh, hs + 1), "s1": (nh, hs, hs + 1), "s2": (nh, hs * hs, hs + 1)}
        return LayerCache(batch_size, max_len, device, state_dtype(dtype), state=state)

    def decode_mixing(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Decode mode: the next T tokens' q, k, v (B, nh, T, hs) against the state in `ctx.cache`, in blocks of the
        fast path's chunk (`taylor_chunk_size`) -> (B, nh, T, hs)."""
        o, T = self.options, q.size(2)
        valid = ctx.key_valid[:, -T:][:, None, :, None]  # (B, 1, T, 1)
        chunk = taylor_chunk_size(T, self.head_size, o.chunk_size, o.normalization)
        blocks = []
        for start in range(0, T, chunk):
            part = slice(start, start + chunk)
            blocks.append(
                taylor_decode_block(
                    q[:, :, part], k[:, :, part], v[:, :, part], valid[:, :, part], ctx.cache.state,
                    o.normalization, o.eps,
                )  # (B, nh, c, hs)
            )  # fmt: skip
        return torch.cat(blocks, dim=2)  # (B, nh, T, hs)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: ApproximateOptions) -> None:
        super().check_config(config, layer_idx, options)
        if options.normalization not in ("separate", "joint"):
            raise ValueError(
                f"approximate: normalization={options.normalization!r} is not 'separate' (per Taylor order, the "
                "paper's Appendix I) or 'joint' (one normaliser, as Based)."
            )
        chunk = options.chunk_size
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"approximate: chunk_size must be a positive integer or null (auto), got {chunk!r}.")
        if not options.eps > 0:
            raise ValueError(f"approximate: eps must be > 0 (it guards a denominator), got {options.eps!r}.")

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: ApproximateOptions, seq_len: int) -> int:
        C = config.n_embd
        mixing = config.n_head * taylor_chunked_flops(
            seq_len,
            config.head_size,
            taylor_chunk_size(seq_len, config.head_size, options.chunk_size, options.normalization),
            options.normalization,
        )
        return 4 * 2 * C * C + round(mixing / seq_len)

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: ApproximateOptions) -> int:
        return 0  # recurrent: a fixed state of nh (1 + hs + hs^2)(hs + 1) values per layer instead (see `new_cache`)


# ----------------------------------------------------------------------------------------------------------------------
# non_approximate: causal softmax pooling over per-position scores
# ----------------------------------------------------------------------------------------------------------------------


def softmax_pool_quadratic(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference: o_i = sum_{j<=i} softmax over j<=i of s_j, times v_j, as an O(T^2) masked softmax.

    s (..., T) scores per position, v (..., T, d) -> (..., T, d).
    """
    T = s.size(-1)
    rows = s.unsqueeze(-2).expand(*s.shape[:-1], T, T)  # (..., T, T): row i holds s_1..s_T
    rows = rows.masked_fill(~causal_mask(T, T, s.device), float("-inf"))  # keep j <= i
    return rows.softmax(-1) @ v  # (..., T, d)


def softmax_pool_scan(s: torch.Tensor, v: torch.Tensor, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path: the causal softmax pooling of `softmax_pool_quadratic`, linear in T, and its log-normaliser.

    Args:
        s: scores (..., T).
        v: values (..., T, d).
        chunk_size: block length (>= 2). Blocks are pooled exactly; the block summaries (log-mass, normalised
            mean) are pooled by the same function, recursively, so the recursion depth is log_c(T).

    Returns:
        o (..., T, d) and lse (..., T) with lse_i = log sum_{j<=i} e^{s_j}.
    """
    T = s.size(-1)
    if T <= chunk_size:
        rows = s.unsqueeze(-2).expand(*s.shape[:-1], T, T)  # (..., T, T)
        rows = rows.masked_fill(~causal_mask(T, T, s.device), float("-inf"))
        lse = rows.logsumexp(-1)  # (..., T)
        return torch.exp(rows - lse.unsqueeze(-1)) @ v, lse  # (..., T, d), (..., T)
    c = chunk_size
    N = -(-T // c)
    pad = N * c - T
    lead, d = s.shape[:-1], v.size(-1)
    # Padding at the end only: it changes no real position (causal) and only the last, unused chunk summary.
    s_c = F.pad(s, (0, pad)).view(*lead, N, c)  # (..., N, c)
    v_c = F.pad(v, (0, 0, 0, pad)).view(*lead, N, c, d)  # (..., N, c, d)
    o_loc, lse_loc = softmax_pool_scan(s_c, v_c, c)  # (..., N, c, d), (..., N, c): within each chunk
    # Pool the chunk summaries (the last position of a chunk covers all of it): inclusive prefix over chunks.
    o_pre, lse_pre = softmax_pool_scan(lse_loc[..., -1], o_loc[..., -1, :], c)  # (..., N, d), (..., N)
    # Chunk n needs chunks 0..n-1 only: shift by one (chunk 0 gets an empty prefix, log-mass -inf).
    lse_prev = F.pad(lse_pre[..., :-1], (1, 0), value=float("-inf")).unsqueeze(-1)  # (..., N, 1)
    o_prev = F.pad(o_pre[..., :-1, :], (0, 0, 1, 0)).unsqueeze(-2)  # (..., N, 1, d)
    lse = torch.logaddexp(lse_prev, lse_loc)  # (..., N, c)
    w_prev = torch.exp(lse_prev - lse).unsqueeze(-1)  # (..., N, c, 1), in [0, 1]
    w_loc = torch.exp(lse_loc - lse).unsqueeze(-1)  # (..., N, c, 1), in [0, 1]
    o = w_prev * o_prev + w_loc * o_loc  # (..., N, c, d)
    return o.reshape(*lead, N * c, d)[..., :T, :], lse.reshape(*lead, N * c)[..., :T]


def softmax_pool_scan_flops(T: int, d: int, chunk_size: int) -> int:
    """Matmul FLOPs of `softmax_pool_scan` for one sequence of length T and value width d."""
    if T <= chunk_size:
        return 2 * T * T * d
    N = -(-T // chunk_size)
    return N * 2 * chunk_size * chunk_size * d + softmax_pool_scan_flops(N, d, chunk_size)


def softmax_pool_decode_block(
    s: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, state: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Decode: the pooling of `softmax_pool_quadratic` for c new tokens after those summarised by `state`.

    Args:
        s: scores (B, nh, c); v: values (B, nh, c, hs).
        valid: (B, 1, c) bool, False for left padding (never pooled; a pad query pools only itself: finite).
        state: "m" (B, nh) largest score held, "den" (B, nh) sum_j e^{s_j - m} (0: nothing held yet), "o" (B, nh, hs)
            the normalised output; updated in place to cover the new valid tokens.

    Returns:
        (B, nh, c, hs) in v's dtype. The state enters as one more key with log-mass m + log den (-inf when empty) and
        value o; the pooling runs in the state's dtype (`state_dtype`).
    """
    B, nh, c = s.shape
    out_dtype = v.dtype
    s, v = s.to(state["o"].dtype), v.to(state["o"].dtype)
    prev = state["m"] + torch.log(state["den"])  # (B, nh): -inf for an empty state
    own = torch.eye(c, dtype=torch.bool, device=s.device)  # (c, c)
    allowed = causal_mask(c, c, s.device) & (valid.unsqueeze(-2) | own)  # (B, 1, c, c)
    rows = s.unsqueeze(-2).expand(B, nh, c, c).masked_fill(~allowed, float("-inf"))  # (B, nh, c, c)
    rows = torch.cat((prev[..., None, None].expand(B, nh, c, 1), rows), dim=-1)  # (B, nh, c, 1 + c)
    values = torch.cat((state["o"].unsqueeze(-2), v), dim=-2)  # (B, nh, 1 + c, hs)
    out = rows.softmax(-1) @ values  # (B, nh, c, hs): every row holds its own finite score
    # New state: pool the old state and every valid new key (an all-pad block leaves an empty state empty).
    held = torch.cat((prev.unsqueeze(-1), s.masked_fill(~valid, float("-inf"))), dim=-1)  # (B, nh, 1 + c)
    m = held.amax(-1)  # (B, nh), -inf when nothing is held
    m = torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype, device=m.device))
    w = torch.exp(held - m.unsqueeze(-1))  # (B, nh, 1 + c), 0 for masked keys, max 1
    den = w.sum(-1)  # (B, nh), >= 1 unless empty
    o = (w.unsqueeze(-2) @ values).squeeze(-2) / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    state["m"].copy_(m)
    state["den"].copy_(den)
    state["o"].copy_(o)  # (B, nh, hs)
    return out.to(out_dtype)


@dataclass
class NonApproximateOptions(DeconstructedOptions):
    """Options of `non_approximate`.

    Attributes:
        chunk_size: block length of the linear-time scan (>= 2).
    """

    chunk_size: int = 64


class NonApproximateAttention(ProjectedAttention):
    """`non_approximate`: one score per key position, s_j = SiLU(q_j) . k_j / sqrt(hs), pooled by a causal softmax."""

    name = "non_approximate"
    Options = NonApproximateOptions

    def scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head scores s (B, nh, T) and values v (B, nh, T, hs) of x (B, T, C)."""
        q = self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
        k = self.split_heads(self.k_proj(x))  # (B, nh, T, hs)
        v = self.split_heads(self.v_proj(x))  # (B, nh, T, hs)
        q, k = self.norm_qk(q, k)
        s = (F.silu(q) * k).sum(-1) / math.sqrt(self.head_size)  # (B, nh, T)
        return s, v

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """The pooling's softmax logits: row i holds s_1..s_i (future -inf), (B, nh, T, T) in fp32 (fp64 for fp64)."""
        s, _ = self.scores(x)  # (B, nh, T)
        T = s.size(-1)
        s = s.to(torch.promote_types(s.dtype, torch.float32))
        rows = s.unsqueeze(-2).expand(*s.shape[:-1], T, T)  # (B, nh, T, T): row i holds s_1..s_T
        return rows.masked_fill(~causal_mask(T, T, s.device), float("-inf"))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        s, v = self.scores(x)  # (B, nh, T), (B, nh, T, hs)
        if ctx.decoding:
            valid = ctx.key_valid[:, -s.size(-1) :].unsqueeze(1)  # (B, 1, T)
            c = self.options.chunk_size
            blocks = [
                softmax_pool_decode_block(s[..., i : i + c], v[:, :, i : i + c], valid[..., i : i + c], ctx.cache.state)
                for i in range(0, s.size(-1), c)
            ]  # (B, nh, c, hs) each
            return self.output(torch.cat(blocks, dim=2))  # (B, T, C)
        if self.options.impl == "math":
            y = softmax_pool_quadratic(s, v)  # (B, nh, T, hs)
        else:
            y, _ = softmax_pool_scan(s, v, self.options.chunk_size)  # (B, nh, T, hs)
        return self.output(y)  # (B, T, C)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache:
        """The running pooled state (module docstring): "m", "den" (B, nh) and "o" (B, nh, hs), nh (hs + 2) values per
        sequence whatever `max_len`, in `state_dtype(dtype)` (at least fp32); no time-axis buffer."""
        nh, hs = self.n_head, self.head_size
        state = {"m": (nh,), "den": (nh,), "o": (nh, hs)}
        return LayerCache(batch_size, max_len, device, state_dtype(dtype), state=state)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: NonApproximateOptions) -> None:
        super().check_config(config, layer_idx, options)
        if not isinstance(options.chunk_size, int) or options.chunk_size < 2:
            raise ValueError(
                f"non_approximate: chunk_size must be an integer >= 2 (the scan pools chunk summaries recursively), "
                f"got {options.chunk_size!r}."
            )

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: NonApproximateOptions, seq_len: int) -> int:
        C = config.n_embd
        # The scores are elementwise (no matmul); the pooling is the scan's matmuls over hs channels per head.
        mixing = config.n_head * softmax_pool_scan_flops(seq_len, config.head_size, options.chunk_size)
        return 4 * 2 * C * C + round(mixing / seq_len)

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: NonApproximateOptions) -> int:
        return 0  # recurrent: a fixed state of nh (hs + 2) values per layer instead (see `new_cache`)


def recurrent_state_values(config: ModelConfig, options: AttentionOptions) -> int:
    """Values of the fixed per-sequence decode state of one layer (`LayerCache.state`): approximate nh (1 + hs +
    hs^2)(hs + 1), non_approximate nh (hs + 2), 0 for every other backend."""
    nh, hs = config.n_head, config.head_size
    if isinstance(options, ApproximateOptions):
        return nh * (1 + hs + hs * hs) * (hs + 1)
    if isinstance(options, NonApproximateOptions):
        return nh * (hs + 2)
    return 0
