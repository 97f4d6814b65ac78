"""Attention backends, found by name (`registry.py`: built-ins, installed plugins, `package.module:Class` paths).

A backend declares its name once, in its class (``name = "..."``); the registry finds every built-in by walking this
package, and plugins through the entry-point group `lightning_cqk.attention`. Everything else (config validation, the
transformer block, the CLI) goes through `available()`, `get_attention()` and `build_attention()`, never through
if/else on the name.

Public API (documented in docs/your-attention.md, changed only compatibly): `AttentionBackend`, its options base
`AttentionOptions` (a backend's `Options`), `AttentionContext`, and the functions below.

    >>> from lightning_cqk import attention
    >>> "standard" in attention.available() and attention.get_attention("standard").name
    'standard'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_cqk.attention.base import AttentionBackend, AttentionContext, AttentionOptions
from lightning_cqk.attention.registry import ATTENTION, recorded_by

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig


def available(plugins: bool = True) -> list[str]:
    """Sorted names of the built-in backends and (with `plugins`) of the installed plugins'."""
    return ATTENTION.names(plugins)


def get_attention(name: str) -> type[AttentionBackend]:
    """The backend class a registered name or `package.module:Class` path stands for; a one-paragraph ConfigError
    otherwise (unknown name with did-you-mean, a module that does not import, not a subclass, a clash)."""
    return ATTENTION.resolve(name)


def validate_attention(name: str, options: dict[str, Any], config: ModelConfig, layer_idx: int) -> None:
    """Check a backend name and its options at config time (no tensors are allocated)."""
    cls = get_attention(name)
    cls.check_config(config, layer_idx, cls.parse_options(options))


def build_attention(config: ModelConfig, layer_idx: int) -> AttentionBackend:
    """Instantiate the backend that `config` assigns to block `layer_idx`."""
    name, options = config.attention_for_layer(layer_idx)
    cls = get_attention(name)
    return cls(config, layer_idx, cls.parse_options(options))


def __getattr__(attr: str) -> Any:
    """`ATTENTION_BACKENDS` (name -> built-in class) and the built-in classes by their class names, found lazily."""
    if attr == "ATTENTION_BACKENDS":
        return ATTENTION.builtins
    for cls in ATTENTION.builtins.values():
        if cls.__name__ == attr:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = [  # the public API; built-in classes are reached by attribute (see __getattr__), not listed
    "AttentionBackend",
    "AttentionContext",
    "AttentionOptions",
    "available",
    "build_attention",
    "get_attention",
    "recorded_by",
    "validate_attention",
]
