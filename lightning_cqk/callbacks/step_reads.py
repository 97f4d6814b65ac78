"""One gradient-norm computation and one host read per optimizer step, shared by the callbacks that decide there.

`NonFiniteGuard` (skip a NaN/Inf update), `LossSpikeMonitor` (its `max_grad_norm` rule, its skip/stop actions) and
`GradNormMonitor` (the logged norms) all look at the step's gradients in `on_before_optimizer_step`, before the
update. Each used to run its own `torch._foreach_norm` over every gradient and its own host read. `StepReads.of`
gives them one object per optimizer step:
    grad_norms()  the squared pre-clip L2 norms per parameter, per group and per block (`GradNormComputer`), computed
                  once per step (one `_foreach_norm`) on first request; all on the device.
    put(name, t)  a 0-dim device value that a callback will want on the host this step (the guard's loss
                  finiteness, a spike flag), registered without reading it.
    read()        every value put so far, plus the total gradient norm once a callback asked for the norms, in one
                  stacked `.tolist()`: the step's one host read, shared. A value put after the first read is read by
                  the next `read()` (a second read): callbacks that put values should come before the first reader
                  in the callbacks list (`LossSpikeMonitor` with skip/stop before `NonFiniteGuard`).
The object lives on the trainer (`trainer._cqk_step_reads`) and is replaced when the optimizer step changes.
"""

from __future__ import annotations

import lightning as L
import torch

from lightning_cqk.callbacks.common import is_sharded, step_index
from lightning_cqk.callbacks.grad_norm_computer import GradNormComputer

_ATTR = "_cqk_step_reads"


class StepReads:
    """The shared per-step norms and host read (module docstring)."""

    def __init__(self, step: int, computer: GradNormComputer | None, sharded: bool) -> None:
        self.step = step
        self.computer = computer
        self.sharded = sharded
        self._norms: tuple[torch.Tensor, torch.Tensor] | None | bool = False  # False: not computed yet
        self._pending: dict[str, torch.Tensor] = {}
        self._values: dict[str, float] = {}
        self.reads = 0  # host reads made this step (tests, docs/speed.md)

    @staticmethod
    def of(trainer: L.Trainer, pl_module: L.LightningModule) -> StepReads:
        """This optimizer step's object (created on first use in the step)."""
        step = step_index(trainer)
        current = getattr(trainer, _ATTR, None)
        if current is None or current.step != step:
            computer = current.computer if current is not None else None
            current = StepReads(step, computer or GradNormComputer(pl_module), is_sharded(trainer))
            setattr(trainer, _ATTR, current)
        return current

    @staticmethod
    def reset(trainer: L.Trainer) -> None:
        """Forget the cached parameter lists (call in `setup`: parameters may be re-wrapped between fits)."""
        if hasattr(trainer, _ATTR):
            delattr(trainer, _ATTR)

    def grad_norms(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(per-group, per-block) squared norms, fp32 on the device, or None without gradients; computed once."""
        if self._norms is False:
            self._norms = self.computer.squared(self.sharded)
            if self._norms is not None:
                self.put("grad_norm", self._norms[0].sum().sqrt())
        return self._norms

    def param_norms(self) -> dict[str, torch.Tensor]:
        """{parameter name: its L2 norm} of the last `grad_norms()` (device tensors; for reports of a bad step)."""
        if self.grad_norms() is None or self.computer.last_param_sq is None:
            return {}
        present, sq = self.computer.last_param_sq
        return {self.computer.names[i]: sq[k].sqrt() for k, i in enumerate(present)}

    def put(self, name: str, value: torch.Tensor) -> None:
        self._pending[name] = value.detach().reshape(()).to(torch.float64)

    def read(self) -> dict[str, float]:
        """Every value put so far, as Python floats, in one host read (cached)."""
        if self._pending:
            names = list(self._pending)
            values = torch.stack([self._pending[n].to(self._pending[names[0]].device) for n in names]).tolist()
            self._values.update(zip(names, values, strict=True))
            self._pending = {}
            self.reads += 1
        return dict(self._values)


def step_reads(trainer: L.Trainer, pl_module: L.LightningModule) -> StepReads:
    return StepReads.of(trainer, pl_module)
