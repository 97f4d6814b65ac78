"""Standard causal multi-head self-attention, with shared projections and grouped K/V heads as options.

Baseline: Vaswani et al. 2017, "Attention Is All You Need" (arXiv 1706.03762), eq. 1::

    q = x W_Q,  k = x W_K,  v = x W_V                       (B, T, C) -> (B, nh, T, hs) each
    q, k = RMSNorm(q), RMSNorm(k)                            optional `qk_norm` (per head, learned gain)
    q, k = RoPE(q), RoPE(k)                                  when config.position == "rope"
    y = softmax(q k^T / sqrt(hs) + causal mask) v W_O        (B, T, C)

Shared projections: Kayyam, Madan Gopal & Lewis 2026, "Do Transformers Need Three Projections? Systematic Study of
QKV Variants" (arXiv 2606.04032; official code Brainchip-Inc/Do-Transformers-Need-3-Projections). Option
`qkv_sharing` ties projection matrices (the paper's names in brackets; the hyphen separates, it does not subtract)::

    "none"         q = x W_Q,  k = x W_K,  v = x W_V         [QKV]      3 input projections
    "k_eq_v"       q = x W_Q,  k = v = x W_K                 [Q-K=V]    2 (only K is cached: -50% KV cache)
    "q_eq_k"       q = k = x W_K,  v = x W_V                 [Q=K-V]    2 (score matrix symmetric before the mask)
    "q_eq_k_eq_v"  q = k = v = x W_K                         [Q=K=V]    1 (-50% KV cache)

Grouped K/V heads (Ainslie et al. 2023, GQA, arXiv 2305.13245; Shazeer 2019, MQA, arXiv 1911.02150), option
`n_kv_groups` = number of K/V heads nkv: W_K and W_V map C -> nkv * hs, and query head h reads K/V head
h // (nh / nkv) (contiguous groups, as `repeat_interleave` and SDPA's `enable_gqa` lay them out). None means nkv = nh
(MHA), 1 is MQA, g is GQA-g. It composes with "none" (GQA-g, MQA) and "k_eq_v" (the paper's Q-GQA-g, Q-MQA).

Tying is real: a tied projection does not exist as a module (`q_proj` / `v_proj` are None) and `project` returns
the very same tensor for the tied roles, so the tied matrix is one parameter that receives both gradients. The
surviving matrix is always called `k_proj` (as in the official code, where Q=K-V keeps `c_kv` and Q=K=V keeps
`c_k`). Parameter counts drop by C^2 (+ C with biases) per layer per removed projection; the paper does not
compensate for them, and neither do we.

Options (`StandardOptions`; defaults: docs/backends.md); [NS] marks choices the paper does not state:
    impl: fused `scaled_dot_product_attention` (GQA via `enable_gqa`, no repeated K/V materialised) or
        the explicit "math" path (the test oracle).
    qk_norm: per-head RMSNorm with a learned gain on q and k before RoPE (QK-norm baseline of arXiv
        2511.21377, Qwen3 placement).
    qkv_sharing: see above.
    n_kv_groups (None: n_head): number of K/V heads.

    [NS] Positions and norms with tied V. The paper uses learned absolute positions and no QK-norm, so for it
        `v = k` is the plain projection. Here RoPE and QK-norm act only on the k (and q) used for *scoring*; V is
        the un-rotated, un-normalised projection x W_K (k_eq_v, q_eq_k_eq_v). Rotating V would make the values
        position-dependent, which none of the paper's models do.
    [NS] q_eq_k with QK-norm: one RMSNorm (`k_norm`) serves q and k, so q == k still holds after the norm and RoPE
        and the score matrix stays symmetric ((R_m k_m) . (R_n k_n) is symmetric in m, n); +hs parameters, not 2 hs.
    [NS] q_eq_k / q_eq_k_eq_v with grouped K/V heads are refused in `check_config`: q = k needs as many K heads as
        query heads, and the paper never combines Q=K with GQA.
    [NS] KV cache under RoPE for k_eq_v: cache the raw projection x W_K (= V) and apply norm and RoPE to cached keys
        when scoring, which keeps the cache at nkv * hs values per token (`kv_cache_values_per_token`).

Decoding (`new_cache`, `decode`; the contract in `base.py`): the cache holds k (after QK-norm and RoPE) and v of the
nkv K/V heads; with a tied v and no learned transform only the raw x W_K (= v), from which the scoring keys are
re-derived (norm, RoPE at each key's position) every step; with a learned transform the transformed keys of all nh
query heads and the values (the raw k when v is tied). Tested equal to the full forward in fp64 for every setting,
left-padded batches included (`tests/inference`).

KV-cache values per token and layer: none 2 nkv hs, k_eq_v nkv hs, q_eq_k 2 nkv hs, q_eq_k_eq_v nkv hs. At the
paper's 16 heads that reproduces its table: Q-K=V 50%, GQA-4 75%, MQA 93.75%, Q-GQA-4 87.5%, Q-MQA 96.875% less
than MHA.

This backend is the baseline every other backend is compared with and, in its `impl="math"` form, the reference they are
tested against. Tests (`tests/contract/test_contract.py`, the harness every backend passes, for every sharing x
grouping setting: SDPA == math in fp64, forward and backward; causality (future tokens never change past outputs);
`tests/unit/attention/backends/test_standard.py`, `tests/unit/attention/backends/test_standard_shared_projections.py`):
parameter count 4 C^2 (+ 4 C biases,
+ 2 hs norm gains with qk_norm) and the exact drops of every setting, including the paper's 300M attention totals 83.97M
/ 62.98M / 41.98M; exact degenerate cases (q_eq_k == standard with W_Q := W_K, k_eq_v == standard with W_V := W_K, GQA
with nkv = nh == standard, GQA-g == standard with each K/V head's rows repeated for its group); tied roles are one
parameter; q_eq_k's pre-mask scores are symmetric; KV-cache reductions match the paper's table; analytic FLOPs match a
FLOP counter.

Subclasses reuse the three stages of `forward`: `project` (x -> q (B, nh, T, hs), k and v (B, nkv, T, hs)),
`transform_qk` (the q/k transform stage of `transform.py`: QK-norm, the optional learned transform `qk_transform`,
RoPE) and `attend` (the score/softmax/value product). With a tied q (q_eq_k, q_eq_k_eq_v) `project` returns `q is k`,
and without a learned transform `transform_qk` keeps them one tensor. With a learned transform and grouped K/V heads
each query head is paired with its key head (`transform.py`), so the keys leave the stage with nh heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions, QKWeight, QKWeights
from lightning_cqk.attention.cache import LayerCache
from lightning_cqk.attention.kernels.functional import causal_attention, causal_logits, masked_attention
from lightning_cqk.attention.kernels.matched_norm import MatchedRMSNorm
from lightning_cqk.attention.rope import apply_rope
from lightning_cqk.attention.transform import build_transform, check_transform, qk_stage, transform_flops

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig

QKVSharing = Literal["none", "k_eq_v", "q_eq_k", "q_eq_k_eq_v"]
QKV_SHARING_CHOICES: tuple[str, ...] = ("none", "k_eq_v", "q_eq_k", "q_eq_k_eq_v")
#: Settings in which q is the k projection (no `q_proj`), and those in which v is (no `v_proj`).
_Q_TIED = frozenset({"q_eq_k", "q_eq_k_eq_v"})
_V_TIED = frozenset({"k_eq_v", "q_eq_k_eq_v"})


@dataclass
class StandardOptions(AttentionOptions):
    """Options of `standard` (and of the backends derived from it).

    Attributes:
        qk_norm: RMSNorm with a learned gain on each head's q and k (before RoPE), the QK-norm baseline of
            arXiv 2511.21377 (Qwen3 placement). With a tied q (q_eq_k, q_eq_k_eq_v) one norm serves both.
        qkv_sharing: which input projections are one matrix (arXiv 2606.04032): "none" (separate W_Q, W_K, W_V),
            "k_eq_v" (Q-K=V: v = k), "q_eq_k" (Q=K-V: q = k), "q_eq_k_eq_v" (Q=K=V: one projection).
        n_kv_groups: number of K/V heads; None means n_head (MHA), 1 is MQA, g is GQA-g. Must divide n_head.
        qk_transform: the learned q/k transform, ``{kind: coupled | uncoupled_mlp | invertible, <options>}``, or None
            (`lightning_cqk.attention.transform`).
    """

    qk_norm: bool = False
    qkv_sharing: QKVSharing = "none"
    n_kv_groups: int | None = None
    qk_transform: dict | None = None


def n_kv_heads(config: ModelConfig, options: StandardOptions) -> int:
    """Number of K/V heads nkv for `options`, validating sharing and grouping (ValueError when impossible)."""
    sharing = options.qkv_sharing
    if sharing not in QKV_SHARING_CHOICES:
        raise ValueError(f"qkv_sharing={sharing!r} is not one of {', '.join(map(repr, QKV_SHARING_CHOICES))}.")
    groups = options.n_kv_groups
    if groups is None:
        return config.n_head
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(
            f"n_kv_groups must be a positive integer (the number of K/V heads) or null for n_head, got {groups!r}."
        )
    if groups > config.n_head:
        raise ValueError(
            f"n_kv_groups={groups} exceeds n_head={config.n_head}: there cannot be more K/V heads than query heads; "
            f"use n_kv_groups <= {config.n_head} (null means n_head)."
        )
    if config.n_head % groups:
        divisors = [g for g in range(1, config.n_head + 1) if config.n_head % g == 0]
        raise ValueError(
            f"n_head={config.n_head} is not divisible by n_kv_groups={groups}: every K/V head must serve the same "
            f"number of query heads; choose n_kv_groups among {divisors}."
        )
    if sharing in _Q_TIED and groups != config.n_head:
        raise ValueError(
            f"qkv_sharing={sharing!r} ties q to k, which needs one K head per query head, but n_kv_groups={groups} "
            f"< n_head={config.n_head}. Use n_kv_groups=null (or {config.n_head}), or qkv_sharing 'k_eq_v' / 'none' "
            "to combine sharing with grouped K/V heads."
        )
    return groups


class StandardAttention(AttentionBackend):
    """Multi-head softmax attention; optionally with tied Q/K/V projections and grouped K/V heads.

    Attributes:
        q_proj: C -> C query projection, None when q is tied to k.
        k_proj: C -> nkv * hs key projection (always present; it is the shared matrix of every tied setting).
        v_proj: C -> nkv * hs value projection, None when v is tied to k.
        out_proj: C -> C output projection.
        q_norm, k_norm: per-head RMSNorms with qk_norm (q_norm is None when q is tied to k), else None.
        qk_transform: the learned q/k transform (`transform.QKTransform`) or None.
    """

    name = "standard"
    Options = StandardOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: StandardOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, self.n_head, self.head_size = config.n_embd, config.n_head, config.head_size
        self.n_kv_head = n_kv_heads(config, options)
        self.q_tied = options.qkv_sharing in _Q_TIED
        self.v_tied = options.qkv_sharing in _V_TIED
        kv_width = self.n_kv_head * self.head_size
        self.q_proj = None if self.q_tied else nn.Linear(C, C, bias=config.bias)
        self.k_proj = nn.Linear(C, kv_width, bias=config.bias)
        self.v_proj = None if self.v_tied else nn.Linear(C, kv_width, bias=config.bias)
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        if options.qk_norm:
            self.q_norm = None if self.q_tied else MatchedRMSNorm(self.head_size, eps=config.norm_eps)
            self.k_norm = MatchedRMSNorm(self.head_size, eps=config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qk_transform = build_transform(options.qk_transform, config, layer_idx, self.n_head, self.head_size)
        self.attn_dropout = config.attn_dropout_p
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, n * hs) -> (B, n, T, hs)."""
        B, T, _ = t.shape
        return t.view(B, T, -1, self.head_size).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, n, T, hs) -> (B, T, n * hs)."""
        B, _, T, _ = t.shape
        return t.transpose(1, 2).reshape(B, T, -1)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head q (B, nh, T, hs), k and v (B, nkv, T, hs) from x (B, T, C); tied roles are the same tensor."""
        k = self.split_heads(self.k_proj(x))  # (B, nkv, T, hs)
        q = k if self.q_proj is None else self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
        v = k if self.v_proj is None else self.split_heads(self.v_proj(x))  # (B, nkv, T, hs)
        return q, k, v

    def transform_qk(
        self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The q/k stage (`transform.qk_stage`): QK-norm, learned transform, RoPE. q (B, nh, T, hs), k (B, nkv, T, hs)
        in; k leaves with nh heads when a learned transform pairs grouped K/V heads. A tied q stays k without one."""
        transform = self.qk_transform
        return qk_stage(q, k, ctx, q_norm=self.q_norm, k_norm=self.k_norm, transform=transform, keys_kept=self.v_tied)

    def reset_backend_parameters(self) -> None:
        if self.qk_transform is not None:
            self.qk_transform.reset_parameters()

    def qk_weights(self) -> QKWeights:
        """q_proj (nh row blocks) and k_proj (nkv blocks); one "qk" matrix when q is tied to k."""
        if self.q_proj is None:
            return QKWeights("mha", (QKWeight("k_proj", "qk", self.n_kv_head),))
        return QKWeights("mha", (QKWeight("q_proj", "q", self.n_head), QKWeight("k_proj", "k", self.n_kv_head)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax attention per head: q (B, nh, T, hs), k, v (B, nkv, T, hs) -> (B, nh, T, hs)."""
        dropout_p = self.attn_dropout if self.training else 0.0
        return causal_attention(q, k, v, impl=self.options.impl, dropout_p=dropout_p)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if ctx.decoding:
            return self.decode(x, ctx)
        if getattr(self.qk_transform, "recompute", None) == "qk" and torch.is_grad_enabled():
            return self._forward_recompute_qk(x, ctx)
        q, k, v = self.project(x)  # q (B, nh, T, hs); k, v (B, nkv, T, hs)
        q, k = self.transform_qk(q, k, ctx)  # q (B, nh, T, hs); k (B, nkv or nh, T, hs)
        y = self.attend(q, k, v)  # (B, nh, T, hs)
        return self.resid_dropout(self.out_proj(self.merge_heads(y)))  # (B, T, C)

    @property
    def caches_raw_k(self) -> bool:
        """True when the cache holds the raw projection x W_K (= v) and scores re-derive the keys from it: a tied v
        without a learned transform. Otherwise it holds the scoring keys after the q/k stage (and v)."""
        return self.v_tied and self.qk_transform is None

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache:
        """The KV cache of the paper: k and v of the nkv K/V heads (k after QK-norm and RoPE); a tied v (Q-K=V,
        Q=K=V) only the raw k = v; with a learned q/k transform the transformed keys of every query head, "k"
        (B, nh, max_len, hs), and the values (the raw k when v is tied). See `kv_cache_values_per_token`."""
        hs, nkv = self.head_size, self.n_kv_head
        if self.caches_raw_k:
            buffers = {"k": (nkv, hs)}
        else:
            buffers = {"k": (nkv if self.qk_transform is None else self.n_head, hs), "v": (nkv, hs)}
        return LayerCache(batch_size, max_len, device, dtype, buffers=buffers)

    def decode(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Decode mode: the next T tokens x (B, T, C) against this layer's cache `ctx.cache` -> (B, T, C)."""
        q, k, v = self.project(x)  # q (B, nh, T, hs); k, v (B, nkv, T, hs)
        if self.caches_raw_k:
            # (B, nkv, L, hs): x W_K of every held token (= v), in the compute dtype (a cache may be kept narrower)
            k_raw = ctx.cache.append(k=k)["k"].to(k.dtype)
            keys = k_raw if self.k_norm is None else self.k_norm(k_raw)  # (B, nkv, L, hs)
            keys = apply_rope(keys, ctx.key_cos(), ctx.key_sin())  # (B, nkv, L, hs)
            if self.q_tied:
                q = keys[:, :, -x.size(1) :]  # (B, nh, T, hs): the new tokens' keys, rotated at their positions
            else:
                q = q if self.q_norm is None else self.q_norm(q)
                q = apply_rope(q, ctx.cos, ctx.sin)  # (B, nh, T, hs)
            y = masked_attention(q, keys, k_raw, ctx.attn_mask, impl=self.options.impl)  # (B, nh, T, hs)
        else:
            v_new = k if self.v_tied else v  # (B, nkv, T, hs): a tied v is the raw k
            q, k = self.transform_qk(q, k, ctx)  # q (B, nh, T, hs); k (B, nkv or nh, T, hs)
            held = ctx.cache.append(k=k, v=v_new)  # k (B, nkv or nh, L, hs); v (B, nkv, L, hs)
            y = masked_attention(q, held["k"], held["v"], ctx.attn_mask, impl=self.options.impl)  # (B, nh, T, hs)
        return self.resid_dropout(self.out_proj(self.merge_heads(y)))  # (B, T, C)

    def _forward_recompute_qk(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """`forward` with the transform's recompute="qk": q and k are recomputed from x (which every projection keeps
        for its own backward) in one checkpointed region; a tied v is the raw k projection, computed once outside."""
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
        """The learned transform's per-layer quantities (v1: {"dt": ...}); {} without one."""
        return {} if self.qk_transform is None else self.qk_transform.stats()

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """q k^T / sqrt(hs) of every query head after `transform_qk` (norm, RoPE, dynamics), (B, nh, T, T) fp32."""
        q, k, _ = self.project(x)  # q (B, nh, T, hs); k (B, nkv, T, hs)
        q, k = self.transform_qk(q, k, ctx)
        return causal_logits(q, k)  # (B, nh, T, T)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: StandardOptions) -> None:
        n_kv_heads(config, options)
        if options.impl not in ("sdpa", "math"):
            raise ValueError(
                f"attention {cls.name!r} (layer {layer_idx}): impl={options.impl!r}; use 'sdpa' or 'math'."
            )
        where = f"attention {cls.name!r} (layer {layer_idx})"
        check_transform(options.qk_transform, config, layer_idx, config.n_head, config.head_size, where)

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: StandardOptions, seq_len: int) -> int:
        C = config.n_embd
        kv_width = n_kv_heads(config, options) * config.head_size
        sharing = options.qkv_sharing
        projections = 2 * C * C + 2 * C * kv_width  # out and k: always present
        if sharing not in _Q_TIED:
            projections += 2 * C * C  # q (a tied q is k's projection, computed once)
        if sharing not in _V_TIED:
            projections += 2 * C * kv_width  # v
        # q.k over seq_len keys, then probs @ v: per query head, so grouped K/V heads do not reduce it.
        scores_and_values = 2 * 2 * seq_len * C
        return projections + scores_and_values + transform_flops(options.qk_transform, config.n_head, config.head_size)

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: StandardOptions) -> int:
        kv_width = n_kv_heads(config, options) * config.head_size
        if options.qk_transform is not None:
            # The transformed keys, one per query head (the transform of a key needs its own token's q, so it cannot
            # be reapplied from a raw cache), and the values (a tied v is the raw k, not the transformed one).
            return config.n_embd + kv_width
        # A tied v is the cached k itself (raw projection; norm and RoPE are reapplied when scoring).
        return kv_width if options.qkv_sharing in _V_TIED else 2 * kv_width
