"""QK-clip (Kimi K2's MuonClip, as the baseline of arXiv 2511.21377): cap each head's max attention logit. Torch only.

Rule (`docs/papers.md` §3.4): after each optimizer step, for every head h with S_max^h, the largest logit of head h
measured since the last step, set gamma_h = min(1, tau_clip / S_max^h) and rescale

    MHA:   W_Q^h <- sqrt(gamma_h) W_Q^h,   W_K^h <- sqrt(gamma_h) W_K^h          (the logit scales by gamma_h)
    MLA:   W_uq^h, W_uk^h <- sqrt(gamma_h) W,   W_qr^h <- gamma_h W             (the shared rope key W_kr untouched)

so a head whose logits exceeded tau_clip would, on the same input, peak at exactly tau_clip. Projection biases of the
rescaled rows are rescaled with them (keeps the logit exactly proportional). Variants of `standard`:
    q_eq_k / q_eq_k_eq_v (one matrix): the logit is quadratic in it, so W^h <- sqrt(gamma_h) W^h once.
    grouped K/V heads (nkv < nh): a K head serves several query heads, so, as MLA's shared rope key, it is left alone
        and W_Q^h <- gamma_h W_Q^h.
    qk_norm: the norm divides the scale out again, so clipping has no effect (QK-norm already bounds the logits).
    a learned q/k transform (coupled, uncoupled_mlp, invertible): the logits are not bilinear in W_Q, W_K after it,
        so the cap is approximate.
    differential: per half-head map (its heads' q1/q2 and k1/k2 rows), exactly as MHA.
Which rows: what the backend states through `AttentionBackend.qk_weights()` (rule "mha": q and k blocks, or one
"qk" matrix; rule "mla": the six latent matrices, of which uq, uk, qr are rescaled); no backend class or attribute
is named here.

Measurement: SDPA does not return logits, so a forward hook on every eligible attention module recomputes them with
the explicit math path (`AttentionBackend.attention_logits`: projections, norms, RoPE, scores; no softmax, no values)
under `no_grad` during training forwards only (module in train mode with grad enabled; validation and AttentionStats
probes do not count), and keeps a running per-head max on the device (max over micro-batches; all-reduced with MAX
across ranks before clipping, so every rank applies the same rescaling and the replicas stay identical). Cost: a
second q/k projection and a T x T score matrix per layer and micro-batch (evaluated in batch chunks to bound memory);
this is why the paper calls QK-clip "bespoke". No host sync: gamma is applied with tensor ops whatever its value.

Tests (`tests/e2e/optim/test_qk_clip.py`): after a step on a model whose logits exceed tau_clip, recomputing the logits
on
the same batch gives a per-head max of exactly tau_clip for the clipped heads and unchanged weights for the others
(MHA, MLA, tied, grouped); validation forwards are not measured.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lightning_cqk.attention import AttentionContext
from lightning_cqk.optim.quack import eligible_layers, like_weight

#: Logits of at most this many elements are materialised at once when measuring (fp32: 256 MB).
MAX_LOGIT_ELEMENTS = 2**26


def head_max_logits(attn: nn.Module, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """Per-head max logit (nh,) of `attn` on x (B, T, C), fp32, computed in batch chunks (no host sync)."""
    B, T, _ = x.shape
    n_head = attn.config.n_head
    chunk = max(1, MAX_LOGIT_ELEMENTS // max(1, n_head * T * T))
    maxima = [attn.attention_logits(x[i : i + chunk], ctx).amax(dim=(0, 2, 3)) for i in range(0, B, chunk)]
    return torch.stack(maxima).amax(dim=0).float()  # (nh,)


class QKClip(nn.Module):
    """Measure per-head max logits during training forwards; rescale W_Q^h, W_K^h after each step (see module doc).

    Call `after_step(optimizer)` right after `optimizer.step()`; `before_step` is a no-op kept for symmetry with
    `UpdateScaler`. The model is referenced, not registered (no state-dict keys).
    """

    def __init__(self, model: nn.Module, tau_clip: float = 100.0) -> None:
        super().__init__()
        if not tau_clip > 0:
            raise ValueError(f"logit_control.tau_clip must be positive, got {tau_clip}.")
        object.__setattr__(self, "_model", model)
        self.tau_clip = float(tau_clip)
        self.layers = [layer for layer, _ in eligible_layers(model)]
        self._max: dict[int, torch.Tensor] = {}  # layer -> running per-head max since the last step
        self._last: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (max logit, heads clipped)
        self._handles = [model.blocks[i].attn.register_forward_hook(self._measure_hook(i)) for i in self.layers]

    def _measure_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if not (module.training and torch.is_grad_enabled()):
                return  # validation, probes and inference are not training steps
            x, ctx = args[0], args[1]
            with torch.no_grad():
                m = head_max_logits(module, x.detach(), ctx)  # (nh,)
            prev = self._max.get(layer)
            self._max[layer] = m if prev is None else torch.maximum(prev, m)

        return hook

    def remove_hooks(self) -> None:
        """Detach the measuring hooks from the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def measured(self) -> dict[int, torch.Tensor]:
        """The per-head max logits (nh,) measured since the last step, by layer."""
        return dict(self._max)

    def before_step(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Nothing to do before the step (measurement happens in the forward hooks)."""

    @torch.no_grad()
    def after_step(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Rescale the Q/K rows of every head whose measured max logit exceeded tau_clip; reset the measurements."""
        if not self._max:
            return
        layers = sorted(self._max)
        maxima = torch.stack([self._max[i] for i in layers])  # (n_layers, nh)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX)  # every rank must apply the same rescaling
        over = maxima > self.tau_clip
        gamma = torch.where(over, self.tau_clip / maxima.clamp_min(1e-30), torch.ones_like(maxima))  # (n_layers, nh)
        for row, layer in enumerate(layers):
            self._clip(self._model.blocks[layer].attn, gamma[row])
            self._last[layer] = (maxima[row].amax(), over[row].sum())
        self._max = {}

    @staticmethod
    def _scale_rows(linear: nn.Linear, factor: torch.Tensor) -> None:
        """Multiply the rows of head block h of `linear` (weight and bias) by factor[h]."""
        per_row = factor.repeat_interleave(linear.weight.size(0) // factor.numel())  # (rows,)
        linear.weight.mul_(like_weight(per_row.unsqueeze(1).to(linear.weight.dtype), linear.weight))
        if linear.bias is not None:
            linear.bias.mul_(like_weight(per_row.to(linear.bias.dtype), linear.bias))

    def _clip(self, attn: nn.Module, gamma: torch.Tensor) -> None:
        root = gamma.sqrt()
        spec = attn.qk_weights()
        weights = {w.role: w for w in spec.weights}

        def scale(role: str, factor: torch.Tensor) -> None:
            self._scale_rows(attn.get_submodule(weights[role].name), factor)

        if spec.rule == "mla":
            scale("uq", root)
            scale("uk", root)
            scale("qr", gamma)  # the shared rope key W_kr stays: the query side takes the whole factor
        elif "qk" in weights:  # tied q = k: the logit is quadratic in the one matrix
            scale("qk", root)
        elif weights["k"].n_blocks < weights["q"].n_blocks:  # shared K heads stay; the query head takes the factor
            scale("q", gamma)
        else:
            scale("q", root)
            scale("k", root)

    @torch.no_grad()
    def stats(self, prefix: str = "optim/qk_clip") -> dict[str, torch.Tensor]:
        """Per layer, from the last clipping step: the max logit measured and the number of heads clipped."""
        out: dict[str, torch.Tensor] = {}
        for layer, (max_logit, clipped) in sorted(self._last.items()):
            out[f"{prefix}/max_logit/layer_{layer:02d}"] = max_logit
            out[f"{prefix}/clipped_heads/layer_{layer:02d}"] = clipped.float()
        return out
