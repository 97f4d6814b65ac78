"""Optimisation: AdamW settings, parameter groups and the learning-rate schedule. Torch only."""

from lightning_cqk.optim.config import OptimConfig
from lightning_cqk.optim.groups import weight_decay_groups
from lightning_cqk.optim.schedule import warmup_cosine

__all__ = ["OptimConfig", "warmup_cosine", "weight_decay_groups"]
