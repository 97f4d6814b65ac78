"""Causal scaled-dot-product attention: a fused fast path and an explicit reference path.

Both take q (B, nh, T, hs), k (B, nkv, T, hs), v (B, nkv, T, hv) with nh a multiple of nkv (grouped-query
attention; nkv == nh is ordinary multi-head attention) and return (B, nh, T, hv). The math path is the oracle for
tests (fp64 on CPU) and can also return the attention probabilities; the SDPA path is what trains.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, nkv, T, hs) -> (B, nkv * n_rep, T, hs), each key/value head repeated for its query group."""
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)


def causal_mask(t_q: int, t_k: int, device: torch.device) -> torch.Tensor:
    """Boolean (t_q, t_k) mask, True where attention is allowed (key position <= query position)."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def causal_logits(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Scaled scores q k^T * scale (B, nh, T, T) in fp32 (fp64 for fp64 input); masked (future) entries are -inf.

    These are the logits the softmax sees (scale defaults to 1 / sqrt(hs)); k may have fewer (grouped) heads.
    """
    k = repeat_kv(k, q.size(1) // k.size(1))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = (q.to(compute_dtype) @ k.to(compute_dtype).transpose(-2, -1)) * scale  # (B, nh, T, T)
    return scores.masked_fill(~causal_mask(q.size(-2), k.size(-2), q.device), float("-inf"))


def attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention weights (B, nh, T, T), computed in fp32 (or fp64 when the input is fp64)."""
    return causal_logits(q, k, scale).softmax(dim=-1)


def softmax_map_stats(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of causal softmax maps given their logits (..., T, T), masked entries -inf (`causal_logits`).

    Returns 0-dim tensors on the logits' device (no host sync):
        max_logit: the largest |logit| over the unmasked entries (the quantity QK-clip and QuacK control).
        entropy: -sum_j p_ij ln p_ij (nats), averaged over every map and every query row i (row 0 included: it
            attends to one key, entropy 0).
        sink: the weight p_i0 on the first key (the "attention sink"), averaged the same way (row 0 has 1).
    """
    t_q, t_k = logits.shape[-2:]
    allowed = causal_mask(t_q, t_k, logits.device)  # (T, T)
    max_logit = torch.where(allowed, logits.abs(), torch.zeros((), dtype=logits.dtype, device=logits.device)).amax()
    probs = logits.softmax(dim=-1)  # (..., T, T), zeros where masked
    entropy = torch.special.entr(probs).sum(-1).mean()  # entr(0) = 0
    return {"max_logit": max_logit, "entropy": entropy, "sink": probs[..., 0].mean()}


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    impl: str = "sdpa",
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T * scale + causal mask) v, per head. Returns (B, nh, T, hv).

    k may have more heads than v (a learned q/k transform pairs every query head with its grouped key head and
    returns nh keys): v is then repeated to k's heads.
    """
    if v.size(1) != k.size(1):
        v = repeat_kv(v, k.size(1) // v.size(1))  # (B, nk, T, hv)
    n_rep = q.size(1) // k.size(1)
    if impl == "sdpa":
        if n_rep > 1:
            # enable_gqa avoids materialising repeated K/V on kernels that support it.
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p, enable_gqa=True
            )
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p)
    if impl == "math":
        probs = attention_probs(q, k, scale)  # (B, nh, T, T)
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p)
        return (probs.to(v.dtype) @ repeat_kv(v, n_rep)).to(q.dtype)  # (B, nh, T, hv)
    raise ValueError(f"Unknown attention impl {impl!r}; choose 'sdpa' or 'math'.")


def masked_logits(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float | None = None
) -> torch.Tensor:
    """Decode-mode logits: q (B, nh, T, d) against k (B, nk, L, d), nk dividing nh, scaled, in fp32 (fp64 for fp64
    input); entries where the boolean `mask` (broadcastable to (B, 1, T, L), True = allowed) is False are -inf.
    None: every key is allowed. Returns (B, nh, T, L)."""
    k = repeat_kv(k, q.size(1) // k.size(1))  # (B, nh, L, d)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = (q.to(compute_dtype) @ k.to(compute_dtype).transpose(-2, -1)) * scale  # (B, nh, T, L)
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    impl: str = "sdpa",
    scale: float | None = None,
) -> torch.Tensor:
    """Decode-mode softmax(q k^T * scale, masked) v with an explicit boolean mask (`AttentionContext.attn_mask`).

    q (B, nh, T, d), k (B, nk, L, d), v (B, nv, L, hv) with nv | nk | nh (grouped heads repeated as in
    `causal_attention`); mask broadcastable to (B, 1, T, L), True = allowed, None = all keys. Returns (B, nh, T, hv).
    """
    if v.size(1) != k.size(1):
        v = repeat_kv(v, k.size(1) // v.size(1))  # (B, nk, L, hv)
    n_rep = q.size(1) // k.size(1)
    if impl == "sdpa":
        k, v = k.to(q.dtype), v.to(q.dtype)  # a cache kept wider than autocast's q (no-op otherwise)
        if n_rep == 1:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        # Grouped heads: fold each group's n_rep query heads into the query axis (head h = g n_rep + r reads K/V head
        # g), so every kernel runs on the nk cached heads as they are: no repeated K/V, and no fallback to the math
        # kernel that SDPA's enable_gqa takes with an explicit mask on some devices.
        B, nh, T, _ = q.shape
        q_folded = q.reshape(B, k.size(1), n_rep * T, q.size(-1))  # (B, nk, n_rep T, d)
        mask = None if mask is None else mask.repeat(1, 1, n_rep, 1)  # (B or 1, 1, n_rep T, L)
        y = F.scaled_dot_product_attention(q_folded, k, v, attn_mask=mask, scale=scale)  # (B, nk, n_rep T, hv)
        return y.reshape(B, nh, T, v.size(-1))  # (B, nh, T, hv)
    if impl == "math":
        probs = masked_logits(q, k, mask, scale).softmax(dim=-1)  # (B, nh, T, L)
        return (probs.to(v.dtype) @ repeat_kv(v, n_rep)).to(q.dtype)  # (B, nh, T, hv)
    raise ValueError(f"Unknown attention impl {impl!r}; choose 'sdpa' or 'math'.")
