"""`coupled` and `uncoupled_mlp`: the v1 names, kept valid, as `standard` attention plus a q/k transform.

Paper: B. Gahtan and A. M. Bronstein, "Coupled Query-Key Dynamics for Attention", arXiv 2604.01683 v1 (2026). The
dynamics themselves (integrators, banks, options, parameter counts, what is and is not symplectic) live in
`lightning_cqk.attention.transforms.dynamics` as the transforms ``qk_transform: {kind: coupled}`` and ``{kind:
uncoupled_mlp}``, which compose with any backend that forms per-head q and k (`transform.py`). These two backends are
exactly

    attention: coupled,       attention_options: {<standard options>, <dynamics options>}
    ==  attention: standard,  attention_options: {<standard options>, qk_transform: {kind: coupled, <dynamics options>}}

(the same for `uncoupled_mlp`), so configs written for v1 keep working, with the flat option names of v1 (steps,
integrator, gradient_field, hidden, zero_init_last, share_dynamics, dt_scope, dt_init, dt_param, rope_order,
recompute; defaults as in `dynamics.py`). Checkpoints written before the transform stage existed keep loading: their
keys ``attn.dynamics.*`` and ``attn.dt_raw`` are renamed on load to ``attn.qk_transform.dynamics.*`` and
``attn.qk_transform.dt_raw`` (tested against state_dicts and logits frozen from the old code,
`tests/unit/attention/fixtures/legacy_coupled_v1.pt`).

Grouped K/V heads (n_kv_groups < n_head), refused by v1, now follow the stage's pairing: query head h is paired with
its key head (`transform.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from lightning_cqk.attention.backends.standard import StandardAttention, StandardOptions
from lightning_cqk.attention.transforms.dynamics import CoupledDynamicsOptions, UncoupledDynamicsOptions

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig

#: Keys of a v1 checkpoint (relative to the attention module) -> their names under the transform stage.
LEGACY_KEYS = (("dynamics.", "qk_transform.dynamics."), ("dt_raw", "qk_transform.dt_raw"))


@dataclass
class DynamicsOptions(StandardOptions):
    """Flat v1 options shared by `coupled` and `uncoupled_mlp` (meaning and defaults: `dynamics.py`)."""

    steps: int = 1
    hidden: int | None = None
    zero_init_last: bool = False
    share_dynamics: Literal["model", "layer"] = "model"
    dt_scope: Literal["layer", "head"] = "layer"
    dt_init: float = 0.1
    dt_param: Literal["softplus", "exp", "raw"] = "softplus"
    rope_order: Literal["pre", "post"] = "pre"
    recompute: Literal["none", "flow", "qk"] = "flow"


@dataclass
class CoupledOptions(DynamicsOptions):
    """Options of `coupled`: the v1 options plus integrator ("leapfrog" | "euler") and gradient_field."""

    integrator: Literal["leapfrog", "euler"] = "leapfrog"
    gradient_field: bool = False


@dataclass
class UncoupledMLPOptions(DynamicsOptions):
    """Options of `uncoupled_mlp`; `hidden` is the coupled width matched (exact parameter parity, `dynamics.py`)."""

    g_k_output_bias: bool = False


def _transform_spec(kind: str, options: DynamicsOptions, transform_options: type) -> dict:
    """The `qk_transform` spec equivalent to a v1 backend's flat options."""
    names = [f.name for f in dataclasses.fields(transform_options)]
    return {"kind": kind, **{name: getattr(options, name) for name in names}}


class _LegacyDynamicsAttention(StandardAttention):
    """`standard` with the q/k transform `kind` built from flat v1 options."""

    kind = ""
    transform_options: type = CoupledDynamicsOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: DynamicsOptions) -> None:
        spec = _transform_spec(self.kind, options, self.transform_options)
        super().__init__(config, layer_idx, dataclasses.replace(options, qk_transform=spec))

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: DynamicsOptions) -> None:
        if options.qk_transform is not None:
            raise ValueError(
                f"attention {cls.name!r} (layer {layer_idx}) already is standard attention with the "
                f"{cls.kind!r} transform; to use another transform write attention: standard with "
                f"qk_transform: {{kind: ...}} (and drop qk_transform here)."
            )
        spec = _transform_spec(cls.kind, options, cls.transform_options)
        super().check_config(config, layer_idx, dataclasses.replace(options, qk_transform=spec))

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: DynamicsOptions, seq_len: int) -> int:
        spec = _transform_spec(cls.kind, options, cls.transform_options)
        return super().forward_flops_per_token(config, dataclasses.replace(options, qk_transform=spec), seq_len)

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: DynamicsOptions) -> int:
        spec = _transform_spec(cls.kind, options, cls.transform_options)
        return super().kv_cache_values_per_token(config, dataclasses.replace(options, qk_transform=spec))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        for old, new in LEGACY_KEYS:
            for key in [k for k in state_dict if k.startswith(prefix + old)]:
                state_dict[prefix + new + key[len(prefix + old) :]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    # v1 attribute names, kept for scripts written against them (the parameters live in `qk_transform`).
    @property
    def dynamics(self) -> torch.nn.Module:
        """The dynamics bank (v1 name; `qk_transform.dynamics`)."""
        return self.qk_transform.dynamics

    @property
    def dt_raw(self) -> torch.nn.Parameter:
        """The raw step-size parameter (v1 name; `qk_transform.dt_raw`)."""
        return self.qk_transform.dt_raw

    def effective_dt(self) -> torch.Tensor:
        """The learned step size of the dynamics, () or (nh,)."""
        return self.qk_transform.effective_dt()

    def evolve(self, q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor | float | None = None):
        """The v1 flow on (B, nh, T, hs) tensors (`qk_transform.forward`); `dt` overrides the learned step."""
        return self.qk_transform(q, k, dt)


class CoupledAttention(_LegacyDynamicsAttention):
    """Coupled query-key dynamics (arXiv 2604.01683 v1): `standard` + ``qk_transform: {kind: coupled}``."""

    name = "coupled"
    Options = CoupledOptions
    kind = "coupled"
    transform_options = CoupledDynamicsOptions


class UncoupledMLPAttention(_LegacyDynamicsAttention):
    """The paper's uncoupled control: `standard` + ``qk_transform: {kind: uncoupled_mlp}`` (exact parity)."""

    name = "uncoupled_mlp"
    Options = UncoupledMLPOptions
    kind = "uncoupled_mlp"
    transform_options = UncoupledDynamicsOptions
