"""Optimiser and learning-rate schedule settings (names and numbers only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LOGIT_CONTROL_METHODS = ("none", "quack", "fixed", "qk_clip")


@dataclass
class LogitControl:
    """Control of the query/key weights' updates (arXiv 2511.21377; `lightning_cqk.optim.quack`, `.qk_clip`).

    Applies to every layer whose backend has per-head Q/K matrices (`standard`, `coupled`, `uncoupled_mlp`, `mla`);
    QK-norm, the fourth intervention of the paper, is the backend option `qk_norm`.

    Attributes:
        method: "none" (plain AdamW, the default), "quack" (per-head Q/K learning rates
            tau * lr * |W_K^h|_0 / |W_K^h| and the mirror rule, recomputed before every step; the MLA rule for `mla`),
            "fixed" (the paper's "Ablation": a constant factor tau on the Q/K learning rate) or "qk_clip" (after every
            step, rescale W_Q^h, W_K^h of each head whose max logit since the last step exceeded tau_clip).
        tau: QuacK's relative initial Q/K learning rate (every factor equals tau at init), and the constant of
            "fixed". The paper sweeps 0.01, 0.1, 1 and 10.
        tau_clip: the logit cap of "qk_clip" (the paper tries 30 and 100).
        scale_weight_decay: "quack"/"fixed": True scales the whole AdamW update of W_Q, W_K, including the decoupled
            weight decay (a true per-head learning rate); False keeps the decay at the scheduled learning rate.
    """

    method: Literal["none", "quack", "fixed", "qk_clip"] = "none"
    tau: float = 1.0
    tau_clip: float = 100.0
    scale_weight_decay: bool = True

    def __post_init__(self) -> None:
        if self.method not in LOGIT_CONTROL_METHODS:
            raise ValueError(
                f"optim.logit_control.method={self.method!r} is not one of "
                f"{', '.join(map(repr, LOGIT_CONTROL_METHODS))}."
            )
        if not self.tau > 0:
            raise ValueError(f"optim.logit_control.tau must be positive, got {self.tau}.")
        if not self.tau_clip > 0:
            raise ValueError(f"optim.logit_control.tau_clip must be positive, got {self.tau_clip}.")


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
        logit_control: QuacK, the fixed Q/K factor or QK-clip (`LogitControl`); off by default.
    """

    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    decay_steps: int | None = None
    fused: bool = True
    logit_control: LogitControl = field(default_factory=LogitControl)

    def __post_init__(self) -> None:
        if isinstance(self.logit_control, dict):  # checkpoints store plain dicts
            self.logit_control = LogitControl(**self.logit_control)
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}.")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}.")
        self.betas = tuple(self.betas)
