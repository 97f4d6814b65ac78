"""The one contract every attention backend follows.

Notation used in shape comments throughout `lightning_cqk.attention` and `lightning_cqk.model`:

    B   batch size                 T   sequence length
    C   model width (n_embd)       nh  number of query heads
    hs  head size (C // nh)        nkv number of key/value heads (grouped-query attention)

A backend is an `nn.Module` built as ``Backend(config, layer_idx, options)`` and called as
``backend(x, ctx) -> y`` with ``x, y: (B, T, C)``. Everything a backend may need besides `x` travels in the
`AttentionContext` (rotary tables, the token embeddings for variants that attend on them, the per-layer states of a
fixed reference stream for variants whose q and k come from it), so the transformer block never branches on the
variant. Backends declare their options as a dataclass (`Options`), which is how options are
validated (unknown key -> did-you-mean error) and documented.

Conventions the model relies on:
- the output projection back to the residual stream is called `out_proj` (it gets the scaled GPT-2 init);
- modules shared by several layers are tied in the classmethod `share_across_layers(backends)`;
- backend-specific parameters that need their own init are set in `reset_backend_parameters()`, which the model
  calls after its generic init;
- `forward_flops_per_token(config, options, seq_len)` gives analytic FLOPs for compute-matched budgets;
- `impl="math"` selects the explicit reference path (the test oracle), `impl="sdpa"` the fused fast path.
- a backend that sets `uses_reference_stream` gives the model a fixed input (`reference_input`); the model runs it
  through its own blocks before the batch and hands each layer's state to attention as `ctx.reference`.
- the optimizer and instruments find the Q/K weights through `qk_weights()` (the one seam: which matrices hold
  each head's query and key rows, and which QuacK rule applies) and the gradient-norm groups through
  `parameter_group(name)`; nothing outside `lightning_cqk.attention` names a backend class or attribute.
- instruments read a backend through `attention_logits(x, ctx)` (the pre-softmax logits of its softmax maps, explicit
  math; None without a softmax map) and `probe(x, ctx)` (per-layer statistics: max |logit|, entropy, sink mass, plus
  `dynamics_stats()` where a backend defines it); neither is on the training path.

The decode contract (incremental inference with a cache, issue 16):
- ``layer_cache = backend.new_cache(batch_size, max_len, device, dtype)`` builds this layer's `cache.LayerCache`
  (preallocated buffers with the time axis at dim 2, plus fixed-size recurrent `state`), or returns None when the
  layer keeps nothing between forwards. What a backend caches is the paper's cache, stated in its docstring, and its
  bytes per token equal `kv_cache_values_per_token` x the element size (tested for every backend).
- decode mode is ``ctx.positions is not None``; `backend(x, ctx)` is then called on the NEXT T tokens of every row
  (x (B, T, C)), `ctx.cache` is this layer's LayerCache (None if `new_cache` returned None), `ctx.positions`
  (B, T) the tokens' positions (real tokens before them in their row: left padding does not count), `ctx.cos` /
  `ctx.sin` the RoPE tables gathered at them, (B, 1, T, hs/2) (they broadcast in `rope.apply_rope` like the
  training tables (T, hs/2)), `ctx.key_valid` (B, L) which of the L = cache.length + T keys are real tokens,
  `ctx.attn_mask` the boolean mask (True: may attend) of the new queries over the L keys, broadcastable to
  (B, 1, T, L) (None: every key is visible, i.e. T == 1 without padding) for `functional.masked_attention`, and
  `ctx.key_cos()` / `ctx.key_sin()` the RoPE tables at the L keys' positions (B, 1, L, hs/2), for caches that
  rotate keys when scoring. The backend appends what it keeps (`LayerCache.append`, which writes at
  [cache.length, cache.length + T) and returns the views up to length + T) and attends over it; it never advances
  `cache.length` (the model does, once per forward, after all layers ran). Pad queries' outputs are
  finite garbage (each query may always attend to itself); padded keys are never attended to by real queries.
- decoding in fp64 from an empty cache token by token, or after a prefill of any length, gives the full forward's
  outputs to 1e-10 (`tests/inference`). No host syncs beyond python ints (`cache.length`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from lightning_cqk.attention.kernels.functional import softmax_map_stats
from lightning_cqk.attention.options import check_option_names
from lightning_cqk.errors import ConfigError

if TYPE_CHECKING:
    from lightning_cqk.attention.cache import LayerCache
    from lightning_cqk.model_config import ModelConfig


#: Per-head Q/K weight roles: MHA rule ("q", "k", or "qk" for one matrix serving both) and the MLA rule (arXiv
#: 2511.21377 eq. 22: the six latent matrices in this order).
MHA_ROLES = ("q", "k", "qk")
MLA_ROLES = ("dq", "uq", "qr", "dkv", "uk", "kr")
#: Gradient-norm group of each role: query side "q", key side "k" (W_dkv feeds keys and values; counted under k).
ROLE_GROUPS = {"q": "q", "k": "k", "qk": "k", "dq": "q", "uq": "q", "qr": "q", "dkv": "k", "uk": "k", "kr": "k"}


@dataclass(frozen=True)
class QKWeight:
    """One matrix holding query or key rows, as a backend states it.

    Attributes:
        name: path of the module (an `nn.Linear`: `.weight` (rows, in), optional `.bias`) inside the backend.
        role: one of `MHA_ROLES` or `MLA_ROLES`.
        n_blocks: its output rows form this many equal contiguous blocks, one per head (1: shared by all heads).
    """

    name: str
    role: str
    n_blocks: int


@dataclass(frozen=True)
class QKWeights:
    """The per-head Q/K weights of a layer and the logit-control rule they follow.

    Attributes:
        rule: "mha" (weights = (q, k), or (qk,) when one matrix is both; k may have fewer blocks than q: grouped
            K/V heads, query block h reads key block h // (n_q / n_k)) or "mla" (weights = the six `MLA_ROLES`;
            five without a query latent, whose W_dq is the identity).
        weights: the matrices, in the order above.
    """

    rule: str
    weights: tuple[QKWeight, ...]

    def __post_init__(self) -> None:
        roles = tuple(w.role for w in self.weights)
        if self.rule == "mha" and roles not in (("q", "k"), ("qk",)):
            raise ValueError(f"QKWeights(rule='mha') needs roles ('q', 'k') or ('qk',), got {roles}.")
        if self.rule == "mha" and len(roles) == 2 and self.weights[0].n_blocks % self.weights[1].n_blocks:
            raise ValueError("QKWeights: the query blocks must be a multiple of the key blocks.")
        if self.rule == "mla" and roles not in (MLA_ROLES, MLA_ROLES[1:]):
            raise ValueError(
                f"QKWeights(rule='mla') needs roles {MLA_ROLES} (without 'dq': no query latent), got {roles}."
            )
        if self.rule not in ("mha", "mla"):
            raise ValueError(f"QKWeights rule {self.rule!r}; use 'mha' or 'mla'.")


@dataclass
class AttentionContext:
    """Per-forward inputs shared by all blocks.

    Attributes:
        cos: RoPE cosine table, (T, hs // 2) or None when the model does not use RoPE.
        sin: RoPE sine table, same shape as `cos`.
        embeddings: the token embeddings that entered the first block, (B, T, C); for variants that need them.
        reference: for models with a backend that sets `uses_reference_stream`: `reference[i]` is what block i's
            attention receives (its input norm applied) when the model runs the fixed reference stream, (1, L, C)
            with L >= T; listed for every layer up to the last one that reads it. None otherwise.
        layer_reference: `reference[i]` of the block being run, (1, L, C), set by the model for each block (a copy of
            the context per block, `for_layer`), so that a backend reads a tensor rather than indexing the list by its
            layer index: one compiled graph serves every layer (indexing by a Python int specialises each layer's
            graph). None outside a GPT pass; a backend then reads `reference[layer_idx]`.

    Decode mode only (all None in training; see the module docstring's decode contract):
        cache: this layer's `LayerCache` (the model sets it before each block), or None for a layer that caches
            nothing.
        positions: (B, T) long, the new tokens' positions (real tokens before them in their row); cos and sin are
            then the RoPE tables gathered at them, (B, 1, T, hs/2).
        key_valid: (B, L) bool, which of the L = cache.length + T keys are real tokens (False: left padding).
        attn_mask: bool, broadcastable to (B, 1, T, L), True where new query i may attend key j (j <= its own
            index, and j real or j the query itself); None when every key is visible (T == 1, no padding).
        key_positions: (B, L) long, every key's position (pads: 0).
        rope_tables: the model's full RoPE tables (block_size, hs/2) each, for `key_cos` / `key_sin`; None without
            RoPE.
    """

    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    reference: list[torch.Tensor] | None = None
    layer_reference: torch.Tensor | None = None
    cache: LayerCache | None = None
    positions: torch.Tensor | None = None
    key_valid: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None
    key_positions: torch.Tensor | None = None
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None
    _key_rope: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def for_layer(self, layer_idx: int) -> AttentionContext:
        """This context for block `layer_idx`: `layer_reference` set to its reference state (a copy; the same context
        when the model has no reference stream or the layer is past the last one that reads it)."""
        if self.reference is None or layer_idx >= len(self.reference):
            return self
        return replace(self, layer_reference=self.reference[layer_idx])

    @property
    def decoding(self) -> bool:
        """True in decode mode (the model runs the next tokens against a cache)."""
        return self.positions is not None

    def _gather_key_rope(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.rope_tables is None or self.key_positions is None:
            return None
        if self._key_rope is None:  # one gather per forward, shared by every layer
            cos, sin = self.rope_tables  # (block_size, hs/2) each
            self._key_rope = (cos[self.key_positions].unsqueeze(1), sin[self.key_positions].unsqueeze(1))
        return self._key_rope  # (B, 1, L, hs/2) each

    def key_cos(self) -> torch.Tensor | None:
        """Decode mode: RoPE cosines at the positions of all L cached-plus-new keys, (B, 1, L, hs/2); None without
        RoPE."""
        tables = self._gather_key_rope()
        return None if tables is None else tables[0]

    def key_sin(self) -> torch.Tensor | None:
        """Decode mode: RoPE sines at the keys' positions, (B, 1, L, hs/2); None without RoPE."""
        tables = self._gather_key_rope()
        return None if tables is None else tables[1]


@dataclass
class AttentionOptions:
    """Options every backend accepts.

    Attributes:
        impl: "sdpa" for the fused `scaled_dot_product_attention` fast path, "math" for the explicit softmax path
            (the reference used as a test oracle; it can also return attention probabilities).
    """

    impl: Literal["sdpa", "math"] = "sdpa"


class AttentionBackend(nn.Module):
    """Base class: fixes the constructor and forward contract of all backends, built-in or plugin.

    Public API (docs/your-attention.md: which members are required, which optional), changed only compatibly, like
    `AttentionOptions` and `AttentionContext`. Subclasses set `name` (their registry key: a built-in is found by it
    in its file, a plugin also declares it as an entry point, `registry.py`), `Options` (a dataclass derived from
    `AttentionOptions`) and implement `forward`.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[AttentionOptions]] = AttentionOptions
    #: True for backends that read `ctx.reference`: the model then runs `reference_input` through its blocks first.
    uses_reference_stream: ClassVar[bool] = False

    def __init__(self, config: ModelConfig, layer_idx: int, options: AttentionOptions) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.options = options

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:  # pragma: no cover - abstract
        """Map (B, T, C) -> (B, T, C), attending causally."""
        raise NotImplementedError

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: AttentionOptions) -> None:
        """Raise ValueError when this backend cannot run with `config` (impossible shapes). Default: accept."""

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: AttentionOptions, seq_len: int) -> int:
        """Analytic forward matmul FLOPs per token of one layer of this backend at context length `seq_len`.

        Convention (as torchtitan and PaLM): 2 FLOPs per multiply-add of every matmul, including the attention
        score and value products over all `seq_len` keys (causal masking is not credited, matching what fused
        kernels and `torch.utils.flop_counter` count); elementwise work (softmax, norms, activations) is ignored.
        Training FLOPs are 3x this (backward = 2x forward); see `lightning_cqk.model.flops`.
        """
        raise NotImplementedError(f"{cls.__name__} does not define forward_flops_per_token")

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: AttentionOptions) -> int:
        """Numbers an inference KV cache stores per token for one layer. Default: K and V for every head, 2 C."""
        return 2 * config.n_embd

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache | None:
        """This layer's decode cache for `batch_size` rows of up to `max_len` tokens (the decode contract in the module
        docstring); None when the layer keeps nothing between forwards. Every backend defines it."""
        raise NotImplementedError(
            f"attention backend {self.name!r} does not define new_cache, so it cannot decode with a cache."
        )

    @classmethod
    def share_across_layers(cls, backends: list[AttentionBackend]) -> None:
        """Tie modules between the layers that use this backend (called once per model, after all blocks exist).

        `backends` are this class's instances in layer order. Default: nothing is shared. A backend whose options
        ask for one module shared by all layers assigns the first layer's module to the others here, so the
        parameter exists once (counted once, decayed once, saved under each layer's key).

        The default ties the learned q/k transforms that ask for it (`transform.tie_transforms`: v1's
        share_dynamics="model", v2's share_layers); an override that ties more should call it too.
        """
        from lightning_cqk.attention.transform import tie_transforms

        tie_transforms(backends)

    def reset_backend_parameters(self) -> None:
        """Initialise parameters that the generic GPT-2 init must not touch. Default: nothing."""

    @classmethod
    def reference_length(cls, config: ModelConfig, options: AttentionOptions) -> int:
        """Length L of the fixed reference stream (only for backends that set `uses_reference_stream`)."""
        raise NotImplementedError(f"{cls.__name__} has no reference stream")

    def reference_input(self, embed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The fixed input (1, L, C) that the model runs through its blocks when `uses_reference_stream` is set.

        `embed` is the model's token embedding (ids (1, L) -> (1, L, C)), for streams made of tokens. The model adds
        its position embedding and dropout, exactly as for real tokens, and takes the stream from the first layer
        that uses one (all such layers must be one backend class, which keeps them consistent).
        """
        raise NotImplementedError(f"{type(self).__name__} sets uses_reference_stream but has no reference_input")

    def qk_weights(self) -> QKWeights | None:
        """The matrices holding each head's query and key rows (the seam QuacK, QK-clip and the gradient-norm
        groups use). None (default): this layer has no per-head Q/K weights, and logit control leaves it alone.

        QK-clip also reads `attention_logits`: its per-head maxima must be one per query block.
        """
        return None

    #: Gradient-norm group of the backend's other submodules, by attribute name (the convention of `out_proj`).
    PARAMETER_GROUPS: ClassVar[dict[str, str]] = {"out_proj": "out", "v_proj": "v"}

    def parameter_group(self, name: str) -> str:
        """Gradient-norm group of the backend's parameter `name` (relative to the backend, e.g. "q_proj.weight").

        q and k from `qk_weights()`, then `PARAMETER_GROUPS`, then "norms" for any normalisation layer, else
        "backend" (learned transforms, lambda, the `mlp` backend's matrices, ...).
        """
        module_path = name.rsplit(".", 1)[0] if "." in name else ""
        spec = self.qk_weights()
        if spec is not None:
            for w in spec.weights:
                if module_path == w.name:
                    return ROLE_GROUPS[w.role]
        top = name.split(".", 1)[0]
        if top in self.PARAMETER_GROUPS:
            return self.PARAMETER_GROUPS[top]
        if module_path:
            module = self.get_submodule(module_path)
            if isinstance(module, (nn.RMSNorm, nn.LayerNorm, nn.GroupNorm)):
                return "norms"
        return "backend"

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor | None:
        """Logits of the softmax maps this layer computes on x (B, T, C), for instruments; None if it has none.

        Returns (B or 1, n_maps, T, T) in fp32 (fp64 for fp64 input), scaled exactly as the softmax sees them, masked
        (future) entries -inf (`functional.causal_logits`). Computed with the explicit math path whatever `impl` is;
        used by `probe` (AttentionStats) and by QK-clip, never by training. Default: None (no softmax map).
        """
        return None

    def probe(self, x: torch.Tensor, ctx: AttentionContext) -> dict[str, torch.Tensor]:
        """Per-layer statistics on the input x (B, T, C): tensors on the device, no host sync.

        Keys: "max_logit", "entropy", "sink" (`functional.softmax_map_stats` of `attention_logits`) when the backend
        has softmax maps, plus whatever `dynamics_stats()` returns when the backend defines it (e.g. "dt", "lambda").
        """
        stats: dict[str, torch.Tensor] = {}
        logits = self.attention_logits(x, ctx)
        if logits is not None:
            stats.update(softmax_map_stats(logits))
        dynamics_stats = getattr(self, "dynamics_stats", None)
        if callable(dynamics_stats):
            stats.update(dynamics_stats())
        return stats

    @classmethod
    def parse_options(cls, options: dict[str, Any] | AttentionOptions | None) -> AttentionOptions:
        """Turn a plain dict into this backend's `Options`, with a readable error for unknown keys."""
        if isinstance(options, cls.Options):
            return options
        from lightning_cqk.attention.registry import label

        options = dict(options or {})
        check_option_names(options, cls.Options, f"attention backend {label(cls)!r}")
        try:
            return cls.Options(**options)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"Invalid options for attention backend {label(cls)!r}: {err}") from err

    def extra_repr(self) -> str:
        return f"layer={self.layer_idx}, options={self.options}"
