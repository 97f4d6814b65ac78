"""Attention backends, found by name.

The registry is the explicit tuple below: adding a backend means writing one file with an `AttentionBackend`
subclass and listing it here. Everything else (config validation, the transformer block, the CLI) goes through
`available()`, `get_attention()` and `build_attention()`, never through if/else on the name.

    >>> from lightning_cqk import attention
    >>> attention.available()  # doctest: +NORMALIZE_WHITESPACE
    ['approximate', 'coupled', 'differential', 'fixed_seq_qk', 'mla', 'mlp', 'non_approximate', 'rnd_emb_qk',
     'standard', 'static_emb_qk', 'uncoupled_mlp']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.coupled import CoupledAttention, UncoupledMLPAttention
from lightning_cqk.attention.deconstructed_mixing import (
    ApproximateAttention,
    DeconMLPAttention,
    NonApproximateAttention,
)
from lightning_cqk.attention.deconstructed_qk import FixedSeqQKAttention, RndEmbQKAttention, StaticEmbQKAttention
from lightning_cqk.attention.differential import DifferentialAttention
from lightning_cqk.attention.mla import MultiHeadLatentAttention
from lightning_cqk.attention.standard import StandardAttention
from lightning_cqk.errors import ConfigError

if TYPE_CHECKING:
    from lightning_cqk.config import ModelConfig

_BACKENDS: tuple[type[AttentionBackend], ...] = (
    StandardAttention,
    CoupledAttention,
    UncoupledMLPAttention,
    DifferentialAttention,
    MultiHeadLatentAttention,
    DeconMLPAttention,
    ApproximateAttention,
    NonApproximateAttention,
    RndEmbQKAttention,
    FixedSeqQKAttention,
    StaticEmbQKAttention,
)

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {cls.name: cls for cls in _BACKENDS}


def available() -> list[str]:
    """Sorted names of all registered attention backends."""
    return sorted(ATTENTION_BACKENDS)


def get_attention(name: str) -> type[AttentionBackend]:
    """The backend class registered under `name`; a clear error listing the choices otherwise."""
    try:
        return ATTENTION_BACKENDS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(str(name), available(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"Unknown attention backend {name!r}.{hint} Available backends: {', '.join(available())}."
        ) from None


def validate_attention(name: str, options: dict[str, Any], config: ModelConfig, layer_idx: int) -> None:
    """Check a backend name and its options at config time (no tensors are allocated)."""
    cls = get_attention(name)
    cls.check_config(config, layer_idx, cls.parse_options(options))


def build_attention(config: ModelConfig, layer_idx: int) -> AttentionBackend:
    """Instantiate the backend that `config` assigns to block `layer_idx`."""
    name, options = config.attention_for_layer(layer_idx)
    cls = get_attention(name)
    return cls(config, layer_idx, cls.parse_options(options))


__all__ = [
    "ATTENTION_BACKENDS",
    "ApproximateAttention",
    "AttentionBackend",
    "AttentionContext",
    "AttentionOptions",
    "CoupledAttention",
    "DeconMLPAttention",
    "DifferentialAttention",
    "FixedSeqQKAttention",
    "MultiHeadLatentAttention",
    "NonApproximateAttention",
    "RndEmbQKAttention",
    "StandardAttention",
    "StaticEmbQKAttention",
    "UncoupledMLPAttention",
    "available",
    "build_attention",
    "get_attention",
    "validate_attention",
]
