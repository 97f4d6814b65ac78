"""The tiny model a contract check runs on: one `Case` (backend, options, config overrides) -> a seeded fp64 GPT."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_cqk import attention
from lightning_cqk.attention import AttentionBackend
from lightning_cqk.model.gpt import GPT
from lightning_cqk.model_config import ModelConfig

#: The tiny model every case builds (fp64): 2 layers, width 32, 4 heads of 8, a 16-token context.
BASE_CONFIG = dict(n_layer=2, n_head=4, n_embd=32, mlp_hidden=64, block_size=16, vocab_size=61)
B, T, CUT = 2, 12, 7  # batch, tokens, first position changed by the causality checks
TOL = 1e-10  # relative, fast path vs math path and decode vs full forward


@dataclass(frozen=True)
class Case:
    """One case: `backend` (a registered name or `module:Class`) with `options` in every layer, `config` overrides,
    `owner` while its decode path is pending, `name` overriding the generated id."""

    backend: str
    options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None
    name: str = ""

    @property
    def id(self) -> str:
        settings = {**self.options, **self.config}
        return self.name or "-".join([self.backend, *(f"{k}={v}" for k, v in settings.items())])


def model_config(case: Case, **overrides: Any) -> ModelConfig:
    """The tiny model's config for `case` (BASE_CONFIG, the case's overrides, then `overrides`)."""
    settings = {**BASE_CONFIG, **case.config, **overrides}
    return ModelConfig(**settings, attention=case.backend, attention_options=dict(case.options))


def build_model(case: Case, seed: int = 0, dtype: torch.dtype = torch.float64) -> GPT:
    """The tiny GPT of `case` in eval mode and `dtype`, with non-trivial values everywhere (seeded)."""
    torch.manual_seed(seed)
    model = GPT(model_config(case)).to(dtype).eval()
    with torch.no_grad():  # zero-initialised or tiny parameters (gains, last layers) would hide mistakes
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def layer_under_test(model: GPT, case: Case) -> int:
    """The last layer of `model` that runs the case's backend (hybrids mix backends)."""
    cls = attention.get_attention(case.backend)
    return max(i for i, block in enumerate(model.blocks) if type(block.attn) is cls)


def layers_of(model: GPT, case: Case) -> list[AttentionBackend]:
    """Every layer of `model` that runs the case's backend."""
    cls = attention.get_attention(case.backend)
    return [block.attn for block in model.blocks if type(block.attn) is cls]


def layer_inputs(model: GPT, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """x (B, T, C), token embeddings (B, T, C) and a random reference stream (1, block_size, C) per layer."""
    g = torch.Generator().manual_seed(seed)
    C, L = model.config.n_embd, model.config.block_size

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return draw(B, T, C), draw(B, T, C), [draw(1, L, C) for _ in model.blocks]
