"""Sigmoid attention: each key's weight is an independent sigmoid, not a share of a softmax (arXiv 2409.04431).

Ramapuram et al., "Theory, Analysis, and Best Practices for Sigmoid Self-Attention" (2024), eq. 2:

    SigmoidAttn(X) = sigma(Q K^T / sqrt(d_qk) + b) V,        b = -log(n)

with the scalar bias b = -log(n) (their Section 3.2 and Table 1: the bias that keeps the early attention norm near a
softmax's, n the sequence length). Here n is the model's context length (block_size), a constant, so that a token's
output never depends on how many tokens follow it (causality) and decoding with a cache equals the full forward.
Future keys get weight 0 (not sigma(-inf) of a score: the mask is applied to the weights). RoPE rotates q and k when
the model uses it. There is no fused kernel: `impl` "sdpa" and "math" run the same explicit path (check-backend says
so: "one path only").

Decode cache: k (after RoPE) and v of every head, 2 C values per token, as standard attention's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from lightning_cqk.attention import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.cache import LayerCache
from lightning_cqk.attention.rope import apply_rope


@dataclass
class SigmoidOptions(AttentionOptions):
    """Options of sigmoid attention.

    Attributes:
        bias: the scalar b added to every score; None (default): the paper's -log(n), n = block_size.
    """

    bias: float | None = None


class SigmoidAttention(AttentionBackend):
    """Causal multi-head sigmoid attention (module docstring): fused q/k/v projection, RoPE, sigma(scores + b) V."""

    name = "sigmoid"
    Options = SigmoidOptions

    def __init__(self, config, layer_idx: int, options: SigmoidOptions) -> None:
        super().__init__(config, layer_idx, options)
        C = config.n_embd
        self.n_head, self.head_size = config.n_head, config.head_size
        self.qkv = nn.Linear(C, 3 * C, bias=config.bias)
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        self.bias = -math.log(config.block_size) if options.bias is None else float(options.bias)
        self.attn_dropout = nn.Dropout(config.attn_dropout_p)
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """(B, T, C) -> (B, T, C); in decode mode the new tokens attend over the cache (`ctx.cache`)."""
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        q, k = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)  # (B, nh, T, hs) each
        if ctx.cache is not None:
            k, v = ctx.cache.append(k=k, v=v).values()  # (B, nh, L, hs) each, L = cached + T
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size) + self.bias  # (B, nh, T, L)
        if ctx.decoding:
            visible = ctx.attn_mask  # broadcastable to (B, 1, T, L); None: every key is visible
        else:
            visible = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
        weights = torch.sigmoid(scores)  # (B, nh, T, L)
        if visible is not None:
            weights = weights.masked_fill(~visible, 0.0)
        y = self.attn_dropout(weights) @ v  # (B, nh, T, hs)
        return self.resid_dropout(self.out_proj(y.transpose(1, 2).reshape(B, T, C)))  # (B, T, C)

    def new_cache(self, batch_size: int, max_len: int, device, dtype) -> LayerCache:
        """k (after RoPE) and v of every head: (B, nh, max_len, hs) each."""
        shape = (self.n_head, self.head_size)
        return LayerCache(batch_size, max_len, device, dtype, buffers={"k": shape, "v": shape})

    @classmethod
    def forward_flops_per_token(cls, config, options: SigmoidOptions, seq_len: int) -> int:
        """q/k/v and output projections (2 x 4 C^2) plus the score and value products over seq_len keys (2 x 2 C n)."""
        C = config.n_embd
        return 2 * 4 * C * C + 2 * 2 * C * seq_len
