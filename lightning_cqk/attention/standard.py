"""Standard causal multi-head self-attention (Vaswani et al. 2017, "Attention Is All You Need", eq. 1).

    q = x W_Q,  k = x W_K,  v = x W_V                       (B, T, C) -> (B, nh, T, hs) each
    q, k = RMSNorm(q), RMSNorm(k)                            optional `qk_norm` (per head, learned gain)
    q, k = RoPE(q), RoPE(k)                                  when config.position == "rope"
    y = softmax(q k^T / sqrt(hs) + causal mask) v W_O        (B, T, C)

This is the baseline every other backend is compared with and, in its `impl="math"` form, the reference they are
tested against. Tests: SDPA == math in fp64 (forward and backward), causality (future tokens never change past
outputs), parameter count 4 C^2 (+ 4 C biases, + 2 hs norm gains with qk_norm).

Subclasses reuse the three stages of `forward`: `project` (x -> per-head q, k, v), `transform_qk` (norm and
position encoding of q and k; variants that evolve q and k hook in here) and `attend` (the score/softmax/value
product).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.functional import causal_attention
from lightning_cqk.attention.rope import apply_rope

if TYPE_CHECKING:
    from lightning_cqk.config import ModelConfig


@dataclass
class StandardOptions(AttentionOptions):
    """Options of `standard` (and of the backends derived from it).

    Attributes:
        qk_norm: RMSNorm with a learned gain on each head's q and k (before RoPE), the QK-norm baseline of
            arXiv 2511.21377 (Qwen3 placement).
    """

    qk_norm: bool = False


class StandardAttention(AttentionBackend):
    """Multi-head softmax attention with separate Q, K, V and output projections."""

    name = "standard"
    Options = StandardOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: StandardOptions) -> None:
        super().__init__(config, layer_idx, options)
        C, self.n_head, self.head_size = config.n_embd, config.n_head, config.head_size
        self.q_proj = nn.Linear(C, C, bias=config.bias)
        self.k_proj = nn.Linear(C, C, bias=config.bias)
        self.v_proj = nn.Linear(C, C, bias=config.bias)
        self.out_proj = nn.Linear(C, C, bias=config.bias)
        if options.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_size, eps=config.norm_eps)
            self.k_norm = nn.RMSNorm(self.head_size, eps=config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, n * hs) -> (B, n, T, hs)."""
        B, T, _ = t.shape
        return t.view(B, T, -1, self.head_size).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, n, T, hs) -> (B, T, n * hs)."""
        B, _, T, _ = t.shape
        return t.transpose(1, 2).reshape(B, T, -1)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head q, k, v from x (B, T, C): each (B, nh, T, hs)."""
        q = self.split_heads(self.q_proj(x))  # (B, nh, T, hs)
        k = self.split_heads(self.k_proj(x))  # (B, nh, T, hs)
        v = self.split_heads(self.v_proj(x))  # (B, nh, T, hs)
        return q, k, v

    def transform_qk(
        self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm (optional) then RoPE, on (B, n, T, hs) tensors."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax attention per head: (B, nh, T, hs) -> (B, nh, T, hs)."""
        dropout_p = self.attn_dropout if self.training else 0.0
        return causal_attention(q, k, v, impl=self.options.impl, dropout_p=dropout_p)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v = self.project(x)  # (B, nh, T, hs) each
        q, k = self.transform_qk(q, k, ctx)  # (B, nh, T, hs) each
        y = self.attend(q, k, v)  # (B, nh, T, hs)
        return self.resid_dropout(self.out_proj(self.merge_heads(y)))  # (B, T, C)

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: StandardOptions, seq_len: int) -> int:
        C = config.n_embd
        projections = 4 * 2 * C * C  # q, k, v, out
        scores_and_values = 2 * 2 * seq_len * C  # q.k over seq_len keys, then probs @ v, summed over heads
        return projections + scores_and_values
