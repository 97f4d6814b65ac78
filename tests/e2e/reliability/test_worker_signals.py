"""DataLoader workers and stop signals (issue 13 class 8): out of the group's way, never unkillable.

A signal sent to the whole process group must reach the training process alone (it saves and stops), but the
DataLoader must still be able to end a worker with SIGTERM: its shutdown `terminate()`s a worker that does not exit in
time, and multiprocessing joins every worker at interpreter exit. A worker that ignored SIGTERM left the training
process blocked in that join for ever (seen: a run stopped by `kill -- -PGID` that never exited).
"""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_cqk.data.datamodule import ignore_stop_signals


class _Pids(IterableDataset):
    """Yields the worker's pid and process group, then blocks (as a worker waiting on a slow shard would)."""

    def __iter__(self):
        yield torch.tensor([os.getpid(), os.getpgid(0)])
        while True:
            time.sleep(0.05)


def test_workers_leave_the_process_group_and_still_die_on_sigterm():
    loader = DataLoader(_Pids(), batch_size=None, num_workers=1, worker_init_fn=ignore_stop_signals)
    iterator = iter(loader)
    (worker,) = iterator._workers  # multiprocessing.Process
    try:
        pid, pgid = next(iterator).tolist()
        assert pid == worker.pid != os.getpid()
        assert pgid == pid != os.getpgid(0), "the worker runs in a process group of its own"
        os.kill(pid, signal.SIGTERM)  # what the DataLoader's shutdown and multiprocessing's exit join send
        worker.join(timeout=20)
        # torch's worker handler exits 0 on its parent's SIGTERM (default action -15 for any other sender)
        assert not worker.is_alive(), "a worker that survives SIGTERM blocks the trainer's exit for ever"
        assert worker.exitcode in (0, -signal.SIGTERM)
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=20)
        iterator._shutdown_workers()
