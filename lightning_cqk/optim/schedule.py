"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def warmup_cosine(step: int, warmup_steps: int, decay_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based).

    Rises linearly over `warmup_steps` (reaching 1 at the end of warmup), then follows a half cosine from 1 down
    to `min_ratio` at `decay_steps`, and stays at `min_ratio` afterwards.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_ratio
    progress = (step - warmup_steps) / max(1, decay_steps - warmup_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rates_at_scheduler_step(schedulers: Iterable[Any]) -> None:
    """Set every parameter group's learning rate to what its schedule gives at the scheduler's current step.

    A resumed optimizer holds the rate the *saved* schedule computed for the next step, while the scheduler is rebuilt
    from today's settings (`configure_optimizers`: trainer.max_steps, optim.decay_steps, warmup, a budget); the
    scheduler only rewrites the rate after the first resumed step, so that step would train at the old schedule's
    rate (issue 34 defect 9). Schedulers with a closed form (`LambdaLR`: base rate x lambda(step)) are set here;
    others are left as restored. With an unchanged schedule the rate is recomputed to the very same value.
    """
    for scheduler in schedulers:
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if lambdas is None:
            continue
        step = scheduler.last_epoch
        rates = [base * fn(step) for base, fn in zip(scheduler.base_lrs, lambdas, strict=True)]
        for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates
