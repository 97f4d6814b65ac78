"""`--trainer.strategy <ClassName>` as Lightning's docs and ours write it, and FSDP2 sharded over every process.

jsonargparse reads `--trainer.strategy ModelParallelStrategy` as a string (the Trainer's `strategy` is `str |
Strategy`), and the Trainer knows no strategy of that name: the documented flag failed. `resolve_strategy` turns a
bare class name of `lightning.pytorch.strategies` into its class (`DDPStrategy`, `FSDPStrategy`, ...), and
`ModelParallelStrategy` into `FSDP2Strategy`: the same strategy with the sizes this framework can use by default.
Lightning's own defaults ("auto" = data-parallel over nodes, tensor-parallel over each node's devices) ask for
tensor parallelism on one node (8 GPUs: tensor-parallel 8), which `LitLM` refuses (it shards with FSDP2 only).
"""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch.strategies import ModelParallelStrategy


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


def resolve_strategy(value: Any) -> Any:
    """A strategy given as a bare class name, as {class_path, init_args}; anything else unchanged."""
    if not isinstance(value, str) or "." in value:
        return value
    if value == ModelParallelStrategy.__name__:
        return {"class_path": f"{FSDP2Strategy.__module__}.{FSDP2Strategy.__name__}", "init_args": {}}
    import lightning.pytorch.strategies as strategies

    found = getattr(strategies, value, None)
    if isinstance(found, type) and value.endswith("Strategy"):
        return {"class_path": f"lightning.pytorch.strategies.{value}", "init_args": {}}
    return value
