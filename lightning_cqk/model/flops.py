"""Analytic FLOPs per token, accounting for each layer's attention backend.

Convention: 2 FLOPs per multiply-add of every matmul; attention scores and value products counted over all
`seq_len` keys (causal masking not credited, as fused kernels and `torch.utils.flop_counter` count them);
elementwise work ignored; training = 3 x forward (backward costs twice the forward). Used for compute-matched
budgets and MFU.
"""

from __future__ import annotations

from lightning_cqk.attention import get_attention
from lightning_cqk.config import ModelConfig

MLP_MATRICES = {"gelu": 2, "swiglu": 3}


def forward_flops_per_token(config: ModelConfig, seq_len: int | None = None) -> int:
    """Forward FLOPs per token of the whole model (attention + MLP per layer, and the output head)."""
    seq_len = config.block_size if seq_len is None else seq_len
    total = 2 * config.n_embd * config.vocab_size  # lm_head
    mlp = MLP_MATRICES[config.mlp] * 2 * config.n_embd * config.mlp_hidden
    for layer_idx in range(config.n_layer):
        name, options = config.attention_for_layer(layer_idx)
        cls = get_attention(name)
        total += cls.forward_flops_per_token(config, cls.parse_options(options), seq_len) + mlp
    return total


def training_flops_per_token(config: ModelConfig, seq_len: int | None = None) -> int:
    """Forward + backward FLOPs per trained token (3 x forward)."""
    return 3 * forward_flops_per_token(config, seq_len)
