"""The pre-clip gradient norms of a model: per parameter, per group and per block, in one pass (`GradNormComputer`).

The computation behind `GradNormMonitor` (grad_norm.py) and the step's one shared read (`step_reads.StepReads`, used
by NonFiniteGuard and LossSpikeMonitor too): parameter groups by name outside attention and by the backend's own word
inside it (`AttentionBackend.parameter_group`), blocks by index, squared sums all-reduced across ranks when sharded.
Its own file so that the monitor and the shared read both import it and neither imports the other's module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

GROUPS = ("q", "k", "v", "out", "mlp", "embeddings", "norms", "backend", "other")
#: Name parts added by wrappers (LightningModule attribute, DDP/FSDP/compile/checkpoint wrappers), dropped.
_WRAPPER_PARTS = {"model", "module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}


def _parts(name: str) -> list[str]:
    return [p for p in name.split(".") if p not in _WRAPPER_PARTS]


def param_group(name: str) -> str:
    """Group of a parameter of a `GPT` (or of a LightningModule holding it as `model`), by its name."""
    parts = _parts(name)
    if not parts:
        return "other"
    head = parts[0]
    if head in ("wte", "wpe", "lm_head"):
        return "embeddings"
    if head == "norm_f":
        return "norms"
    if head == "blocks" and len(parts) >= 3:
        sub = parts[2]
        if sub in ("norm_1", "norm_2"):
            return "norms"
        if sub == "mlp":
            return "mlp"
        if sub == "attn" and len(parts) >= 4:
            return "backend"  # refined by the backend itself in `param_groups(module)`
    return "other"


def param_groups(module: nn.Module) -> dict[str, str]:
    """Group of every parameter of `module` (a GPT or a LightningModule holding one), by its name in
    `module.named_parameters()`; attention parameters as their backend's `parameter_group` says."""
    groups = {name: param_group(name) for name, _ in module.named_parameters()}
    for prefix, sub in module.named_modules():
        parameter_group = getattr(sub, "parameter_group", None)
        if not callable(parameter_group) or _parts(prefix)[-1:] != ["attn"]:
            continue
        for local, _ in sub.named_parameters():
            full = f"{prefix}.{local}"
            if full in groups:  # parameters shared with an earlier layer are listed (and grouped) there
                groups[full] = parameter_group(local)
    return groups


def param_block(name: str) -> int | None:
    """Block index of a parameter (None outside the blocks)."""
    parts = _parts(name)
    if len(parts) >= 2 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1])
    return None


def _local(grad: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor gradient, the gradient itself otherwise."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


class GradNormComputer:
    """Squared gradient norms per group and per block of a module, on the device, with cached index tensors."""

    def __init__(self, module: nn.Module) -> None:
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.names.append(name)
                self.params.append(p)
        groups = param_groups(module)
        self.groups = [groups[n] for n in self.names]
        self.group_names = [g for g in GROUPS if g in set(self.groups)]
        blocks = [param_block(n) for n in self.names]
        self.block_ids = sorted({b for b in blocks if b is not None})
        self._group_of = [self.group_names.index(g) for g in self.groups]
        # Parameters outside every block go to an extra slot that is not logged.
        self._block_of = [self.block_ids.index(b) if b is not None else len(self.block_ids) for b in blocks]
        self._index: dict[tuple[torch.device, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}
        self.last_param_sq: tuple[tuple[int, ...], torch.Tensor] | None = None  # (indices, (P,) squares), local

    def squared(self, sharded: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(per-group squared norms (G,), per-block squared norms (NB + 1,)) in fp32, or None without gradients."""
        present = tuple(i for i, p in enumerate(self.params) if p.grad is not None)
        if not present:
            return None
        grads = [_local(self.params[i].grad) for i in present]
        device = grads[0].device
        key = (device, present)
        if key not in self._index:
            self._index[key] = (
                torch.tensor([self._group_of[i] for i in present], device=device),
                torch.tensor([self._block_of[i] for i in present], device=device),
            )
        group_idx, block_idx = self._index[key]
        norms = torch._foreach_norm([g.float() if g.dtype != torch.float32 else g for g in grads])
        sq = torch.stack(norms).square()  # (P,)
        self.last_param_sq = (present, sq)
        group_sq = torch.zeros(len(self.group_names), device=device).index_add_(0, group_idx, sq)
        block_sq = torch.zeros(len(self.block_ids) + 1, device=device).index_add_(0, block_idx, sq)
        if sharded and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            both = torch.cat((group_sq, block_sq))
            dist.all_reduce(both, op=dist.ReduceOp.SUM)  # shards: the global square is the sum of the local ones
            group_sq, block_sq = both[: len(group_sq)], both[len(group_sq) :]
        return group_sq, block_sq

    def total(self, sharded: bool = False) -> torch.Tensor | None:
        """The global pre-clip gradient norm (0-dim fp32 tensor on the device), None without gradients."""
        squared = self.squared(sharded)
        return None if squared is None else squared[0].sum().sqrt()

    def norms(self, sharded: bool = False, per_group: bool = True, per_block: bool = True) -> dict[str, torch.Tensor]:
        """{"total": ..., "<group>": ..., "block_03": ...} as 0-dim device tensors ({} without gradients)."""
        squared = self.squared(sharded)
        return {} if squared is None else named_norms(self, squared, per_group, per_block)


def named_norms(
    computer: GradNormComputer, squared: tuple[torch.Tensor, torch.Tensor], per_group: bool, per_block: bool
) -> dict[str, torch.Tensor]:
    """{"total", "<group>", "block_03"} norms (0-dim device tensors) from `computer.squared()`'s output."""
    group_sq, block_sq = squared
    out = {"total": group_sq.sum().sqrt()}
    if per_group:
        out.update({g: group_sq[i].sqrt() for i, g in enumerate(computer.group_names) if g != "other"})
    if per_block:
        out.update({f"block_{b:02d}": block_sq[i].sqrt() for i, b in enumerate(computer.block_ids)})
    return out
