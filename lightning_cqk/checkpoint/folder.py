"""Loading FSDP2's distributed-checkpoint folders without running code from them.

A folder (`last.ckpt/`, `step=<N>.ckpt/`: `checkpoint_files` describes its parts) may come from elsewhere, like any
checkpoint, and torch.distributed.checkpoint trusts it: `FileSystemReader.read_metadata` reads the index `.metadata`
with a bare `pickle.load`, and `DefaultLoadPlanner.load_bytes` reads every stored non-tensor item with
`torch.load(weights_only=False)`. Either runs whatever a crafted pickle asks for. So every folder the package reads,
to resume (`FSDP2Strategy.load_checkpoint`) or to consolidate (`lightning_cqk consolidate`), goes through here:

* **The index** is unpickled by `checkpoint_files.read_index` with an unpickler that resolves only the classes such
  an index is made of (`INDEX_GLOBALS`: the checkpoint metadata records, `torch.Size`, dtypes, layouts, memory
  formats, paths); any other global is refused by name (`UntrustedCheckpointError`) before it is constructed.
* **Every file the index names exists** with at least the bytes it names (`checkpoint_files.folder_problem`): a
  folder missing a shard is not intact, so a resume passes it over for the newest complete one and `consolidate`
  names the missing files. Names are plain file names inside the folder (no `..`, no absolute path).
* **Stored byte items** (an optimizer's `param_groups`: numbers, lists, strings) are read with
  `torch.load(weights_only=True)` and `checkpoint_files.TRUSTED_GLOBALS` (`PlainBytesPlanner`); anything else is
  refused naming the item. Tensor items are read by torch with `weights_only=True` already.

The readers subclass torch's `FileSystemReader` and load planners; `_EmptyStateDictLoadPlanner` (what torch's own
`dcp_to_torch_save` uses to rebuild a state dict from the index alone) is private API of the locked torch.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from lightning_cqk.checkpoint.reading import (
    META_NAME,
    TRUSTED_GLOBALS,
    CorruptCheckpointError,
    UntrustedCheckpointError,
    corrupt_checkpoint_message,
    folder_problem,
    read_index,
)


# ---------------------------------------------------------------------------------------------- loading
def _plain_item(value: io.BytesIO, name: str, folder: Path) -> Any:
    """A stored non-tensor item, read as plain data (`weights_only=True`, `TRUSTED_GLOBALS`), or refused by name."""
    import torch

    try:
        with torch.serialization.safe_globals(list(TRUSTED_GLOBALS)):
            return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if "global" in line.lower()]
        what = lines[0][:200] if lines else "an object torch does not load as plain data"
        raise UntrustedCheckpointError(
            f"Checkpoint folder {folder} stores the item {name!r} as a pickled object that is not plain data "
            f"({what}): loading it could run code from the file, so the folder is refused. "
            "`lightning_cqk fit` stores only tensors and plain values. Do not use a folder you cannot vouch for."
        ) from err


def _planners() -> tuple[type, type]:
    """(a planner for a known state dict, one that rebuilds the state dict from the index), both reading byte items
    as plain data. Built on first use: torch.distributed.checkpoint is imported only when a folder is loaded."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner

    class PlainBytesPlanner(DefaultLoadPlanner):
        """torch's default load planner, with stored byte items read as plain data (`_plain_item`)."""

        folder = Path()

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            item = _plain_item(value, read_item.dest_index.fqn, self.folder)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], item)
            else:
                self.state_dict[read_item.dest_index.fqn] = item

    class PlainBytesFullPlanner(_EmptyStateDictLoadPlanner, PlainBytesPlanner):
        """torch's planner that rebuilds the whole state dict from the index, with byte items as plain data."""

    return PlainBytesPlanner, PlainBytesFullPlanner


def _reader(folder: Path) -> Any:
    """torch's `FileSystemReader` over `folder`, whose index is read by `read_index`."""
    from torch.distributed.checkpoint import FileSystemReader

    class IndexCheckingReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            index = read_index(folder)
            if getattr(index, "storage_meta", None) is None:
                index.storage_meta = StorageMeta()
            index.storage_meta.load_id = self.load_id
            return index

    return IndexCheckingReader(folder)


def _checked(folder: str | Path) -> Path:
    folder = Path(folder)
    problem = folder_problem(folder)
    if problem is not None:
        raise CorruptCheckpointError(corrupt_checkpoint_message(folder, problem))
    return folder


def _unwrapped(run: Any) -> Any:
    """`run()`, with torch.distributed.checkpoint's `CheckpointException` (a BaseException carrying each rank's error
    and traceback as text) replaced by this package's own error when one of ours caused it."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return run()
    except CheckpointException as err:
        for cause, _ in err.failures.values():
            if isinstance(cause, (UntrustedCheckpointError, CorruptCheckpointError)):
                raise cause from None
        raise


def load_into(state: dict[str, Any], folder: str | Path) -> None:
    """Fill `state` (tensors in place, as `torch.distributed.checkpoint.load`) from `folder`, safely (module doc)."""
    import torch.distributed.checkpoint as dcp

    folder = _checked(folder)
    planner_class, _ = _planners()
    planner = planner_class()
    planner.folder = folder
    _unwrapped(lambda: dcp.load(state, storage_reader=_reader(folder), planner=planner))


def read_full_state(folder: str | Path) -> dict[str, Any]:
    """Every item of `folder` rebuilt from its index on the CPU, without a process group (for `consolidate`)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    folder = _checked(folder)
    _, planner_class = _planners()
    planner = planner_class()
    planner.folder = folder
    state: dict[str, Any] = {}
    _unwrapped(lambda: _load_state_dict(state, storage_reader=_reader(folder), planner=planner, no_dist=True))
    return state


def load_sharded_training_state(folder: str | Path, model: Any, optimizers: list[Any], strict: bool) -> dict:
    """An FSDP2 resume from `folder`: the sharded weights and optimizer states loaded into `model` and `optimizers`
    (as Lightning's ModelParallelStrategy does, through `load_into`), and meta.pt's content returned (plain data)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from lightning_cqk.checkpoint.reading import load_checkpoint

    folder = Path(folder)
    weights = {"state_dict": get_model_state_dict(model)}
    load_into(weights, folder)
    model.load_state_dict(weights["state_dict"], strict=strict)
    for index, optimizer in enumerate(optimizers):
        key = f"optimizer_{index}"  # the key Lightning's ModelParallelStrategy saves each optimizer under
        saved = {key: get_optimizer_state_dict(model, optimizer)}
        load_into(saved, folder)
        set_optimizer_state_dict(
            model, optimizer, optim_state_dict=saved[key], options=StateDictOptions(cpu_offload=True)
        )
    return load_checkpoint(folder / META_NAME)
