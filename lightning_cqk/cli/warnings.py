"""The library messages the command line hides: each one by its text and category, with the reason. One place.

Installed by `lightning_cqk.cli.main` when it runs from the shell (every command, and so every sweep run);
Python callers keep every warning. A message listed here is one that repeats on every run and that the user can do
nothing about (or has already decided); anything else still shows. Standard library only (cheap to import).
"""

from __future__ import annotations

import logging
import re
import warnings

WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        "raised by Lightning 2.6's own pytree helper on torch >= 2.10; nothing in a config or this package causes it",
    ),
    (
        r"Your `IterableDataset` has `__len__` defined",
        UserWarning,
        "litdata's StreamingDataset splits its chunks between DataLoader workers itself, so its length is right",
    ),
    (
        r"The '\w+' does not have many workers which may be a bottleneck",
        UserWarning,  # Lightning's PossibleUserWarning is a UserWarning
        "data.num_workers is a setting of every data config (default 0: memory-mapped token shards load in the main "
        "process); the advice repeats for every loader of every run",
    ),
    (
        r"This DataLoader will create \d+ worker processes in total",
        UserWarning,
        "torch repeats it for every loader of a run (three times); the DataModule says it once, with the flag that "
        "matches the machine (data/datamodule.py note_worker_count)",
    ),
)

LOG_MESSAGES: tuple[tuple[str, str, str], ...] = (
    (
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: For seamless cloud (logging|uploads)",
        "advertises Lightning's hosted services (litlogger / litmodels) at every run",
    ),
    (
        "lightning.fabric.utilities.rank_zero",
        r"💡 Tip: For seamless cloud (logging|uploads)",
        "the same tip, when Lightning logs it through fabric's logger",
    ),
)


class _DropMessages(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def install() -> None:
    """Hide the messages listed above (idempotent)."""
    for message, category, _why in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for logger_name, pattern, _why in LOG_MESSAGES:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropMessages) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_DropMessages(pattern))
