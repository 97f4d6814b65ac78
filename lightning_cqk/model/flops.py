"""Analytic FLOPs, accounting for each layer's attention backend.

Convention: 2 FLOPs per multiply-add of every matmul; attention scores and value products counted over all
`seq_len` keys (causal masking not credited, as fused kernels count them); elementwise work ignored; training =
3 x forward (backward costs twice the forward). FLOPs count what the model requires, not what a particular kernel
executes (e.g. recomputation, or the differential fast path's duplicated score maps, are not credited), so a budget
does not change with `impl`. Used for compute-matched budgets and MFU.

Most work scales with the tokens of a batch (`forward_flops_per_token`). Backends with a fixed reference stream
(`uses_reference_stream`, e.g. `rnd_emb_qk`) also run that stream once per step whatever the batch size
(`forward_flops_per_step`); `training_flops_per_batch` adds both.
"""

from __future__ import annotations

from lightning_cqk.attention import get_attention
from lightning_cqk.attention.backends.standard import StandardAttention
from lightning_cqk.attention.registry import label
from lightning_cqk.errors import ConfigError
from lightning_cqk.model_config import ModelConfig

MLP_MATRICES = {"gelu": 2, "swiglu": 3}


def _backend_flops(cls, config: ModelConfig, options, seq_len: int) -> int:
    """`cls.forward_flops_per_token`, or a ConfigError saying why a run needs it (a plugin may leave it out)."""
    try:
        return cls.forward_flops_per_token(config, options, seq_len)
    except NotImplementedError:
        raise ConfigError(
            f"The attention backend {label(cls)!r} does not define forward_flops_per_token, which training needs "
            "(token budgets, compute-matched runs, throughput in FLOPs): define it as the analytic forward matmul "
            "FLOPs per token of one layer (docs/your-attention.md; `lightning_cqk check-backend` checks it against a "
            "FLOP counter)."
        ) from None


def _layer_backends(config: ModelConfig):
    for layer_idx in range(config.n_layer):
        name, options = config.attention_for_layer(layer_idx)
        cls = get_attention(name)
        yield cls, cls.parse_options(options)


def _mlp_flops(config: ModelConfig) -> int:
    return MLP_MATRICES[config.ffn] * 2 * config.n_embd * config.mlp_hidden


def forward_flops_per_token(config: ModelConfig, seq_len: int | None = None) -> int:
    """Forward FLOPs per token of the whole model (attention + MLP per layer, and the output head)."""
    seq_len = config.block_size if seq_len is None else seq_len
    total = 2 * config.n_embd * config.padded_vocab_size  # lm_head
    for cls, options in _layer_backends(config):
        total += _backend_flops(cls, config, options, seq_len) + _mlp_flops(config)
    return total


def forward_flops_per_step(config: ModelConfig) -> int:
    """Forward FLOPs done once per step whatever the batch size: the fixed reference stream, if any.

    The stream (length L, batch 1) passes through every block below the last layer that reads it; there, a reading
    layer acts as standard attention on the stream. Each reading layer also projects the stream to its q and k.
    """
    backends = list(_layer_backends(config))
    readers = [i for i, (cls, _) in enumerate(backends) if cls.uses_reference_stream]
    if not readers:
        return 0
    cls, options = backends[readers[0]]
    L = cls.reference_length(config, options)
    C = config.n_embd
    total = 0
    for i in range(readers[-1]):
        layer_cls, layer_options = backends[i]
        if layer_cls.uses_reference_stream:
            attn = StandardAttention.forward_flops_per_token(config, StandardAttention.Options(), L)
        else:
            attn = _backend_flops(layer_cls, config, layer_options, L)
        total += L * (attn + _mlp_flops(config))
    return total + len(readers) * L * 2 * 2 * C * C  # q and k projections of the stream in each reading layer


def training_flops_per_token(config: ModelConfig, seq_len: int | None = None) -> int:
    """Forward + backward FLOPs per trained token (3 x forward), excluding per-step work."""
    return 3 * forward_flops_per_token(config, seq_len)


def training_flops_per_batch(config: ModelConfig, batch_size: int, seq_len: int | None = None) -> int:
    """Forward + backward FLOPs of one micro-batch of `batch_size` sequences of `seq_len` tokens."""
    seq_len = config.block_size if seq_len is None else seq_len
    return 3 * (forward_flops_per_token(config, seq_len) * batch_size * seq_len + forward_flops_per_step(config))
