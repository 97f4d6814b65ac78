"""Count host syncs (device -> host reads) in a block of torch code: a `TorchFunctionMode` that sees every call.

Counted: `Tensor.item`, `__bool__`, `__float__`, `__int__`, `__index__`, `tolist`, `numpy`, `cpu`, and `to` whose target
is the CPU while the tensor is elsewhere (on a GPU each of these waits for the device). On a CPU run `.to(cpu)` cannot
be told from a move to the training device, which is the CPU too, so there it is not counted (the GPU suite's
`torch.cuda.set_sync_debug_mode("error")` sees it). Also counted, apart: Python scalars made into tensors
(`torch.tensor(...)`, `torch.as_tensor(...)`: on a GPU a host-to-device copy). `where` names, per kind, the innermost
frames outside torch that made each call (Lightning's own frames included), to say which code reads. Not counted:
reads inside `torch.optim` (the non-fused optimizers read their per-parameter `step` counters, which torch keeps on
the host on every device; fused AdamW, used on CUDA, reads none), kept apart in `host_state`.
"""

from __future__ import annotations

import collections
import traceback

import torch
from torch.overrides import TorchFunctionMode

READS = {
    torch.Tensor.item: "item",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__float__: "float",
    torch.Tensor.__int__: "int",
    torch.Tensor.__index__: "index",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.cpu: "cpu",
}
CREATES = {torch.tensor: "tensor", torch.as_tensor: "as_tensor"}


def _to_cpu(args, kwargs) -> bool:
    source = args[0] if args and isinstance(args[0], torch.Tensor) else None
    targets = [a for a in args[1:] if isinstance(a, (str, torch.device))] + [kwargs.get("device")]
    to_cpu = any(t is not None and torch.device(t).type == "cpu" for t in targets)
    return to_cpu and source is not None and source.device.type != "cpu"


def _name(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename.split('site-packages/')[-1].split('/launch/')[-1]}:{frame.lineno}"


def _frames() -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_stack()[:-2] if "sync_counter" not in f.filename]


def _site(frames: list[traceback.FrameSummary]) -> str:
    """The innermost frames outside torch (the code that reads), innermost first."""
    outside = [f for f in frames if "/torch/" not in f.filename and "lightning_utilities" not in f.filename]
    return " < ".join(_name(f) for f in reversed(outside[-4:]))


class SyncCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()
        self.creates: collections.Counter[str] = collections.Counter()
        self.where: collections.Counter[str] = collections.Counter()
        self.host_state: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = READS.get(func) or ("to_cpu" if func is torch.Tensor.to and _to_cpu(args, kwargs) else None)
        if kind is not None:
            frames = _frames()
            if frames and "/torch/optim/" in frames[-1].filename:
                self.host_state[kind] += 1  # an optimizer's step counter: a host tensor on every device
            else:
                self.reads[kind] += 1
                self.where[f"{kind} {_site(frames)}"] += 1
        elif func in CREATES and not isinstance(args[0] if args else None, torch.Tensor):
            self.creates[CREATES[func]] += 1
            self.where[f"create {_site(_frames())}"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        """Host syncs: reads, and Python scalars made into tensors (a host-to-device copy on a GPU)."""
        return sum(self.reads.values()) + sum(self.creates.values())
