"""Build the Q/K update controller that `OptimConfig.logit_control` asks for. Torch only."""

from __future__ import annotations

from torch import nn

from lightning_cqk.optim.config import LogitControl
from lightning_cqk.optim.qk_clip import QKClip
from lightning_cqk.optim.quack import FixedQKFactor, QuacK, UpdateScaler


def build_logit_control(model: nn.Module, cfg: LogitControl) -> UpdateScaler | QKClip | None:
    """None for method "none"; else a module with `before_step(optimizer)`, `after_step(optimizer)` and `stats()`.

    Build it when the model has its initial weights: QuacK records the initial norms (as buffers, so they are saved in
    and restored from checkpoints).
    """
    if cfg.method == "none":
        return None
    if cfg.method == "quack":
        return QuacK(model, tau=cfg.tau, scale_weight_decay=cfg.scale_weight_decay)
    if cfg.method == "fixed":
        return FixedQKFactor(model, tau=cfg.tau, scale_weight_decay=cfg.scale_weight_decay)
    if cfg.method == "qk_clip":
        return QKClip(model, tau_clip=cfg.tau_clip)
    raise ValueError(f"Unknown logit_control.method {cfg.method!r}.")  # pragma: no cover - validated by LogitControl
