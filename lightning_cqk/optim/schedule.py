"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


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
