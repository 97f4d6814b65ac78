"""Per-head Q/K learning rates: QuacK (arXiv 2511.21377) and the fixed-factor "Ablation" baseline. Torch only.

Paper: B. Anson and L. Aitchison, "Controlling changes to attention logits", arXiv 2511.21377 (2025); digest in
`docs/papers.md` §3 and §6 item 11. A logit is l = q . k / sqrt(d) with q = x W_Q^h, k = x W_K^h, so a change of
W_Q^h moves it in proportion to |W_K^h| and vice versa. QuacK bounds the change per step by giving each head's query
weights a learning rate inversely proportional to that head's key-weight norm, and the mirror rule for the keys
(Algorithm 1, Frobenius norms, recomputed before every optimizer step)::

    lr(W_Q^h) = tau * eta * |W_K^h|_0 / |W_K^h|        lr(W_K^h) = tau * eta * |W_Q^h|_0 / |W_Q^h|

where eta is whatever the learning-rate schedule set for this step and |.|_0 the norm at initialisation, so at init
every factor is tau (tau = the relative initial Q/K learning rate). For MLA (eq. 22 / Algorithm 2), with the
matrices named as in `lightning_cqk.attention.backends.mla` and h a head (W_dq, W_dkv, W_kr are shared by all heads)::

    g_uq^h = (|W_dq| |W_uk^h| |W_dkv|)^-1          g_uk^h = (|W_uq^h| |W_dq| |W_dkv|)^-1
    g_qr^h = (|W_dq| |W_kr|)^-1                    g_kr   = (max_h |W_qr^h| |W_dq|)^-1
    g_dq   = min{(max_h |W_uq^h| |W_uk^h| |W_dkv|)^-1, (max_h |W_qr^h| |W_kr|)^-1}
    g_dkv  = (max_h |W_uq^h| |W_dq| |W_uk^h|)^-1
    lr(W) = tau * eta * g_W(t) / g_W(0)

Implementation: scale the optimizer's **update**, not the gradient (Adam and Muon normalise the gradient, so scaling it
would change nothing). Before `optimizer.step()` the controller snapshots each Q/K weight and computes the per-head
factors; after it, each head's rows are set to ``before + factor * (after - before)``. For AdamW this is exactly a
per-head learning rate ``factor * lr`` including the decoupled weight decay (``scale_weight_decay=True``, the default);
with ``scale_weight_decay=False`` the decay keeps the scheduled rate: ``after = before * (1 - lr wd) - factor lr u``.
The factor multiplies whatever learning rate the schedule set (it never touches `param_group["lr"]`), so it composes
with warmup and cosine decay. Factors are computed under `no_grad` in fp32 on the device: no host sync. A parameter
without a gradient (a skipped update) is left untouched. Q/K biases, QK-norm gains and every other parameter keep the
base learning rate. [NS] The paper does not say whether weight decay is scaled; it trains with Muon.

Which layers and matrices: what each backend states through the one seam, `AttentionBackend.qk_weights()`
(`lightning_cqk.attention.base.QKWeights`: the matrices holding each head's query and key rows and the rule, "mha"
or "mla"); this module names no backend class or attribute. `standard` and everything built on it (the q/k transforms
included) state q_proj/k_proj, head h = rows [h hs, (h+1) hs); `differential` the same per half-head (each of its two
softmax maps per head is an ordinary q.k map); `mla` its six latent matrices (the MLA rule). Layers that state none
(e.g. `mlp`, `approximate` in a hybrid) keep the base learning rate; a model with no eligible layer is refused.
With a learned q/k transform the logits are no longer bilinear in W_Q, W_K, so the rule bounds the change of the
transform's inputs, not of the logits. Projection sharing and grouped heads (the seam's block counts):
    q_eq_k / q_eq_k_eq_v (one matrix W = W_Q = W_K): both rules give the same factor tau |W^h|_0 / |W^h|, applied
        once to the tied matrix.
    grouped K/V heads (nkv < nh): query head h uses its K head g(h) = h // (nh / nkv); a K head shared by several
        query heads takes g_K = (max over its query heads |W_Q^h|)^-1, the paper's treatment of shared matrices in
        MLA (so at init it is still tau).

`fixed` (the paper's "Ablation"): the same update scaling with a constant factor tau on every Q/K matrix (MLA: all
six latent Q/K matrices).

Tests (`tests/e2e/optim/test_quack.py`): at init every factor equals tau (MHA, GQA, tied, MLA); doubling W_K^h halves
W_Q^h's factor and no other head's; an AdamW step's update of W_Q^h shrinks by exactly that factor (with and without
scaled weight decay), composed with a schedule; the MLA factors follow the rule above; skipped updates stay skipped;
finite under bf16 autocast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lightning_cqk.model.sharding import is_dtensor


@dataclass(frozen=True)
class HeadRows:
    """A weight matrix whose output rows form `n_blocks` equal contiguous blocks (one per head, 1 when shared).

    Attributes:
        path: module path of the owning nn.Linear inside the model (e.g. "blocks.3.attn.q_proj").
        n_blocks: number of row blocks.
        role: short name used in metric keys ("q", "k", "qk" for a tied matrix; MLA: "dq", "uq", "qr", "dkv", "uk",
            "kr").
        layer: the block index.
    """

    path: str
    n_blocks: int
    role: str
    layer: int


def eligible_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(layer index, attention backend) of every layer whose backend states per-head Q/K weights (`qk_weights()`)."""
    layers = []
    for i, block in enumerate(model.blocks):
        qk_weights = getattr(block.attn, "qk_weights", None)
        if callable(qk_weights) and qk_weights() is not None:
            layers.append((i, block.attn))
    if not layers:
        names = sorted({getattr(type(block.attn), "name", type(block.attn).__name__) for block in model.blocks})
        raise ValueError(
            f"Q/K learning-rate control needs layers with per-head query and key matrices, but no layer's backend "
            f"states any (`qk_weights()` is None for {names}). Use a backend that forms per-head q and k (e.g. "
            "'standard', 'differential', 'mla'), or drop logit_control."
        )
    return layers


def layer_targets(layer: int, attn: nn.Module) -> list[HeadRows]:
    """The HeadRows of one layer, from its backend's `qk_weights()`, in the seam's order."""
    base = f"blocks.{layer}.attn"
    return [HeadRows(f"{base}.{w.name}", w.n_blocks, w.role, layer) for w in attn.qk_weights().weights]


def head_norms(weight: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Frobenius norm of each of `n_blocks` contiguous row blocks of `weight`, (n_blocks,) in fp32 (no grad).

    A sharded weight (FSDP2 DTensor) is gathered first, so every rank gets the norms of the whole heads."""
    weight = weight.detach()
    if is_dtensor(weight):
        weight = weight.full_tensor()  # (rows, cols): the whole matrix on every rank
    return weight.float().reshape(n_blocks, -1).norm(dim=1)


def like_weight(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`values` (the same on every rank) as an operand of in-place ops on `weight`: a replicated DTensor when
    `weight` is sharded (FSDP2; no communication), else `values` itself."""
    if not is_dtensor(weight):
        return values
    from torch.distributed.tensor import DTensor, Replicate

    mesh = weight.device_mesh
    return DTensor.from_local(values, mesh, [Replicate()] * mesh.ndim, run_check=False)


def _rows(factor: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per-block factors (n,) -> per-row factors broadcastable to `weight` (rows, 1, ...), in weight's dtype."""
    per_row = factor.repeat_interleave(weight.size(0) // factor.numel())  # (rows,)
    return like_weight(per_row.view(-1, *([1] * (weight.dim() - 1))).to(weight.dtype), weight)


class UpdateScaler(nn.Module):
    """Scale the optimizer's update of per-head row blocks of weight matrices by per-block factors.

    Subclasses define the targets (`self.targets`) and `raw_factors()`; the factor of a target is
    ``tau * raw(t) / raw(0)`` with raw(0) kept as a persistent buffer (so a resumed run uses the original init).
    Call `before_step(optimizer)` right before `optimizer.step()` and `after_step(optimizer)` right after.

    The model is referenced, not registered: this module's state_dict holds only the raw(0) buffers.
    """

    def __init__(self, model: nn.Module, targets: list[HeadRows], tau: float, scale_weight_decay: bool = True) -> None:
        super().__init__()
        if not tau > 0:
            raise ValueError(f"logit_control.tau must be positive, got {tau}.")
        object.__setattr__(self, "_model", model)  # not a submodule: no duplicate parameters or state-dict keys
        self.targets = targets
        self.tau = float(tau)
        self.scale_weight_decay = scale_weight_decay
        with torch.no_grad():
            for i, raw in enumerate(self.raw_factors()):
                self.register_buffer(f"raw0_{i}", raw.clone(), persistent=True)
        self._before: list[torch.Tensor] | None = None
        self._factors: list[torch.Tensor] | None = None

    # ------------------------------------------------------------------------------------------------ rules
    def weight(self, target: HeadRows) -> torch.Tensor:
        """The current weight of `target` (looked up by path, so `.to()` and re-wrapping never leave it stale)."""
        return self._model.get_submodule(target.path).weight

    def raw_factors(self) -> list[torch.Tensor]:
        """raw(t) for every target: (n_blocks,) fp32 tensors on the weights' device."""
        raise NotImplementedError

    @torch.no_grad()
    def factors(self) -> list[torch.Tensor]:
        """The factor of every target now: tau * raw(t) / raw(0), (n_blocks,) fp32, no host sync."""
        return [self.tau * raw / getattr(self, f"raw0_{i}") for i, raw in enumerate(self.raw_factors())]

    # ------------------------------------------------------------------------------------------ step hooks
    @torch.no_grad()
    def before_step(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Snapshot the target weights and compute this step's factors (call right before optimizer.step())."""
        self._factors = self.factors()
        self._before = [self.weight(t).detach().clone() for t in self.targets]

    @torch.no_grad()
    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Rescale each target's update (after - before) row block by row block by its factor."""
        if self._before is None or self._factors is None:
            raise RuntimeError("after_step() without before_step(): call before_step() right before optimizer.step().")
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        for target, before, factor in zip(self.targets, self._before, self._factors, strict=True):
            weight = self.weight(target)
            group = groups.get(id(weight))
            if group is None or weight.grad is None:
                continue  # not optimised, or this step skipped it (no gradient): nothing was updated
            rows = _rows(factor, weight)  # (rows, 1)
            decay = float(group.get("lr", 0.0)) * float(group.get("weight_decay", 0.0))
            weight.sub_(before).mul_(rows)  # factor * (after - before)
            if self.scale_weight_decay or decay == 0.0:
                weight.add_(before)
            else:
                # AdamW: after - before = -lr wd before - lr u; keep the decay term at the scheduled rate.
                weight.add_(before * (1.0 - (1.0 - rows) * decay))
        self._before = self._factors = None

    # --------------------------------------------------------------------------------------------- logging
    @torch.no_grad()
    def stats(self, prefix: str = "optim/quack") -> dict[str, torch.Tensor]:
        """Mean factor per role and layer, e.g. {"optim/quack/q/layer_03": tensor}, plus the global min and max."""
        factors = self.factors()
        out = {f"{prefix}/{t.role}/layer_{t.layer:02d}": f.mean() for t, f in zip(self.targets, factors, strict=True)}
        flat = torch.cat(factors)
        out[f"{prefix}/min"], out[f"{prefix}/max"] = flat.min(), flat.max()
        return out


def qk_targets(model: nn.Module) -> list[HeadRows]:
    """Every per-head Q/K matrix of the eligible layers (see `eligible_layers`)."""
    targets: list[HeadRows] = []
    for layer, attn in eligible_layers(model):
        targets += layer_targets(layer, attn)
    return targets


class FixedQKFactor(UpdateScaler):
    """The "Ablation" baseline: every Q/K matrix's update (MLA: the six latent Q/K matrices) scaled by a constant."""

    def __init__(self, model: nn.Module, tau: float, scale_weight_decay: bool = True) -> None:
        super().__init__(model, qk_targets(model), tau, scale_weight_decay)

    def raw_factors(self) -> list[torch.Tensor]:
        return [torch.ones(t.n_blocks, device=self.weight(t).device) for t in self.targets]


class QuacK(UpdateScaler):
    """QuacK: per-head Q/K learning rates inversely proportional to the partner matrices' norms (see module doc)."""

    def __init__(self, model: nn.Module, tau: float = 1.0, scale_weight_decay: bool = True) -> None:
        super().__init__(model, qk_targets(model), tau, scale_weight_decay)

    def raw_factors(self) -> list[torch.Tensor]:
        raws: list[torch.Tensor] = []
        i = 0
        while i < len(self.targets):
            target = self.targets[i]
            if target.role == "qk":  # tied W_Q = W_K: both rules give 1 / |W^h|
                raws.append(1.0 / head_norms(self.weight(target), target.n_blocks))
                i += 1
            elif target.role == "q":
                raws += self._mha(self.targets[i], self.targets[i + 1])
                i += 2
            else:  # MLA: six consecutive targets (five without a query latent: no dq)
                n = 6 if target.role == "dq" else 5
                raws += self._mla(self.targets[i : i + n])
                i += n
        return raws

    def _mha(self, q: HeadRows, k: HeadRows) -> list[torch.Tensor]:
        """[raw_Q (nh,), raw_K (nkv,)]: raw_Q^h = 1 / |W_K^g(h)|, raw_K^g = 1 / max_{h in g} |W_Q^h|."""
        n_q = head_norms(self.weight(q), q.n_blocks)  # (nh,)
        n_k = head_norms(self.weight(k), k.n_blocks)  # (nkv,)
        group = q.n_blocks // k.n_blocks
        raw_q = 1.0 / n_k.repeat_interleave(group)  # (nh,)
        raw_k = 1.0 / n_q.view(k.n_blocks, group).amax(dim=1)  # (nkv,)
        return [raw_q, raw_k]

    def _mla(self, targets: list[HeadRows]) -> list[torch.Tensor]:
        """Eq. 22 of arXiv 2511.21377 for one MLA layer, in the order dq, uq, qr, dkv, uk, kr.

        Without a query latent (no dq target) W_dq is the identity: |W_dq| = 1 and dq gets no factor."""
        norms = [head_norms(self.weight(t), t.n_blocks) for t in targets]  # shared ones (1,)
        if len(targets) == 5:
            norms.insert(0, torch.ones(1, device=norms[0].device))
        dq, uq, qr, dkv, uk, kr = norms
        raw_uq = 1.0 / (dq * uk * dkv)  # (nh,)
        raw_dq = torch.minimum(1.0 / (uq * uk * dkv).amax(), 1.0 / (qr * kr).amax()).reshape(1)
        raw_qr = (1.0 / (dq * kr)).expand_as(qr)  # (nh,)
        raw_dkv = (1.0 / (uq * dq * uk).amax()).reshape(1)
        raw_uk = 1.0 / (uq * dq * dkv)  # (nh,)
        raw_kr = (1.0 / (qr * dq).amax()).reshape(1)
        raws = [raw_dq, raw_uq, raw_qr.clone(), raw_dkv, raw_uk, raw_kr]
        return raws if len(targets) == 6 else raws[1:]
