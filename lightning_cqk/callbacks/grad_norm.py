"""GradNormMonitor: the pre-clip gradient norm, in total, per parameter group and per block.

Metrics (every `every_n_steps`, default `trainer.log_every_n_steps`):
    train/grad_norm/total        L2 norm of every gradient together, before clipping
    train/grad_norm/<group>      q, k, v, out (attention projections), mlp, embeddings (token/position embeddings
                                 and an untied output head), norms (block, final, QK and latent norms), backend
                                 (everything else a backend owns: coupled dynamics and dt, differential lambda,
                                 the `mlp` backend's matrices, ...); groups with no parameter are not logged
    train/grad_norm/block_03     L2 norm of block 3's gradients

Groups: outside attention by parameter name (`param_group`); inside a block's attention the backend says
(`AttentionBackend.parameter_group`: q and k from its `qk_weights()` seam, e.g. MLA's dq/uq/qr as q and dkv/uk/kr as
k, then out and v projections, norms, and "backend" for the rest), so no backend attribute is named here. A module
shared by several layers (e.g. coupled's one dynamics bank) is counted once, in the block where it is registered
first.

When: `on_before_optimizer_step`, which Lightning runs after the backward (and after AMP unscaling; bf16 needs none)
and before gradient clipping, so these are pre-clip norms, once per optimizer step (after the last accumulated
micro-batch). Put GradNormMonitor before a LossSpikeMonitor that skips updates in the callbacks list: a skipped
update drops the gradients in the same hook.

Cost: nothing on other steps; on a logging step one `torch._foreach_norm` over all gradients (fp32), two
`index_add_` to sum squares per group and block, and one host read for all values. The norms are computed once per
step for every callback that needs them (`step_reads.StepReads`: NonFiniteGuard and LossSpikeMonitor's
`max_grad_norm` use the same computation). Distributed: under DDP the
gradients are already averaged and identical on every rank, so the local norm is the global one; under sharded
strategies (FSDP, model parallel, DeepSpeed; `sharded=None` detects them) each rank holds a shard, so the squared
sums are all-reduced (SUM) across ranks before the square root, one collective for every value. FSDP1 needs
`use_orig_params=True` for the per-group and per-block names; DTensor gradients (FSDP2) are read through
`to_local()`.

Tests (`tests/e2e/callbacks/test_grad_norm.py`): total, per-group and per-block values equal a manual computation from
the
gradients seen before clipping (with a clip value far below the norm), every parameter is in exactly one group,
bf16-mixed values are finite, the logging interval holds.
"""

from __future__ import annotations

import lightning as L
import torch

from lightning_cqk.callbacks.common import is_log_step, is_sharded, log_metrics, step_index
from lightning_cqk.callbacks.grad_norm_computer import GradNormComputer, named_norms
from lightning_cqk.callbacks.step_reads import StepReads


class GradNormMonitor(L.Callback):
    """Log pre-clip gradient norms (total, per group, per block) every `every_n_steps` optimizer steps.

    Args:
        every_n_steps: logging interval in optimizer steps; None uses `trainer.log_every_n_steps`.
        per_group: log `train/grad_norm/<group>` (q, k, v, out, mlp, embeddings, norms, backend).
        per_block: log `train/grad_norm/block_NN`.
        sharded: all-reduce squared norms across ranks (sharded gradients); None detects FSDP/model parallel/DeepSpeed.
        prefix: metric name prefix.
    """

    def __init__(
        self,
        every_n_steps: int | None = None,
        per_group: bool = True,
        per_block: bool = True,
        sharded: bool | None = None,
        prefix: str = "train/grad_norm",
    ) -> None:
        self.every_n_steps = every_n_steps
        self.per_group = per_group
        self.per_block = per_block
        self.sharded = sharded
        self.prefix = prefix
        self.latest: dict[str, float] = {}
        self._computer: GradNormComputer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._computer = None  # parameters may be re-wrapped between fits
        StepReads.reset(trainer)

    @staticmethod
    def _computer_of(trainer: L.Trainer, pl_module: L.LightningModule) -> GradNormComputer:
        return StepReads.of(trainer, pl_module).computer

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        step = step_index(trainer)
        if not is_log_step(trainer, self.every_n_steps, step):
            return
        sharded = is_sharded(trainer) if self.sharded is None else self.sharded
        if sharded == is_sharded(trainer):  # the step's one computation, shared with the guard and the spike rule
            squared = StepReads.of(trainer, pl_module).grad_norms()
            norms = {} if squared is None else named_norms(self._computer_of(trainer, pl_module), squared,
                                                           self.per_group, self.per_block)  # fmt: skip
        else:
            if self._computer is None:
                self._computer = GradNormComputer(pl_module)
            norms = self._computer.norms(sharded, self.per_group, self.per_block)
        if norms:
            self.latest = log_metrics(trainer, {f"{self.prefix}/{k}": v for k, v in norms.items()}, step)
