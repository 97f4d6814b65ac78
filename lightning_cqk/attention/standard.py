"""Standard causal multi-head self-attention (Vaswani et al. 2017, "Attention Is All You Need", eq. 1).

    q = x W_Q,  k = x W_K,  v = x W_V                       (B, T, C) -> (B, nh, T, hs) each
    q, k = RoPE(q), RoPE(k)                                  when config.position == "rope"
    y = softmax(q k^T / sqrt(hs) + causal mask) v W_O        (B, T, C)

This is the baseline every other backend is compared with and, in its `impl="math"` form, the reference they are
tested against. Tests: SDPA == math in fp64, causality (future tokens never change past outputs), parameter count
4 C^2 (+ 4 C biases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.functional import causal_attention
from lightning_cqk.attention.rope import apply_rope

if TYPE_CHECKING:
    from lightning_cqk.config import ModelConfig


class StandardAttention(AttentionBackend):
    """Multi-head softmax attention with separate Q, K, V and output projections."""

    name = "standard"
    Options = AttentionOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: AttentionOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, self.n_head, self.head_size = config.n_embd, config.n_head, config.head_size
        self.q_proj = nn.Linear(C, C, bias=config.bias)
        self.k_proj = nn.Linear(C, C, bias=config.bias)
        self.v_proj = nn.Linear(C, C, bias=config.bias)
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, nh * hs) -> (B, nh, T, hs)."""
        B, T, _ = t.shape
        return t.view(B, T, -1, self.head_size).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, nh, T, hs) -> (B, T, nh * hs)."""
        B, _, T, _ = t.shape
        return t.transpose(1, 2).reshape(B, T, -1)

    def project_qkv(self, x: torch.Tensor, ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Head-split, rotated q, k and v, each (B, nh, T, hs)."""
        q = self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
        k = self.split_heads(self.k_proj(x))  # (B, nh, T, hs)
        v = self.split_heads(self.v_proj(x))  # (B, nh, T, hs)
        return apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin), v

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v = self.project_qkv(x, ctx)  # (B, nh, T, hs) each
        dropout_p = self.attn_dropout if self.training else 0.0
        y = causal_attention(q, k, v, impl=self.options.impl, dropout_p=dropout_p)  # (B, nh, T, hs)
        return self.resid_dropout(self.out_proj(self.merge_heads(y)))  # (B, T, C)
