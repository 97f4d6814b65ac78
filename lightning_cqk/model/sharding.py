"""FSDP2 for `GPT`: one `fully_shard` unit per block, the rest (embedding, head, final norm, and every module shared
by several blocks) in the root unit; norm clipping and gradient norms that work on sharded (DTensor) gradients.
Torch only.

    shard_gpt(model, mesh, mp_policy)         blocks.i -> unit i; root unit: wte, wpe, norm_f, lm_head + shared banks
    clip_grad_norm_(parameters, max_norm)    the global L2 norm over all ranks' shards, one scale for every gradient

Shared modules (a dynamics bank with `share_dynamics: model`, an invertible coupling with `share_layers: true`) are
one module object under several blocks. FSDP2 lets one unit own a parameter, so the first block that holds the bank
owns it and the later blocks' units ignore it; the owner is not resharded after its forward, so its parameters (the
bank's among them) stay gathered while the later blocks run forward and backward, and its own backward, the last of
them, reduce-scatters the bank's gradient summed over all layers. Cost: one block's parameters stay gathered.

Mixed precision (`MixedPrecisionPolicy`): with bf16, each unit gathers its parameters in bf16 for the forward and
backward and reduces gradients in fp32; the sharded parameters, gradients and optimizer state stay fp32.

What sharding changes: nothing in the numbers beyond float summation order (tests/e2e/scale/test_fsdp.py, 2 gloo ranks
against one process): DTensor ops are those of the full tensors, so Muon orthogonalises whole matrices (DTensor
redistributes the sharded momentum for the Newton-Schulz matmuls) and QuacK / QK-clip read whole-head norms.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def is_dtensor(tensor: object) -> bool:
    """True for a `torch.distributed.tensor.DTensor` (a sharded parameter or gradient)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def shared_modules(model: nn.Module) -> dict[int, list[nn.Module]]:
    """The outermost modules that appear under more than one of `model.blocks` (tied across layers), by the index of
    the first block that holds them (their owner)."""
    owners: dict[int, list[int]] = {}
    by_id: dict[int, nn.Module] = {}
    for i, block in enumerate(model.blocks):
        for module in block.modules():
            layers = owners.setdefault(id(module), [])
            if i not in layers:
                layers.append(i)
            by_id[id(module)] = module
    shared = {k: layers[0] for k, layers in owners.items() if len(layers) > 1}
    inner = {id(sub) for k in shared for sub in by_id[k].modules() if sub is not by_id[k]}
    out: dict[int, list[nn.Module]] = {}
    for k, owner in shared.items():
        if k not in inner:
            out.setdefault(owner, []).append(by_id[k])
    return out


def shard_gpt(model: nn.Module, mesh, mp_policy=None, reshard_after_forward: bool = True) -> None:
    """Apply FSDP2 to a `GPT` in place: `fully_shard` per block, then the root (see the module docstring).

    Args:
        model: a materialised `GPT` (no meta tensors), on the device of `mesh`.
        mesh: a 1-D `DeviceMesh` over the data-parallel ranks.
        mp_policy: a `torch.distributed.fsdp.MixedPrecisionPolicy`, or None for fp32 throughout.
        reshard_after_forward: free each block's gathered parameters after its forward (gather again in backward).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy or MixedPrecisionPolicy()
    shared = shared_modules(model)
    for i, block in enumerate(model.blocks):
        # Read the parameters now: sharding the owner replaces them with DTensor parameters.
        shared_params = {p for modules in shared.values() for m in modules for p in m.parameters()}
        owned = {p for m in shared.get(i, []) for p in m.parameters()}
        fully_shard(
            block,
            mesh=mesh,
            mp_policy=policy,
            # The owner of a shared bank keeps it gathered until its own backward, the last to use it.
            reshard_after_forward=reshard_after_forward and not owned,
            ignored_params=(shared_params - owned) or None,
        )
    fully_shard(model, mesh=mesh, mp_policy=policy)


@torch.no_grad()
def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together (over every rank's shards for sharded ones), a plain 0-dim tensor."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, norm_type=norm_type)
    return norm.full_tensor() if is_dtensor(norm) else norm


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)), the norm taken over all of them and all ranks (as
    `torch.nn.utils.clip_grad_norm_` on the unsharded model); works on DTensor gradients. Returns the norm."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = total_grad_norm(parameters, norm_type)
    if parameters:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm
