"""Building blocks of the decoder other than attention: norms and MLPs, chosen by name from `ModelConfig`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig


class GeluMLP(nn.Module):
    """GPT-2 MLP: C -> mlp_hidden -> C with a tanh-free GELU."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.out_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.resid_dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.out_proj(F.gelu(self.up_proj(x))))  # (B, T, C)


class SwiGLUMLP(nn.Module):
    """Gated MLP (Shazeer 2020): out(silu(gate(x)) * up(x)), three matrices of C x mlp_hidden."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.up_proj = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.out_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.resid_dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.out_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))  # (B, T, C)


def in_autocast_dtype(x: torch.Tensor) -> torch.Tensor:
    """A norm's output (fp32 under autocast: norms are on autocast's fp32 list) cast once to the autocast dtype.

    Every projection that reads it (q, k and v; SwiGLU's gate and up) would otherwise cast its own bf16 copy and keep
    it for backward: three casts and three saved (B, T, C) copies where one does. The same values reach each matmul
    (autocast would cast the same tensor). Outside autocast (fp32 and the fp64 tests) it returns x itself.
    """
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        if x.dtype != dtype and x.is_floating_point():
            return x.to(dtype)
    return x


NORMS = {
    "layernorm": lambda config: nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias),
    "rmsnorm": lambda config: nn.RMSNorm(config.n_embd, eps=config.norm_eps),
}


def make_norm(config: ModelConfig) -> nn.Module:
    """The configured normalisation over the last dimension C."""
    return NORMS[config.norm](config)


MLPS: dict[str, type[nn.Module]] = {"gelu": GeluMLP, "swiglu": SwiGLUMLP}


def make_mlp(config: ModelConfig) -> nn.Module:
    """The configured MLP."""
    return MLPS[config.ffn](config)
