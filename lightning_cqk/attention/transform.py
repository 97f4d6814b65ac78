"""The q/k transform stage: what every backend that forms per-head q and k runs between its projections and scores.

Order (one function, `qk_stage`, used by `standard` and its variants, `differential` and `mla`)::

    q, k = RMSNorm(q), RMSNorm(k)              optional QK-norm (per head, learned gain; arXiv 2511.21377)
    q, k = T(q, k)                             the learned q/k transform, when rope_order = "pre" (default)
    q, k = RoPE(q), RoPE(k)                    when config.position == "rope" (the backend says which features rotate)
    q, k = T(q, k)                             the learned q/k transform, when rope_order = "post"
    scores = q k^T / sqrt(d)

T acts on each token's pair (q_h, k_h) of every head h on its own (no mixing across tokens), so causality and KV
caching are untouched: a cache stores the transformed k (decode mode runs this stage on the new tokens only, with
RoPE tables gathered at their positions; `standard` and `differential` cache the keys leaving it, whatever
rope_order, tested equal to the full forward in fp64 in `tests/inference`). T is chosen in the backend options as
``qk_transform: {kind: <name>, <options>...}`` (None: no transform) from `TRANSFORMS`:

    coupled         v1 coupled dynamics (leapfrog / Euler / gradient field), `attention.transforms.dynamics`
    uncoupled_mlp   v1's uncoupled control of matched capacity, `attention.transforms.dynamics`
    invertible      v2 invertible affine coupling (RealNVP-style), `attention.transforms.coupling`

The QK-norm gains and the transform stay registered on the backend (`q_norm`, `k_norm`, `qk_transform`), so a
checkpoint's keys do not depend on the stage; the backend hands them to `qk_stage`.

Pairing (what a "pair" is for each backend): `standard` MHA: query head h with key head h; `differential`: each of
the nh half-heads (q1 with k1 and q2 with k2 of every differential head); `mla`: the materialised q^h, k^h (no-RoPE
and rotary parts together). Grouped K/V heads (nkv < nh): query head h is paired with its key head g(h) = h // (nh /
nkv) (the head `repeat_interleave` and SDPA's `enable_gqa` pair it with); the transform acts on each (q_h, k_g(h)),
so it yields nh distinct keys: the transformed keys are per query head, and an inference cache holds nh of them (the
GQA saving is kept for values only). Tied q and k (q_eq_k): both enter T equal and leave it different. `mla`: the
stage acts on the up-projected per-head keys, so W_uk cannot be folded into the query; decoding caches the
transformed per-head keys and c_kv (W_uv is still absorbed; `MultiHeadLatentAttention.absorbed_path_refusal` says
why). The deconstructed variants (`static_emb_qk`, `rnd_emb_qk`, `fixed_seq_qk`, `approximate`, `non_approximate`)
do not run this stage: their q and k come from fixed inputs or feed non-softmax mixers, and they state no Q/K
weights to logit control either.

Tests: `tests/contract/test_contract.py` (every composition: identity at init, causality, SDPA == math in fp64),
`tests/unit/attention/test_transform.py` (inverse, log-det, fused == reference, parameter counts by hand, old
checkpoints), `tests/unit/attention/test_base_qk_seam.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from lightning_cqk.attention.kernels.functional import repeat_kv
from lightning_cqk.attention.options import check_option_names
from lightning_cqk.attention.rope import apply_rope

if TYPE_CHECKING:
    from lightning_cqk.attention.base import AttentionContext
    from lightning_cqk.model_config import ModelConfig


@dataclasses.dataclass
class TransformOptions:
    """Options every q/k transform accepts.

    Attributes:
        rope_order: run the transform "pre" (before) RoPE, which keeps RoPE's relative-position property (the
            transform is not rotation-equivariant), or "post" (after) it.
    """

    rope_order: str = "pre"


class QKTransform(nn.Module):
    """Base class of the learned per-token maps (q, k) -> (q', k') on (B, P, T, d) tensors (P pairs of width d).

    Subclasses set `kind` (the name in `qk_transform: {kind: ...}`), `Options`, and implement `forward`.
    """

    kind: ClassVar[str] = ""
    Options: ClassVar[type[TransformOptions]] = TransformOptions
    #: True when `forward` can run inside a checkpointed region that also recomputes the projections.
    recompute: str = "none"

    def __init__(self, config: ModelConfig, layer_idx: int, options: TransformOptions, n_pairs: int, dim: int) -> None:
        super().__init__()
        self.options = options
        self.layer_idx = layer_idx
        self.n_pairs = n_pairs
        self.dim = dim

    @property
    def rope_order(self) -> str:
        return self.options.rope_order

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, keys_kept: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        """(q, k) -> (q', k') on (B, P, T, d) tensors. `keys_kept`: the backend keeps this very k for its own backward
        (a tied v), so a transform that keeps inputs for backward may keep k at no memory cost (a hint; the outputs
        do not depend on it)."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """Re-initialise (called by the backend's `reset_backend_parameters`)."""

    def share_key(self) -> Any:
        """A hashable key: transforms with equal keys in one model share `shared_module()`; None: not shared."""
        return None

    def shared_module_name(self) -> str:
        """Name of the submodule that sharing ties (it must exist when `share_key()` is not None)."""
        raise NotImplementedError

    def stats(self) -> dict[str, torch.Tensor]:
        """Detached per-layer quantities worth logging (no host sync), merged into the backend's probe."""
        return {}

    @classmethod
    def check(cls, config: ModelConfig, layer_idx: int, options: TransformOptions, n_pairs: int, dim: int) -> None:
        """Raise ValueError for impossible options (the message says what to set)."""
        if options.rope_order not in ("pre", "post"):
            raise ValueError(f"qk_transform rope_order={options.rope_order!r}; use 'pre' or 'post'.")

    @classmethod
    def flops_per_token(cls, options: TransformOptions, n_pairs: int, dim: int) -> int:
        """Forward matmul FLOPs per token of one layer's transform (2 per multiply-add)."""
        raise NotImplementedError


def transform_registry() -> dict[str, type[QKTransform]]:
    """kind -> built-in transform class (every `QKTransform` subclass of this package that sets `kind`, found by
    `registry.TRANSFORMS`); plugins (entry-point group `lightning_cqk.qk_transform`) and `module:Class` paths are
    resolved by `parse_transform`."""
    from lightning_cqk.attention.registry import TRANSFORMS

    return TRANSFORMS.builtins


def parse_transform(spec: dict[str, Any] | None) -> tuple[type[QKTransform], TransformOptions] | None:
    """`{kind: ..., **options}` -> (class, parsed options); None -> None. `kind` is a built-in's, an installed plugin's
    (entry-point group `lightning_cqk.qk_transform`) or a `package.module:Class` path; unknown kinds/keys get
    did-you-mean errors."""
    from lightning_cqk.attention.registry import TRANSFORMS

    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"qk_transform must be a mapping like {{kind: invertible, layers: 2}} or null, got {spec!r}.")
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if not isinstance(kind, str):
        raise ValueError(
            f"qk_transform kind={kind!r} is unknown. Choose one of: {', '.join(TRANSFORMS.names())} (or a plugin's "
            "package.module:Class)."
        )
    cls = TRANSFORMS.resolve(kind)
    check_option_names(spec, cls.Options, f"qk_transform kind {kind!r}")
    return cls, cls.Options(**spec)


def check_transform(
    spec: dict[str, Any] | None,
    config: ModelConfig,
    layer_idx: int,
    n_pairs: int,
    dim: int,
    where: str,
    recompute_projections: bool = True,
) -> None:
    """Validate a `qk_transform` spec for a layer with `n_pairs` (q, k) pairs of width `dim`.

    `recompute_projections=False` for backends without v1's recompute="qk" region (it lives in `standard`).
    """
    try:
        parsed = parse_transform(spec)
        if parsed is not None:
            cls, options = parsed
            cls.check(config, layer_idx, options, n_pairs, dim)
            if not recompute_projections and getattr(options, "recompute", None) == "qk":
                raise ValueError(
                    "recompute='qk' (recompute the q/k projections in backward) exists only for the standard family; "
                    "use recompute: flow."
                )
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def build_transform(
    spec: dict[str, Any] | None, config: ModelConfig, layer_idx: int, n_pairs: int, dim: int
) -> QKTransform | None:
    """The transform module a spec asks for (None without one)."""
    parsed = parse_transform(spec)
    if parsed is None:
        return None
    cls, options = parsed
    return cls(config, layer_idx, options, n_pairs, dim)


def transform_flops(spec: dict[str, Any] | None, n_pairs: int, dim: int) -> int:
    """Forward FLOPs per token of the transform a spec asks for (0 without one)."""
    parsed = parse_transform(spec)
    if parsed is None:
        return 0
    cls, options = parsed
    return cls.flops_per_token(options, n_pairs, dim)


def tie_transforms(backends: list[nn.Module]) -> None:
    """Share one module between the layers whose transforms ask for it (`share_key`), in layer order."""
    owners: dict[Any, nn.Module] = {}
    for backend in backends:
        transform = getattr(backend, "qk_transform", None)
        if transform is None:
            continue
        key = transform.share_key()
        if key is None:
            continue
        name = transform.shared_module_name()
        if key in owners:
            setattr(transform, name, owners[key])
        else:
            owners[key] = getattr(transform, name)


def qk_stage(
    q: torch.Tensor,
    k: torch.Tensor,
    ctx: AttentionContext,
    *,
    q_norm: nn.Module | None = None,
    k_norm: nn.Module | None = None,
    transform: QKTransform | None = None,
    rope: Callable[[torch.Tensor], torch.Tensor] | None = None,
    keys_kept: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm, the learned transform and RoPE, in the order of the module docstring.

    Args:
        q: (B, nq, T, d) queries; `q is k` for a tied q (q_eq_k): one norm (k_norm) and one rotation keep them one
            tensor when there is no transform.
        k: (B, nk, T, d) keys, nk dividing nq (grouped K/V heads). With a transform they are repeated to nq heads
            (each query head paired with its key head), so the keys returned are (B, nq, T, d).
        ctx: the attention context (rotary tables).
        q_norm, k_norm: per-head norms (None: no QK-norm).
        transform: the learned q/k transform (None: none).
        rope: rotation of a (B, n, T, d) tensor; default: `apply_rope` with the context's tables on all d features
            (a no-op without RoPE). `mla` passes its rotation of the trailing d_rope features.
        keys_kept: the backend keeps the k it passes for its own backward (a tied v); the transform is told so when
            that same k reaches it (no norm, rotation or head repeat before it).

    Returns:
        q (B, nq, T, d), k (B, nk or nq, T, d).
    """
    if rope is None:

        def rope(t: torch.Tensor) -> torch.Tensor:
            return apply_rope(t, ctx.cos, ctx.sin)

    tied, raw_k = q is k, k
    if k_norm is not None:
        k = k_norm(k)  # (B, nk, T, d)
    if tied:
        q = k
    elif q_norm is not None:
        q = q_norm(q)  # (B, nq, T, d)
    if transform is None:
        k = rope(k)  # (B, nk, T, d)
        return (k, k) if tied else (rope(q), k)
    if transform.rope_order == "post":
        k = rope(k)
        q = k if tied else rope(q)
    k = repeat_kv(k, q.size(1) // k.size(1))  # (B, nq, T, d)
    q, k = transform(q, k, keys_kept=keys_kept and k is raw_k)  # (B, nq, T, d) each
    return (q, k) if transform.rope_order == "post" else (rope(q), rope(k))
