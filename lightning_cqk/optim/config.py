"""Optimiser and learning-rate schedule settings (names and numbers only)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OptimConfig:
    """AdamW with decoupled weight decay on matrices only, linear warmup and cosine decay to a floor.

    Attributes:
        lr: peak learning rate.
        betas: AdamW betas.
        eps: AdamW epsilon.
        weight_decay: decoupled weight decay, applied to parameters with 2 or more dimensions only (matrices:
            projections, embeddings, per-head MLP banks); vectors and scalars (norm gains, biases, lambda, dt) are
            never decayed.
        warmup_steps: linear warmup from 0 to `lr` over this many optimizer steps.
        min_lr_ratio: the cosine decays to `lr * min_lr_ratio`.
        decay_steps: length of warmup + cosine in optimizer steps; None uses `trainer.max_steps`. After it the
            learning rate stays at the floor.
        fused: use the fused AdamW kernel on CUDA (ignored elsewhere).
    """

    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    decay_steps: int | None = None
    fused: bool = True

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}.")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}.")
        self.betas = tuple(self.betas)
