"""Muon for the hidden weight matrices, AdamW for everything else, as one torch optimizer. Torch only.

Muon (K. Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/; `torch.optim.Muon`) orthogonalises the
momentum of a 2-D weight with a Newton-Schulz iteration. It is meant for hidden layers only; "the input embedding,
final output layer, and any internal gains or biases should be optimized using a standard method such as AdamW"
(the Muon post, the `torch.optim.Muon` docstring, and Moonlight, J. Liu et al. 2025, arXiv 2502.16982, §2.2). The
split used here (`muon_split`):

    Muon   every 2-D parameter of the transformer blocks (attention projections of every backend, MLP matrices),
           except matrix-shaped banks of biases (`_no_weight_decay`) and parameters marked `_no_muon`
    AdamW  token embedding / output head (tied or not), learned position table, every norm gain, bias, scalar and
           vector (lambda, dt), and every parameter that is not 2-D (e.g. per-head MLP banks (nh, a, b))

The AdamW part keeps `weight_decay_groups` (matrices decayed, vectors not, or everything with
`weight_decay_scope: all`). QuacK / the fixed factor / QK-clip act on the Q/K weights, which are Muon's: QuacK scales
each head's row block of the update Muon made (the full matrix is orthogonalised, then the head's slice is scaled:
the "faithful minimum" of docs/papers.md §6 item 11; per-head orthogonalisation is [NS] in arXiv 2511.21377).

`MuonAdamW` is one `torch.optim.Optimizer` holding a `torch.optim.Muon` and a `torch.optim.AdamW`, so Lightning's
automatic optimisation keeps working unchanged: one `step(closure)` (the closure runs forward and backward once,
then both optimizers step), one `zero_grad`, gradient clipping over all parameters (Lightning clips what
`param_groups` lists: the union of both optimizers' groups, the very same dicts), one LR scheduler (a LambdaLR scales
every group's own initial lr by the same factor, so Muon's and AdamW's peak rates follow one schedule), and a
checkpoint in the standard torch format (`state_dict()` numbers the parameters of all groups in order; Muon's state
is its `momentum_buffer`, AdamW's `step`, `exp_avg`, `exp_avg_sq`), which `load_state_dict` splits back. A step that
NonFiniteGuard skipped (every gradient None) changes nothing in either optimizer.

Tests (`tests/e2e/optim/test_muon.py`): the split; steps equal `torch.optim.Muon` + `torch.optim.AdamW` used directly on
the same parameters (bit for bit); QuacK's per-head scaling of the Muon update against a direct computation; a
resumed run equals an uninterrupted one (weights and optimizer state); an AdamW checkpoint is refused clearly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_cqk.optim.groups import weight_decay_groups

if TYPE_CHECKING:
    from lightning_cqk.optim.config import OptimConfig


def muon_split(model: nn.Module) -> tuple[list[nn.Parameter], list[str]]:
    """(parameters Muon trains, their names): the 2-D hidden weight matrices of `model` (see the module doc).

    Embeddings and the output head are excluded by identity (any `nn.Embedding` weight, and `lm_head.weight` when the
    model has one), so a tied head is excluded with its embedding.
    """
    excluded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear):
        excluded.add(id(head.weight))
    params, names = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or p.dim() != 2 or id(p) in excluded:
            continue
        if getattr(p, "_no_weight_decay", False) or getattr(p, "_no_muon", False):
            continue  # a bank of biases, or a matrix that asks for AdamW
        params.append(p)
        names.append(name)
    return params, names


class MuonAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` on `muon_params` and `torch.optim.AdamW` on `adamw_groups`, stepped together.

    Args:
        muon_params: the 2-D hidden matrices (see `muon_split`); one Muon group named "muon".
        adamw_groups: AdamW parameter groups (dicts with "params" and optionally "weight_decay", "name").
        muon_kwargs: `torch.optim.Muon` arguments (lr, weight_decay, momentum, nesterov, ns_steps, adjust_lr_fn, ...).
        adamw_kwargs: `torch.optim.AdamW` arguments (lr, betas, eps, fused, ...).

    `param_groups` is [Muon's group] + AdamW's groups (the same dict objects the two optimizers read), so a scheduler
    or a gradient clipper acting on this optimizer acts on both. `state` is a merged read view of both states.
    """

    def __init__(
        self,
        muon_params: list[nn.Parameter],
        adamw_groups: list[dict[str, Any]],
        muon_kwargs: dict[str, Any],
        adamw_kwargs: dict[str, Any],
    ) -> None:
        if not muon_params:
            raise ValueError(
                "optim.name 'muon' found no 2-D hidden weight matrix to train with Muon (embeddings, the output head, "
                "norms and biases go to AdamW); use optim.name 'adamw' for this model."
            )
        self.muon = torch.optim.Muon([{"params": muon_params, "name": "muon"}], **muon_kwargs)
        self.adamw = torch.optim.AdamW([g for g in adamw_groups if g["params"]], **adamw_kwargs)
        self._built = False
        super().__init__(self.muon.param_groups + self.adamw.param_groups, defaults={})
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
        self._built = True

    # The state lives in the two inner optimizers; `Optimizer.__init__` assigns an empty one, which is ignored.
    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:  # type: ignore[override]
        merged: dict[torch.Tensor, dict[str, Any]] = {}
        merged.update(self.muon.state)
        merged.update(self.adamw.state)
        return merged

    @state.setter
    def state(self, value: Any) -> None:
        if value:
            raise AttributeError("MuonAdamW.state is a view of its two optimizers' states; use load_state_dict.")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Run the closure (forward + backward) once, then step Muon and AdamW; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a `state_dict()` of a MuonAdamW with the same groups (Muon's first, then AdamW's)."""
        groups = state_dict["param_groups"]
        n_muon = len(self.muon.param_groups)
        if len(groups) != len(self.param_groups) or groups[0].get("name") != "muon":
            names = [g.get("name") for g in groups]
            raise ValueError(
                f"This optimizer state has parameter groups {names}, not those of optim.name 'muon' "
                f"({[g.get('name') for g in self.param_groups]}): the checkpoint was trained with another optimizer. "
                "Resume it with the optimizer it was trained with (its config.yaml: model.optim.name), or start a new "
                "run (drop --ckpt_path) to train with Muon."
            )

        def part(sub: list[dict[str, Any]]) -> dict[str, Any]:
            ids = {i for g in sub for i in g["params"]}
            return {"state": {i: s for i, s in state_dict["state"].items() if i in ids}, "param_groups": sub}

        self.muon.load_state_dict(part(groups[:n_muon]))
        self.adamw.load_state_dict(part(groups[n_muon:]))
        # The inner optimizers now hold new group dicts: point this optimizer's (same list object) at them.
        self.param_groups[:] = self.muon.param_groups + self.adamw.param_groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self._built:  # after construction: say where a new group would have to go
            raise NotImplementedError("Add parameter groups to MuonAdamW.muon or MuonAdamW.adamw, not to the wrapper.")
        super().add_param_group(param_group)


def build_muon_adamw(model: nn.Module, cfg: OptimConfig, fused: bool) -> MuonAdamW:
    """The optimizer `optim.name: muon` asks for, from an `OptimConfig` (see `OptimConfig.muon`)."""
    muon_params, _ = muon_split(model)
    chosen = {id(p) for p in muon_params}
    groups = weight_decay_groups(model, cfg.weight_decay, scope=cfg.weight_decay_scope)
    adamw_groups = [{**g, "params": [p for p in g["params"] if id(p) not in chosen]} for g in groups]
    m = cfg.muon
    muon_kwargs = dict(
        lr=cfg.lr if m.lr is None else m.lr,
        weight_decay=cfg.weight_decay if m.weight_decay is None else m.weight_decay,
        momentum=m.momentum,
        nesterov=m.nesterov,
        ns_steps=m.ns_steps,
        ns_coefficients=tuple(m.ns_coefficients),
        eps=m.eps,
        adjust_lr_fn=m.adjust_lr_fn,
    )
    adamw_kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused)
    return MuonAdamW(muon_params, adamw_groups, muon_kwargs, adamw_kwargs)


def build_optimizer(model: nn.Module, cfg: OptimConfig, fused: bool) -> torch.optim.Optimizer:
    """`torch.optim.AdamW` on every parameter (`optim.name` "adamw") or `MuonAdamW` ("muon"), from an `OptimConfig`."""
    if cfg.name == "muon":
        return build_muon_adamw(model, cfg, fused)
    groups = weight_decay_groups(model, cfg.weight_decay, scope=cfg.weight_decay_scope)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused)
