"""GPT-style decoder with a pluggable attention backend. Torch only: no Lightning imports.

    tokens (B, T) -> embedding (B, T, C) -> n_layer x Block -> final norm -> lm_head -> logits (B, T, vocab)

    Block(x) = x + attn(norm_1(x), ctx);  x + mlp(norm_2(x))          (pre-norm residual blocks)

The attention module of every block comes from `lightning_cqk.attention.build_attention`, so the block never
knows which variant it holds. Initialisation follows GPT-2: N(0, init_std) for linear and embedding weights, zero
biases, and N(0, init_std / sqrt(2 * n_layer)) for the projections that write into the residual stream
(every module attribute named `out_proj`), so the residual variance does not grow with depth.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lightning_cqk.attention import AttentionBackend, AttentionContext, build_attention
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.config import ModelConfig
from lightning_cqk.model.components import make_mlp, make_norm


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual connection."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_1 = make_norm(config)
        self.attn = build_attention(config, layer_idx)
        self.norm_2 = make_norm(config)
        self.mlp = make_mlp(config)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), ctx)  # (B, T, C)
        return x + self.mlp(self.norm_2(x))  # (B, T, C)


class GPT(nn.Module):
    """Decoder-only language model mapping token ids (B, T) to next-token logits (B, T, vocab_size)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.position == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self._share_backend_modules()
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if config.position == "rope":
            cos, sin = build_rope_cache(config.block_size, config.head_size, config.rope_base)
            # Not persistent: derived from the config, so checkpoints do not carry (and cannot disagree on) them.
            self.register_buffer("rope_cos", cos, persistent=False)  # (block_size, hs/2)
            self.register_buffer("rope_sin", sin, persistent=False)  # (block_size, hs/2)
        else:
            self.rope_cos = self.rope_sin = None
        self.reset_parameters()

    def _share_backend_modules(self) -> None:
        """Let each backend class tie modules across the layers that use it (e.g. one dynamics net per model)."""
        by_class: dict[type[AttentionBackend], list[AttentionBackend]] = {}
        for block in self.blocks:
            by_class.setdefault(type(block.attn), []).append(block.attn)
        for cls, backends in by_class.items():
            cls.share_across_layers(backends)

    def reset_parameters(self) -> None:
        """GPT-2 initialisation, then each backend's own init for its special parameters."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        for module in self.modules():
            out_proj = getattr(module, "out_proj", None)
            if isinstance(out_proj, nn.Linear):
                nn.init.normal_(out_proj.weight, mean=0.0, std=residual_std)
        for module in self.modules():
            if isinstance(module, AttentionBackend):
                module.reset_backend_parameters()
        if self.rope_cos is not None:
            cos, sin = build_rope_cache(
                self.config.block_size, self.config.head_size, self.config.rope_base, device=self.rope_cos.device
            )
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def context(self, T: int, embeddings: torch.Tensor) -> AttentionContext:
        """What every block's attention receives besides its input."""
        if self.rope_cos is None:
            return AttentionContext(embeddings=embeddings)
        return AttentionContext(cos=self.rope_cos[:T], sin=self.rope_sin[:T], embeddings=embeddings)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, vocab_size)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"Sequence length {T} exceeds the model's block_size {self.config.block_size}; "
                "use a shorter data.seq_len or a larger model.config.block_size."
            )
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        x = self.drop(x)
        ctx = self.context(T, embeddings=x)
        for block in self.blocks:
            x = block(x, ctx)  # (B, T, C)
        return self.lm_head(self.norm_f(x))  # (B, T, vocab_size)

    def num_parameters(self) -> dict[str, int]:
        """Total and non-embedding parameter counts (tied weights counted once).

        Non-embedding excludes the token embedding, the learned position table and an untied output head, the
        convention of Kaplan et al. (2020) that makes models of different vocabularies comparable.
        """
        unique = {id(p): p for p in self.parameters()}
        total = sum(p.numel() for p in unique.values())
        embedding = {id(self.wte.weight): self.wte.weight, id(self.lm_head.weight): self.lm_head.weight}
        if self.wpe is not None:
            embedding[id(self.wpe.weight)] = self.wpe.weight
        n_embedding = sum(p.numel() for p in embedding.values())
        return {"total": total, "non_embedding": total - n_embedding, "embedding": n_embedding}
