"""Callbacks that watch training from the side (Lightning-aware): instruments, budgets and the run summary.

Ready-made stacks of them for configs live in the top-level `callbacks/` folder (see docs/instruments.md).
"""

from lightning_cqk.callbacks.attention_stats import AttentionStats
from lightning_cqk.callbacks.budget import TokenBudget
from lightning_cqk.callbacks.clock import TrainingClock
from lightning_cqk.callbacks.final_validation import FinalValidation
from lightning_cqk.callbacks.grad_norm import GradNormMonitor
from lightning_cqk.callbacks.loss_spike import LossSpikeMonitor
from lightning_cqk.callbacks.nonfinite import NonFiniteGuard
from lightning_cqk.callbacks.run_checkpoint import AtomicCheckpointIO, BestCheckpoint, RunCheckpoint
from lightning_cqk.callbacks.summary import RunSummary
from lightning_cqk.callbacks.throughput import Throughput
from lightning_cqk.callbacks.val_windows import ValWindowLosses

__all__ = [
    "AtomicCheckpointIO",
    "AttentionStats",
    "BestCheckpoint",
    "FinalValidation",
    "GradNormMonitor",
    "LossSpikeMonitor",
    "NonFiniteGuard",
    "RunCheckpoint",
    "RunSummary",
    "Throughput",
    "TokenBudget",
    "TrainingClock",
    "ValWindowLosses",
]
