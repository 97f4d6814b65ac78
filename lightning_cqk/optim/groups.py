"""Parameter groups: weight decay on matrices only."""

from __future__ import annotations

from torch import nn


def weight_decay_groups(model: nn.Module, weight_decay: float, scope: str = "matrices") -> list[dict]:
    """Two AdamW groups: parameters with >= 2 dimensions decayed, all others (gains, biases, scalars) not.

    A matrix-shaped parameter that is really a bank of biases (e.g. per-head biases, (nh, hidden)) opts out by
    carrying the attribute `_no_weight_decay = True`. Tied parameters appear once (named_parameters de-duplicates).
    `scope="all"` decays every parameter (the "no_decay" group is then empty), as the official code of
    arXiv 2606.04032 does (`AdamW(model.parameters(), weight_decay=0.1)`).
    """
    if scope not in ("matrices", "all"):
        raise ValueError(f"weight_decay_scope={scope!r} is not 'matrices' or 'all'.")
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        matrix = param.dim() >= 2 and not getattr(param, "_no_weight_decay", False)
        (decay if matrix or scope == "all" else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
