"""Differential attention, V1 (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258, ICLR 2025).

Each differential head subtracts two softmax maps, so attention "noise" common to both cancels (paper §2.1, and the
official code microsoft/unilm `Diff-Transformer/multihead_diffattn.py`, which this follows where the paper is
silent)::

    [q1; q2] = x W_Q,  [k1; k2] = x W_K,  v = x W_V               q_i, k_i: (B, nh/2, T, hs); v: (B, nh/2, T, 2 hs)
    A = softmax(q1 k1^T / sqrt(hs) + mask) - lambda * softmax(q2 k2^T / sqrt(hs) + mask)        (B, nh/2, T, T)
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init                (scalar, fp32)
    lambda_init = 0.8 - 0.6 * exp(-0.3 * depth),  depth = 0-based layer index (the paper's l - 1)
    head_i = (1 - lambda_init) * RMSNorm(A_i v_i)                  per-head RMSNorm over 2 hs ("GroupNorm")
    y = concat(head_1, ..., head_{nh/2}) W_O

Head layout. `config.n_head` is the head count of the *baseline* Transformer: this backend uses nh/2 differential
heads with q/k half-heads of hs = C / nh (the baseline's head size, also the 1/sqrt(hs) scale) and values of 2 hs,
so W_Q, W_K, W_V, W_O are the same four C x C matrices as `standard` (equal parameters and FLOPs; paper §2.1).
q and k are split into nh heads of hs; heads (2i, 2i+1) are (q1, q2) of differential head i, as in the official
reshape `(B, T, 2 h, d)`; v is split into nh/2 heads of 2 hs. RoPE (`rope.py`, half-split) and the optional QK-norm
act on every hs-wide half-head. Extra parameters per layer: the four lambda vectors (4 hs) and the RMSNorm gain
(2 hs), i.e. 6 hs on top of `standard` (+2 hs more with qk_norm in both).

lambda is shared by all heads of a layer, computed in fp32 (fp64 when the parameters are fp64) and kept out of
autocast; the vectors are initialised N(0, 0.1) in `reset_backend_parameters` and never clamped (log
`dynamics_stats()["lambda"]`: exp can grow). Map rows sum to 1 - lambda, not 1, and are not renormalised: the
per-head RMSNorm times (1 - lambda_init) sets the scale. Both maps are masked and softmaxed separately *before* the
subtraction (docs/papers.md §6 item 1).

Paths (`impl`):
    "sdpa": two fused `scaled_dot_product_attention` calls, one per map, each against the whole 2 hs value, with
        q and k zero-padded from hs to 2 hs ((q1|0).(k1|0) = q1.k1; the scale 1/sqrt(hs) is passed explicitly):
        SDPA's fused kernels need equal q/k and v head sizes. Each map's softmax is computed once (the FlashDiff2
        split-V form of the official `multihead_flashdiff_2.py`, four calls of hs, computes each map twice, exps
        included) and an attention dropout mask applies to the whole value of its map (the forms' measured times:
        docs/speed.md, "Kernel choices measured"). Cost: the padded score products and the 2 hs value products do
        twice the matmul work of `standard`'s attention core, as the four-call form does.
    "math": the naive path and test oracle: both maps materialised with masked softmax in fp32 (fp64 for fp64
        inputs), subtracted, then multiplied by v.

Options (`DifferentialOptions`; defaults: docs/backends.md):
    impl: see above.
    qk_norm: RMSNorm with a learned gain (hs wide) on every q and k half-head before RoPE, the QK-norm
        baseline of arXiv 2511.21377. Not in the Differential Transformer paper [NS].
    lambda_init: None uses the depth schedule above; a float in [0, 1) fixes it for every layer (the paper's
        ablation tries 0.8 and 0.5).
    n_kv_groups (None: n_head): grouped K/V heads, counted like `standard`'s option (the *baseline* Transformer's
        K/V head count nkv, so the K/V projections have standard GQA-nkv's size, C -> nkv hs each): the layer has
        nkv/2 differential K/V heads, i.e. nkv key half-heads of hs and nkv/2 values of 2 hs (the official
        `num_kv_heads` is nkv/2). Grouping follows the official `multihead_diffattn.py` exactly: `repeat_kv`
        repeats every key *half-head* n_rep = nh / nkv times, so query half-head j (q1 of differential head i is
        j = 2i, q2 is j = 2i+1) reads key half-head j // n_rep, and differential head i reads value head
        i // n_rep. [NS] in the paper; a consequence of that code: with n_rep >= 2, q1 and q2 of a head read the
        same key half-head. Contiguous groups, as `standard`'s GQA, so QuacK's and QK-clip's grouped-head rules
        apply unchanged. nkv = nh is today's layer exactly (tested); nkv must be even and divide nh.
    Fixed choices of the official code that the paper does not state [NS]: 0-based depth in the schedule (0.2 at
    the first layer; 1-based would give 0.356), RMSNorm eps 1e-5 with a learned gain initialised to 1, N(0, 0.1)
    lambda vectors of size hs, lambda shared by all heads, no attention-weight dropout in the official code (here
    `attn_dropout` drops each map's weights independently, default 0). Biases follow `config.bias`; the official
    projections have none (our default). The half-split RoPE convention of this repo replaces the official
    interleaved one (equivalent up to a fixed permutation of q/k features).

FLOPs: counted as the model's matmuls, independent of `impl` (the PaLM MFU convention, which does not credit
recomputation): the same 8 C^2 + 4 T C per token as `standard`. The fast path's padded score products (2 hs wide)
and 2 hs value products per map execute 8 C^2 + 8 T C.

KV cache (decode mode, `new_cache`): the nkv key half-heads after QK-norm and RoPE and the nkv/2 values of 2 hs, i.e.
2 nkv hs values per token and layer, as `standard` GQA-nkv; with a learned q/k transform the nh transformed key
half-heads instead of the nkv (C + nkv hs). Decoding equals the full forward in fp64 (`tests/inference`).

Invariants checked by `tests/unit/attention/backends/test_differential.py`: causality; finite forward/backward; SDPA ==
math in
fp64 (outputs, input and parameter gradients); the module equals an independent per-position loop of the equations
above; lambda = 0 reduces each head to standard softmax attention (`causal_attention`), and q2 = q1, k2 = k1 gives
(1 - lambda) x standard; parameter count == standard + n_layer * 6 hs; lambda_init 0.2, 0.356, 0.471 at depths
0, 1, 2; lambda stays fp32 under bf16 autocast; odd n_head is refused; both paths compile with fullgraph=True
(no graph breaks, no host syncs); a tiny GPT learns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions, QKWeight, QKWeights
from lightning_cqk.attention.cache import LayerCache
from lightning_cqk.attention.kernels.functional import attention_probs, causal_logits, masked_logits
from lightning_cqk.attention.kernels.matched_norm import MatchedRMSNorm
from lightning_cqk.attention.transform import build_transform, check_transform, qk_stage, transform_flops

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig

#: eps of the per-head RMSNorm ("subln") in the official code.
SUBLN_EPS = 1e-5
#: std of the N(0, std) init of the four lambda vectors in the official code.
LAMBDA_INIT_STD = 0.1


def lambda_init_schedule(depth: int) -> float:
    """lambda_init = 0.8 - 0.6 exp(-0.3 depth) with the 0-based layer index `depth` (paper §2.1, official code)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


@dataclass
class DifferentialOptions(AttentionOptions):
    """Options of `differential`.

    Attributes:
        qk_norm: per-half-head RMSNorm with a learned gain on q and k, before RoPE (QK-norm baseline).
        lambda_init: None for the depth schedule 0.8 - 0.6 exp(-0.3 depth); a float in [0, 1) for a constant.
        n_kv_groups: the baseline's K/V head count (even, divides n_head); None: n_head (no grouping).
        qk_transform: learned q/k transform on every half-head pair (q1, k1) and (q2, k2), `transform.py`; None.
    """

    qk_norm: bool = False
    lambda_init: float | None = None
    n_kv_groups: int | None = None
    qk_transform: dict | None = None


class DifferentialAttention(AttentionBackend):
    """Differential attention V1: nh/2 heads, each the difference of two softmax maps applied to a 2 hs value.

    Attributes:
        q_proj: C -> C, read as nh half-heads of hs (pairs (2i, 2i+1) form differential head i).
        k_proj: C -> nkv hs, read as nkv key half-heads of hs (nkv = n_kv_groups, default nh).
        v_proj: C -> nkv hs, read as nkv/2 value heads of 2 hs.
        out_proj: C -> C.
        lambda_q1, lambda_k1, lambda_q2, lambda_k2: (hs,) re-parameterisation vectors of lambda (one set per layer).
        subln: RMSNorm over 2 hs, applied to every head's output.
        lambda_init: the constant of this layer (float).
    """

    name = "differential"
    Options = DifferentialOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: DifferentialOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, self.head_size = config.n_embd, config.head_size
        self.n_half_head = config.n_head  # q/k half-heads of hs
        self.n_diff_head = config.n_head // 2  # differential heads, each with a value of 2 hs
        self.n_kv_half_head = options.n_kv_groups or config.n_head  # key half-heads (value heads: half of it)
        self.n_rep = self.n_half_head // self.n_kv_half_head
        self.q_proj = nn.Linear(C, C, bias=config.bias)
        self.k_proj = nn.Linear(C, self.n_kv_half_head * self.head_size, bias=config.bias)
        self.v_proj = nn.Linear(C, self.n_kv_half_head * self.head_size, bias=config.bias)
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        if options.qk_norm:
            self.q_norm = MatchedRMSNorm(self.head_size, eps=config.norm_eps)
            self.k_norm = MatchedRMSNorm(self.head_size, eps=config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qk_transform = build_transform(options.qk_transform, config, layer_idx, config.n_head, self.head_size)
        self.lambda_init = lambda_init_schedule(layer_idx) if options.lambda_init is None else options.lambda_init
        # fp32 parameters; lambda_value() also computes in (at least) fp32, so bf16 autocast never touches lambda.
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_size, dtype=torch.float32))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_size, dtype=torch.float32))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_size, dtype=torch.float32))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_size, dtype=torch.float32))
        self.subln = nn.RMSNorm(2 * self.head_size, eps=SUBLN_EPS)
        self.attn_dropout = config.attn_dropout_p
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)
        self.reset_backend_parameters()

    def reset_backend_parameters(self) -> None:
        """lambda vectors ~ N(0, 0.1) and the head-norm gain = 1, as the official code."""
        with torch.no_grad():
            for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
                p.normal_(0.0, LAMBDA_INIT_STD)
            self.subln.reset_parameters()
        if self.qk_transform is not None:
            self.qk_transform.reset_parameters()

    def lambda_value(self) -> torch.Tensor:
        """This layer's lambda as a 0-dim tensor in fp32 (fp64 for fp64 parameters); no host sync."""
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        # Elementwise product + sum rather than a dot: autocast would run a matmul-type op in bf16.
        dot1 = (self.lambda_q1.to(dtype) * self.lambda_k1.to(dtype)).sum()
        dot2 = (self.lambda_q2.to(dtype) * self.lambda_k2.to(dtype)).sum()
        return torch.exp(dot1) - torch.exp(dot2) + self.lambda_init

    def dynamics_stats(self) -> dict[str, torch.Tensor]:
        """Quantities to log per layer: {"lambda": 0-dim fp32 tensor}, detached, still on the device."""
        stats = {} if self.qk_transform is None else self.qk_transform.stats()
        return {"lambda": self.lambda_value().detach(), **stats}

    def qk_weights(self) -> QKWeights:
        """q_proj and k_proj, one row block per half-head (each of a head's two softmax maps is a q.k map)."""
        return QKWeights(
            "mha", (QKWeight("q_proj", "q", self.n_half_head), QKWeight("k_proj", "k", self.n_kv_half_head))
        )

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, nh, T, hs) and k (B, nkv, T, hs) as half-heads, v (B, nkv/2, T, 2 hs) from x (B, T, C)."""
        B, T, _ = x.shape
        nkv = self.n_kv_half_head
        q = self.q_proj(x).view(B, T, self.n_half_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, nkv, self.head_size).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, nkv // 2, 2 * self.head_size).transpose(1, 2)  # (B, nkv/2, T, 2hs)
        return q, k, v

    def expand_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Grouped K/V heads to one per query: k (B, nkv, T, hs) -> (B, nh, T, hs), v (B, nkv/2, T, 2hs) ->
        (B, nh/2, T, 2hs), each head repeated n_rep times in place (the official `repeat_kv`); no-op without groups."""
        if self.n_rep == 1:
            return k, v
        if k.size(1) != self.n_half_head:  # (the q/k stage already paired each query half-head with its key)
            k = k.repeat_interleave(self.n_rep, dim=1)
        return k, v.repeat_interleave(self.n_rep, dim=1)

    def transform_qk(
        self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The q/k stage (`transform.qk_stage`: QK-norm, learned transform, RoPE) on every hs-wide half-head."""
        return qk_stage(q, k, ctx, q_norm=self.q_norm, k_norm=self.k_norm, transform=self.qk_transform)

    def differential_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lam: torch.Tensor,
        decoding: bool = False,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(softmax(q1 k1^T/sqrt(hs)) - lam softmax(q2 k2^T/sqrt(hs))) v per head, before the head norm.

        Args:
            q, k: (B, nh, T, hs) half-heads; heads (2i, 2i+1) are (q1, q2) / (k1, k2) of differential head i. In decode
                mode k holds the L cached-plus-new keys, (B, nh, L, hs).
            v: (B, nh/2, T or L, 2 hs).
            lam: 0-dim lambda.
            decoding: False: causal masking (training, T == L); True: the decode mask `mask` (`AttentionContext.
                attn_mask`: broadcastable to (B, 1, T, L), True = allowed; None = every key).

        Returns:
            (B, nh/2, T, 2 hs).
        """
        dropout_p = self.attn_dropout if self.training else 0.0
        if decoding:
            dropout_p = 0.0
        if self.options.impl == "sdpa":
            # q, k zero-padded from hs to 2 hs: (q1|0).(k1|0) = q1.k1, so each map is one fused SDPA call against
            # the whole 2 hs value, with the scale of hs given explicitly (equal head sizes keep the fused kernel).
            hs = self.head_size
            q1, q2 = F.pad(q, (0, hs)).unflatten(1, (-1, 2)).unbind(2)  # (B, nh/2, T, 2hs) each
            k1, k2 = F.pad(k, (0, hs)).unflatten(1, (-1, 2)).unbind(2)  # (B, nh/2, T, 2hs) each
            scale = hs**-0.5

            def sdpa(qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
                if decoding:  # (a cache kept wider than autocast's q is cast to it)
                    ki, vi = ki.to(qi.dtype), v.to(qi.dtype)
                    return F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale)
                return F.scaled_dot_product_attention(qi, ki, v, is_causal=True, dropout_p=dropout_p, scale=scale)

            return torch.addcmul(sdpa(q1, k1), lam.to(v.dtype), sdpa(q2, k2), value=-1.0)  # (B, nh/2, T, 2hs)
        if self.options.impl == "math":
            # (B, nh, T, T or L), fp32 (fp64 for fp64 inputs), each map masked and softmaxed
            probs = masked_logits(q, k, mask).softmax(dim=-1) if decoding else attention_probs(q, k)
            if dropout_p > 0.0:
                probs = F.dropout(probs, p=dropout_p)
            p1, p2 = probs.unflatten(1, (-1, 2)).unbind(2)  # (B, nh/2, T, T) each
            attn = p1 - lam.to(probs.dtype) * p2  # (B, nh/2, T, T), rows sum to 1 - lam
            return (attn.to(v.dtype) @ v).to(q.dtype)  # (B, nh/2, T, 2hs)
        raise ValueError(f"Unknown attention impl {self.options.impl!r}; choose 'sdpa' or 'math'.")

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        decoding: bool = False,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Differential attention then per-head RMSNorm x (1 - lambda_init): (B, nh/2, T, 2 hs). `decoding`, `mask`:
        as `differential_attend`."""
        y = self.differential_attend(q, k, v, self.lambda_value(), decoding, mask)  # (B, nh/2, T, 2hs)
        # The norm runs in (at least) fp32 even under bf16 autocast (docs/papers.md §6 item 16).
        y32 = y.to(torch.promote_types(y.dtype, torch.float32))  # (B, nh/2, T, 2hs)
        # (1 - lambda_init) folds into the (2hs,) gain: one full-size multiply fewer, forward and backward.
        gain = self.subln.weight.to(y32.dtype) * (1.0 - self.lambda_init)  # (2hs,)
        return F.rms_norm(y32, (2 * self.head_size,), gain, self.subln.eps).to(y.dtype)  # (B, nh/2, T, 2hs)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache:
        """The KV cache: the nkv key half-heads after QK-norm and RoPE, "k" (B, nkv, max_len, hs), and the nkv/2 values
        of 2 hs, "v"; with a learned q/k transform the transformed keys of every query half-head (nh of them, a key's
        transform needs its own token's q). Grouped heads are cached once (expanded when attending)."""
        n_keys = self.n_half_head if self.qk_transform is not None else self.n_kv_half_head
        buffers = {"k": (n_keys, self.head_size), "v": (self.n_kv_half_head // 2, 2 * self.head_size)}
        return LayerCache(batch_size, max_len, device, dtype, buffers=buffers)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.project(x)  # q (B, nh, T, hs); k (B, nkv, T, hs); v (B, nkv/2, T, 2hs)
        q, k = self.transform_qk(q, k, ctx)  # q (B, nh, T, hs); k (B, nkv, T, hs), (B, nh, T, hs) with a transform
        if ctx.decoding:  # keys and values of every held token (L = cache.length + T)
            k, v = ctx.cache.append(k=k, v=v).values()  # k (B, nkv or nh, L, hs); v (B, nkv/2, L, 2hs)
        k, v = self.expand_kv(k, v)  # k (B, nh, T or L, hs); v (B, nh/2, T or L, 2hs)
        y = self.attend(q, k, v, ctx.decoding, ctx.attn_mask)  # (B, nh/2, T, 2hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.out_proj(y))  # (B, T, C)

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Logits of the nh half-head softmax maps (q1 k1^T and q2 k2^T of every differential head, interleaved as
        heads (2i, 2i+1)), / sqrt(hs): (B, nh, T, T) fp32. Each is a proper softmax map; their difference is not."""
        q, k, v = self.project(x)  # q (B, nh, T, hs); k (B, nkv, T, hs)
        q, k = self.transform_qk(q, k, ctx)
        k, _ = self.expand_kv(k, v)  # (B, nh, T, hs)
        return causal_logits(q, k)  # (B, nh, T, T)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: DifferentialOptions) -> None:
        if config.n_head % 2:
            raise ValueError(
                f"differential attention pairs heads: n_head={config.n_head} is the baseline Transformer's head count "
                f"and the backend uses n_head/2 differential heads (two q/k half-heads of n_embd/n_head each), so "
                f"n_head must be even. Set n_head to {max(2, config.n_head - 1)} or {config.n_head + 1} (with "
                f"n_embd divisible by it)."
            )
        if options.impl not in ("sdpa", "math"):
            raise ValueError(f"impl={options.impl!r} is not available for differential; choose 'sdpa' or 'math'.")
        lam = options.lambda_init
        if lam is not None and (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= lam < 1.0):
            raise ValueError(
                f"lambda_init={lam!r} must be null (the depth schedule 0.8 - 0.6 exp(-0.3 depth)) or a number in "
                "[0, 1): heads are scaled by 1 - lambda_init, which must stay positive (the paper tries 0.8 and 0.5)."
            )
        groups, nh = options.n_kv_groups, config.n_head
        if groups is not None:
            valid = [g for g in range(2, nh + 1, 2) if nh % g == 0]
            if isinstance(groups, bool) or not isinstance(groups, int) or groups not in valid:
                raise ValueError(
                    f"differential n_kv_groups={groups!r} must be null (n_head={nh}, no grouping) or the baseline's "
                    f"K/V head count: even (each differential K/V head has two key half-heads) and a divisor of "
                    f"n_head; choose among {valid}."
                )
        where = f"attention {cls.name!r} (layer {layer_idx})"
        check_transform(options.qk_transform, config, layer_idx, config.n_head, config.head_size, where, False)

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: DifferentialOptions, seq_len: int) -> int:
        C = config.n_embd
        kv_width = (options.n_kv_groups or config.n_head) * config.head_size
        projections = 2 * 2 * C * C + 2 * 2 * C * kv_width  # q, out; k, v
        # nh score maps of hs (2 T C), then (A1 - lambda A2) @ v over nh/2 heads of 2 hs (2 T C): as standard.
        scores_and_values = 2 * 2 * seq_len * C
        return projections + scores_and_values + transform_flops(options.qk_transform, config.n_head, config.head_size)

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: DifferentialOptions) -> int:
        nkv_width = (options.n_kv_groups or config.n_head) * config.head_size
        if options.qk_transform is not None:
            # The transformed keys, one per query half-head (a key's transform needs its own token's q), and the
            # grouped values.
            return config.n_embd + nkv_width
        return 2 * nkv_width  # k and v, nkv hs each
