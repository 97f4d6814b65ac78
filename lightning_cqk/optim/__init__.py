"""Optimisation: AdamW / Muon, parameter groups, the learning-rate schedule and Q/K update control. Torch only."""

from lightning_cqk.optim.config import LogitControl, MuonSettings, OptimConfig
from lightning_cqk.optim.groups import weight_decay_groups
from lightning_cqk.optim.logit_control import build_logit_control
from lightning_cqk.optim.muon import MuonAdamW, build_optimizer, muon_split
from lightning_cqk.optim.qk_clip import QKClip
from lightning_cqk.optim.quack import FixedQKFactor, QuacK, UpdateScaler
from lightning_cqk.optim.schedule import warmup_cosine

__all__ = [
    "FixedQKFactor",
    "LogitControl",
    "MuonAdamW",
    "MuonSettings",
    "OptimConfig",
    "QKClip",
    "QuacK",
    "UpdateScaler",
    "build_logit_control",
    "build_optimizer",
    "muon_split",
    "warmup_cosine",
    "weight_decay_groups",
]
