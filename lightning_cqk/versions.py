"""The torch version each shipped feature needs, checked when a run is configured (before any step).

pyproject.toml asks for torch>=2.9, which covers every feature below; an older torch still gets installed on cluster
images that pin it (or with --no-deps), and would fail late with an AttributeError or TypeError. `check_torch_features`
refuses at construction instead, naming the feature, the version it needs and the one found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lightning_cqk.errors import ConfigError

if TYPE_CHECKING:
    from lightning_cqk.config import ModelConfig
    from lightning_cqk.optim import OptimConfig

#: feature -> (the first torch release that has it, what it is in torch)
FEATURES: dict[str, tuple[tuple[int, int], str]] = {
    "muon": ((2, 9), "torch.optim.Muon (model.optim.name: muon)"),
    "gqa": ((2, 5), "scaled_dot_product_attention(enable_gqa=...) (grouped K/V heads: n_kv_groups < n_head)"),
    "fsdp2": ((2, 6), "torch.distributed.fsdp.fully_shard (FSDP2, ModelParallelStrategy)"),
    "framework": ((2, 9), "the framework as tested (pyproject.toml: torch>=2.9)"),
}


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch ("2.13.0+cpu" -> (2, 13))."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def require_torch(feature: str) -> None:
    """Raise ConfigError when the installed torch is older than `feature` needs (see FEATURES)."""
    needed, what = FEATURES[feature]
    found = torch_version()
    if found < needed:
        raise ConfigError(
            f"{what} needs torch>={needed[0]}.{needed[1]}, but torch {torch.__version__} is installed. Install a newer "
            f"torch (pip install 'torch>={needed[0]}.{needed[1]}'), or turn the feature off."
        )


def uses_grouped_heads(config: ModelConfig) -> bool:
    """True when some layer has fewer K/V heads than query heads (SDPA's enable_gqa)."""
    overrides = [o if isinstance(o, dict) else vars(o) for o in config.layer_overrides]
    specs = [config.attention_options, *(o.get("attention_options") for o in overrides)]
    return any(isinstance(s, dict) and s.get("n_kv_groups") not in (None, config.n_head) for s in specs)


def check_torch_features(config: ModelConfig, optim: OptimConfig) -> None:
    """Refuse, at configuration, a feature the installed torch lacks (Muon, grouped K/V heads)."""
    if optim.name == "muon":
        require_torch("muon")
    if uses_grouped_heads(config):
        require_torch("gqa")
