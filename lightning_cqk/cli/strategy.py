"""`--trainer.strategy <ClassName>` as Lightning's docs and ours write it, and FSDP2 sharded over every process.

jsonargparse reads `--trainer.strategy ModelParallelStrategy` as a string (the Trainer's `strategy` is `str |
Strategy`), and the Trainer knows no strategy of that name: the documented flag failed. `resolve_strategy` (a check of
the run's preflight, run/strategy_flag.py) turns a bare class name of `lightning.pytorch.strategies` into its class
(`DDPStrategy`, `FSDPStrategy`, ...), and `ModelParallelStrategy` into `FSDP2Strategy`: the same strategy with the sizes
this framework can use by default. Lightning's own defaults ("auto" = data-parallel over nodes, tensor-parallel over
each node's devices) ask for tensor parallelism on one node (8 GPUs: tensor-parallel 8), which `LitLM` refuses (it
shards with FSDP2 only).

Its checkpoints are distributed-checkpoint folders (`checkpoint_files`: shards, their index, meta.pt), saved whole or
not at all: every rank writes under a hidden temporary name beside the target, and rank zero puts the finished folder
in place (`checkpoint_files.replace_folder`), so a kill during a save leaves the previous checkpoint (Lightning writes
into the target folder itself: a kill there leaves the old meta.pt beside half the new shards). Loading checks the
folder first (a clear `CorruptCheckpointError` naming the newest intact checkpoint beside it) and reads it without
running code from it (`checkpoint_folder`: Lightning's loader would let torch unpickle the index and the stored items
as they are), meta.pt with `weights_only=True` as every other checkpoint of the package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.strategies import ModelParallelStrategy

from lightning_cqk.checkpoint.folder import load_sharded_training_state
from lightning_cqk.checkpoint.reading import (
    TRUSTED_GLOBALS,
    CorruptCheckpointError,
    checkpoint_problem,
    corrupt_checkpoint_message,
)
from lightning_cqk.files.atomic import remove_path, replace_folder


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's `ModelParallelStrategy` whose defaults shard with FSDP2 over every process: `tensor_parallel_size`
    1 and `data_parallel_size` "auto" = all processes (nodes x devices per node). Explicit sizes are kept."""

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size, **kwargs)

    def resolve_sizes(self) -> tuple[int, int]:
        """(data_parallel_size, tensor_parallel_size) with "auto" resolved: tensor 1, data every process."""
        if self._tensor_parallel_size == "auto":
            self._tensor_parallel_size = 1
        if self._data_parallel_size == "auto":
            self._data_parallel_size = max(1, self.num_nodes * self.num_processes // int(self._tensor_parallel_size))
        return int(self._data_parallel_size), int(self._tensor_parallel_size)

    def setup_environment(self) -> None:
        self.resolve_sizes()  # before Lightning's "auto" (data-parallel = nodes, tensor-parallel = devices per node)
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Save the folder under a temporary name, then put it in place whole (module docstring)."""
        if not self._save_distributed_checkpoint or not _is_local_file_protocol(str(filepath)):
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        target = Path(self.broadcast(str(filepath)))  # rank zero's path and process id name the folder on every rank
        tmp = target.with_name(f".{target.name}.{self.broadcast(os.getpid())}.tmp")
        if self.is_global_zero:
            remove_path(tmp)
        self.barrier("FSDP2Strategy.save_checkpoint:start")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier("FSDP2Strategy.save_checkpoint:written")
        if self.is_global_zero:
            replace_folder(tmp, target)
        self.barrier("FSDP2Strategy.save_checkpoint:in-place")
        return None

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Refuse a cut-short, damaged or untrusted folder by name; read it without running code from it
        (`checkpoint_folder`: the index through a restricted unpickler, stored items and meta.pt as plain data)."""
        import torch

        path = Path(self.broadcast(str(checkpoint_path)))
        if _is_local_file_protocol(str(path)):
            problem = checkpoint_problem(path)
            if problem is not None:
                raise CorruptCheckpointError(corrupt_checkpoint_message(path, problem))
        if path.is_dir():  # torch would unpickle the index and stored items as they are: read them safely instead
            assert self.lightning_module is not None
            return load_sharded_training_state(
                path, self.model, list(self.optimizers), strict=self.lightning_module.strict_loading
            )
        with torch.serialization.safe_globals(list(TRUSTED_GLOBALS)):
            return super().load_checkpoint(path, weights_only=True)
