"""Validation independent of the number of processes: a fixed set of windows, split across the ranks.

The validation set is the first N windows of the `val` split, in order, whatever the world size:
    N = every window                                     with trainer.limit_val_batches 1.0 (or no trainer)
    N = limit_val_batches x val_batch_size (at most all)  with an integer limit (a count of batches of ONE process)
    N = int(fraction x every window)                     with a fraction below 1
Rank r of W scores the contiguous block [r N // W, (r + 1) N // W), so together the ranks score exactly the windows one
process scores, each once: the same val/loss up to the order of float summation. (Lightning counts
`limit_val_batches` per rank, and litdata deals each rank its own chunks: 8 GPUs scored 8x more windows than 1, and
other ones.) The limit is applied here, once: the trainer's fraction is then set to 1.0 so that Lightning does not cut
each rank's share a second time; an integer limit never cuts a share (a share is at most N / W windows).

`ValWindowShare` reads the windows by index from the split's `StreamingDataset` (random access into the chunks, the
same windows in the same order as iterating it in one process). It is an iterable dataset, so Lightning adds no
`DistributedSampler` (which would split the share again and pad it with repeated windows); with DataLoader workers,
worker w reads batches w, w + workers, ..., which the DataLoader returns in order, so each rank's windows come in
index order (`callbacks/val_windows.py` relies on it to gather per-window losses in the one-process order).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def validation_windows(total: int, limit: Any, batch_size: int) -> int:
    """How many windows of `total` the validation scores, for the trainer's `limit_val_batches` (module docstring)."""
    if limit is None or (isinstance(limit, float) and limit >= 1.0):
        return total
    if isinstance(limit, int):
        return min(total, limit * batch_size)
    return min(total, int(total * float(limit)))


def share(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s windows among `n` split over `world` ranks (sizes differ by at most one)."""
    return rank * n // world, (rank + 1) * n // world


class ValWindowShare(torch.utils.data.IterableDataset):
    """Windows [start, stop) of a map-style window dataset (litdata's StreamingDataset), in order (module docstring).

    Args:
        dataset: indexable windows (`dataset[i]`: the i-th window of the whole split).
        start, stop: this rank's block.
        batch_size: the DataLoader's batch size, so that workers split by whole batches (order kept).
    """

    def __init__(self, dataset: Any, start: int, stop: int, batch_size: int) -> None:
        self.dataset, self.start, self.stop, self.batch_size = dataset, start, stop, batch_size

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        n_batches = math.ceil(len(self) / self.batch_size)
        for b in range(worker, n_batches, workers):
            first = self.start + b * self.batch_size
            for i in range(first, min(first + self.batch_size, self.stop)):
                yield self.dataset[i]
