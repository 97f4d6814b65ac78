"""Deconstructed attention, part 2: where q and k come from (`static_emb_qk`, `rnd_emb_qk`, `fixed_seq_qk`).

Paper: H. Xue, N. S. Moosavi and N. Aletras, "Deconstructing Attention: Investigating Design Principles for
Effective Language Modeling", arXiv 2510.11602 (2025), §3 (digest: `docs/papers.md` §4, §6 item 12). Standard
attention takes q, k and v from the layer's own hidden state H. These variants keep v = H W_V and the softmax, and
take q and k from elsewhere (per head, causal mask throughout; X is (B, T, C) or (1, T, C)):

    static_emb_qk  ("current QK" relaxed):   q, k = e W_{Q,K},  e = Emb(t) the static token embeddings of the input
    rnd_emb_qk     (sequence dependency):    q, k = X W_{Q,K},  X = the model's blocks 1..l-1 applied to a fixed
                                                                random input eps ~ N(0, sigma^2 I), (1, L, C)
    fixed_seq_qk   (sequence dependency):    the same with eps = Emb(t_s), t_s a fixed token sequence of length L
    all            y = softmax(q k^T / sqrt(hs) + causal mask) (H W_V) W_O

For `rnd_emb_qk` and `fixed_seq_qk` the attention map does not depend on the input at all (it changes only as the
weights train), so it is one (nh, T, T) map shared by the whole batch.

How the fixed input reaches layer l (the generic mechanism of `AttentionBackend.uses_reference_stream`): the
backend hands the model its fixed input (`reference_input`); `GPT.reference_states` embeds it like real tokens
(learned positions, dropout), runs it as one (1, L) sequence through the blocks below the last layer that reads it,
and passes each block's attention input on that stream (its `norm_1` applied) to the attention as
`ctx.reference[l]`. The backend slices it to the batch's T and projects q and k from it, once for the batch. On the
stream itself a reading layer sees its own input as reference, i.e. it is ordinary attention there. The pass costs
one forward (and backward) of L tokens per training step through those blocks, independent of the batch size: at
the `60m` preset with uniform rnd_emb_qk and L = T = 1024 it is the forward work of 0.64 standard sequences (9 of
10 blocks, plus the stream's q and k projections in all 10): it adds about 2% to a step of 32 sequences, 32% to a
step of 2. `forward_flops_per_token` leaves it out (it has no batch size); see there.

Options (defaults: docs/backends.md; [NS] = not stated in the paper, our choice and why):
    all: impl: `scaled_dot_product_attention` (q and k broadcast over the batch), or "math" (the softmax
        map computed once per batch, the test oracle). qk_norm: per-head RMSNorm with a learned gain on q
        and k before RoPE, as `standard`. RoPE (when the model uses it) rotates q and k by their positions, as
        `standard` does.
    static_emb_qk: embedding_norm [NS]: apply the model's norm type (layernorm/rmsnorm), without a learned
        gain, to e before W_Q and W_K. Every other attention input of this pre-norm model is normalised, and raw
        embeddings (std init_std = 0.02 at init) would make q.k about (1/0.02)^2 = 2500x smaller than standard
        attention's, i.e. a very different effective learning rate for W_Q, W_K. False follows the equation
        literally. e is the block input of layer 1 (`ctx.embeddings`: token embedding plus learned positions, if
        the model has them, after dropout).
    rnd_emb_qk, fixed_seq_qk:
        length (None: block_size) [NS]: L, the length of the fixed input (the paper: 2048, its training length).
            Longer batches raise a ValueError (the fixed map is defined for the first L positions only); shorter
            ones use the leading T x T block, as in the paper's shorter-context evaluations [I].
        detach_reference [NS]: False lets gradients flow from q and k through the stream into the earlier
            blocks (and into the embedding of the fixed tokens): X is "the model's own blocks" applied to the
            fixed input. True treats X as a constant for this layer (W_Q and W_K still learn).
        [NS] Layer 1 takes q and k from the fixed input itself (after the first block's input norm), i.e. X for
            layer l is the *input* of block l; "X = TransformerBlock^(l)(eps)" does not say which.
        [NS] The stream goes through the model's own blocks with the model's weights, as the paper's notation
            suggests; all layers that read it share one stream (one backend class per model; GPT checks).
    rnd_emb_qk: sigma (None: init_std) [NS]: std of eps; the paper does not give it, the token embeddings'
            init std puts eps on the scale of real embeddings at init. seed: eps is drawn from its own
            generator seeded with `seed`, so it is a function of the config: identical in every layer, run and
            resume, and not stored in checkpoints (a non-persistent buffer, redrawn by `reset_backend_parameters`).
    fixed_seq_qk: token_file: where t_s comes from; the first L ids are used. A `.npy`
            (integer array) or `.txt` (integers separated by whitespace or commas) of token ids made with the
            run's tokenizer, read by `lightning_cqk.data.token_ids`; the paper uses the first 2048 tokens of
            FineWeb-10BT. The offline default is the UTF-8 bytes of the built-in corpus `builtin:python_docs` as
            `data/builtin.py` gathers it (pydoc topics first, in sorted order, documents joined by blank lines):
            that text under the byte tokenizer (vocabulary 257), but only byte-valued ids (not
            that text) under any other tokenizer (folded modulo vocab_size below 256 ids), and it changes with the
            Python version. The ids are kept as a persistent buffer, so a checkpoint carries the exact sequence.

Decoding (`new_cache`, the decode contract of `attention.base`; `kv_cache_values_per_token` = what is cached per
token and layer):
    static_emb_qk: 2 C, the keys (from the new tokens' embeddings, QK-normed and rotated at their positions) and the
        values of every head, as `standard`; each new query comes from its own token's embedding.
    rnd_emb_qk, fixed_seq_qk: C, the values only. q and k depend on the position alone (position p reads row p of
        the fixed stream), so a query at position p is projected from reference row p, and the keys of every
        position are projected from the whole stream once per cache (at its first forward) and gathered at the held
        keys' positions (`DecodeCache` keeps the stream's states, computed once by `GPT.new_cache`). These
        reference keys, nh L hs = L C values per layer, are per model, not per token or sequence: they are kept on
        the layer's cache (`ReferenceKeyCache.reference_keys`) and, like the stream states, not counted in the
        cache's bytes per token or fixed bytes.

Invariants checked by `tests/unit/attention/backends/test_deconstructed_qk_and_mixing.py`: causality of the backend and
of a whole GPT (fp64,
earlier positions exactly unchanged); forward and backward finite; SDPA path == math path in fp64, forward and
gradients of the input, the reference states and every parameter; degenerate cases equal `standard` with the same
weights (static_emb_qk with embeddings := x and no embedding norm; rnd/fixed with the reference := x); inside a GPT
the map is the same for every input, and the stream states equal a manual run of the blocks; gradients reach the
earlier blocks through the stream unless detached; a batch longer than L raises; token files (.npy, .txt) load
(`tests/unit/data/test_token_ids.py`);
parameter counts 4 C^2; analytic FLOPs equal a FLOP counter once the per-step stream cost is added; a tiny GPT of
each variant trains on real text. Decoding (`tests/inference`): fp64 parity with the full forward to 1e-10 (token by
token, chunked, left-padded rows at their own positions), measured cache bytes = `kv_cache_values_per_token`, the
reference keys kept across `select` and `reset`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from lightning_cqk.attention.backends.deconstructed_mixing import DeconstructedOptions, ProjectedAttention
from lightning_cqk.attention.base import AttentionContext
from lightning_cqk.attention.cache import LayerCache
from lightning_cqk.attention.kernels.functional import (
    attention_probs,
    causal_attention,
    causal_logits,
    masked_attention,
)
from lightning_cqk.attention.rope import apply_rope

if TYPE_CHECKING:
    from lightning_cqk.model_config import ModelConfig

BUILTIN_TOKENS = "builtin:python_docs"


# ----------------------------------------------------------------------------------------------------------------------
# static_emb_qk
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class StaticEmbQKOptions(DeconstructedOptions):
    """Options of `static_emb_qk`.

    Attributes:
        embedding_norm: normalise the embeddings (the model's norm type, no learned gain) before W_Q and W_K.
    """

    embedding_norm: bool = True


class StaticEmbQKAttention(ProjectedAttention):
    """`static_emb_qk`: q and k from the static token embeddings of the input, v from the layer's hidden state."""

    name = "static_emb_qk"
    Options = StaticEmbQKOptions

    def query_key(self, ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, nh, T, hs) from the token embeddings in the context (normed, projected, QK-normed, rotated)."""
        if ctx.embeddings is None:
            raise ValueError("static_emb_qk needs the token embeddings in the context (AttentionContext.embeddings).")
        e = ctx.embeddings  # (B, T, C)
        if self.options.embedding_norm:
            e = _plain_norm(e, self.config)  # (B, T, C)
        q = self.split_heads(self.q_proj(e))  # (B, nh, T, hs)
        k = self.split_heads(self.k_proj(e))  # (B, nh, T, hs)
        q, k = self.norm_qk(q, k)
        return apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)  # (B, nh, T, hs) each

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """q k^T / sqrt(hs) from the embeddings, (B, nh, T, T) fp32."""
        return causal_logits(*self.query_key(ctx))  # (B, nh, T, T)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k = self.query_key(ctx)  # (B, nh, T, hs) each; decode mode: at the new tokens' positions
        v = self.split_heads(self.v_proj(x))  # (B, nh, T, hs)
        if ctx.decoding:
            held = ctx.cache.append(k=k, v=v)  # (B, nh, L, hs) each
            return self.output(masked_attention(q, held["k"], held["v"], ctx.attn_mask, impl=self.options.impl))
        dropout_p = self.config.attn_dropout_p if self.training else 0.0
        y = causal_attention(q, k, v, impl=self.options.impl, dropout_p=dropout_p)  # (B, nh, T, hs)
        return self.output(y)  # (B, T, C)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> LayerCache:
        """Keys (rotated) and values of every head, "k" and "v" (B, nh, max_len, hs): 2 C values per token."""
        heads = (self.n_head, self.head_size)
        return LayerCache(batch_size, max_len, device, dtype, buffers={"k": heads, "v": heads})

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: StaticEmbQKOptions, seq_len: int) -> int:
        C = config.n_embd
        return 4 * 2 * C * C + 2 * 2 * seq_len * C  # q, k, v, out projections; scores and values

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: StaticEmbQKOptions) -> int:
        return 2 * config.n_embd


def _plain_norm(e: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """The model's norm type over C without a learned gain (what `norm_1` does at init)."""
    if config.norm == "rmsnorm":
        return F.rms_norm(e, (e.size(-1),), eps=config.norm_eps)
    return F.layer_norm(e, (e.size(-1),), eps=config.norm_eps)


# ----------------------------------------------------------------------------------------------------------------------
# rnd_emb_qk, fixed_seq_qk: q and k from a fixed input passed through the earlier blocks
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class FixedInputQKOptions(DeconstructedOptions):
    """Options shared by `rnd_emb_qk` and `fixed_seq_qk`.

    Attributes:
        length: length L of the fixed input; None means block_size. Batches longer than L are refused.
        detach_reference: stop gradients from q and k into the stream (the earlier blocks and the fixed input).
    """

    length: int | None = None
    detach_reference: bool = False


def stream_length(config: ModelConfig, options: FixedInputQKOptions) -> int:
    """L: `options.length`, or the model's block_size."""
    return config.block_size if options.length is None else options.length


class FixedInputQKAttention(ProjectedAttention):
    """Base of the variants whose q and k come from a fixed input run through the model's earlier blocks.

    Subclasses provide `reference_input`; the model provides `ctx.reference` (see `GPT.reference_states`).
    """

    Options = FixedInputQKOptions
    uses_reference_stream = True

    @classmethod
    def reference_length(cls, config: ModelConfig, options: FixedInputQKOptions) -> int:
        return stream_length(config, options)

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """The fixed map's logits q k^T / sqrt(hs) from the reference stream, (1, nh, T, T) fp32 (one map for all)."""
        q, k = self.query_key(x.size(1), ctx)  # (1, nh, T, hs) each
        return causal_logits(q, k)  # (1, nh, T, T)

    def layer_reference(self, ctx: AttentionContext) -> torch.Tensor:
        """This layer's reference state (1, L, C): the tensor the model hands this block (`ctx.layer_reference`, one
        compiled graph for every layer), else `ctx.reference[layer_idx]` (a context built by hand)."""
        if ctx.layer_reference is not None:
            return ctx.layer_reference
        if ctx.reference is None:
            raise ValueError(
                f"{self.name} takes q and k from the model's fixed reference stream (AttentionContext.reference), "
                "which GPT provides; outside a GPT pass reference=[... (1, L, C) per layer ...] yourself."
            )
        return ctx.reference[self.layer_idx]  # (1, L, C)

    def query_key(self, T: int, ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (1, nh, T, hs) from the leading T positions of this layer's reference state."""
        r = self.layer_reference(ctx)  # (1, L, C)
        if T > r.size(1):
            raise ValueError(
                f"{self.name} (layer {self.layer_idx}): sequence length {T} exceeds the fixed input's length "
                f"{r.size(1)}; the fixed attention map covers the first {r.size(1)} positions only. Raise the option "
                "`length` (at most block_size) or use shorter sequences."
            )
        r = r[:, :T]  # (1, T, C): the leading block of the fixed map
        if self.options.detach_reference:
            r = r.detach()
        q = self.split_heads(self.q_proj(r))  # (1, nh, T, hs)
        k = self.split_heads(self.k_proj(r))  # (1, nh, T, hs)
        q, k = self.norm_qk(q, k)
        return apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)  # (1, nh, T, hs) each

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if ctx.decoding:
            return self.decode(x, ctx)
        B, T, _ = x.shape
        q, k = self.query_key(T, ctx)  # (1, nh, T, hs) each
        v = self.split_heads(self.v_proj(x))  # (B, nh, T, hs)
        dropout_p = self.config.attn_dropout_p if self.training else 0.0
        if self.options.impl == "math":
            probs = attention_probs(q, k)  # (1, nh, T, T): one map for the whole batch
            if dropout_p > 0.0:
                probs = F.dropout(probs.expand(B, -1, -1, -1), p=dropout_p)  # (B, nh, T, T)
            y = (probs.to(v.dtype) @ v).to(v.dtype)  # (B, nh, T, hs)
        else:
            q, k = q.expand(B, -1, -1, -1), k.expand(B, -1, -1, -1)  # (B, nh, T, hs) views, no copies
            y = causal_attention(q, k, v, impl="sdpa", dropout_p=dropout_p)  # (B, nh, T, hs)
        return self.output(y)  # (B, T, C)

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> ReferenceKeyCache:
        """The values of every head, "v" (B, nh, max_len, hs): C values per token; the stream's keys are projected
        once, at the first decode forward (`reference_keys`)."""
        return ReferenceKeyCache(batch_size, max_len, device, dtype, buffers={"v": (self.n_head, self.head_size)})

    def reference_keys(self, ctx: AttentionContext) -> torch.Tensor:
        """Keys of every position of the fixed stream, (nh, L, hs), rotated at their positions; computed once per
        cache from `ctx.reference` (the states `GPT.new_cache` keeps) and kept on it."""
        cache = ctx.cache
        if cache.reference_keys is None:
            r = self._reference(ctx)  # (1, L, C)
            k = self.split_heads(self.k_proj(r))  # (1, nh, L, hs)
            if self.k_norm is not None:
                k = self.k_norm(k)
            if ctx.rope_tables is not None:
                cos, sin = (t[: r.size(1)] for t in ctx.rope_tables)  # (L, hs/2) each
                k = apply_rope(k, cos, sin)  # (1, nh, L, hs)
            cache.reference_keys = k[0]  # (nh, L, hs)
        return cache.reference_keys

    def decode(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Decode mode: the next T tokens x (B, T, C) -> (B, T, C). q from the reference rows at the new tokens'
        positions, keys gathered from `reference_keys` at the held keys' positions, values from the cache."""
        # Positions stay below the cache's max_len, which `GPT.new_cache` keeps within the stream's length L.
        r = self._reference(ctx)  # (1, L, C)
        q = self.split_heads(self.q_proj(r[0][ctx.positions]))  # (B, nh, T, hs): row p of the stream at position p
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q, ctx.cos, ctx.sin)  # (B, nh, T, hs)
        keys = self.reference_keys(ctx)[:, ctx.key_positions].transpose(0, 1)  # (B, nh, L, hs)
        v = ctx.cache.append(v=self.split_heads(self.v_proj(x)))["v"]  # (B, nh, L, hs)
        return self.output(masked_attention(q, keys, v, ctx.attn_mask, impl=self.options.impl))  # (B, T, C)

    def _reference(self, ctx: AttentionContext) -> torch.Tensor:
        """This layer's reference state (1, L, C), detached when `detach_reference`."""
        r = self.layer_reference(ctx).to(self.q_proj.weight.dtype)  # (1, L, C); a cache may keep it narrower
        return r.detach() if self.options.detach_reference else r

    def stream_key(self) -> tuple:
        """The options that define the fixed input; layers that share a stream must agree on them."""
        return (stream_length(self.config, self.options),)

    @classmethod
    def share_across_layers(cls, backends: list[FixedInputQKAttention]) -> None:
        # The model runs one stream, taken from the first reading layer: refuse layers that would want another.
        keys = {b.layer_idx: b.stream_key() for b in backends}
        if len(set(keys.values())) > 1:
            raise ValueError(
                f"{cls.name}: a model runs one fixed input, but its layers define different ones ({{layer: stream "
                f"options}} = {keys}); give every {cls.name} layer the same length, sigma, seed and token_file."
            )

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: FixedInputQKOptions) -> None:
        super().check_config(config, layer_idx, options)
        L = stream_length(config, options)
        if isinstance(L, bool) or not isinstance(L, int) or not 1 <= L <= config.block_size:
            raise ValueError(
                f"{cls.name}: length must be an integer in 1..block_size={config.block_size} (the position tables "
                f"end there), got {options.length!r}; null means block_size."
            )

    @classmethod
    def forward_flops_per_token(cls, config: ModelConfig, options: FixedInputQKOptions, seq_len: int) -> int:
        """Per-token FLOPs: v and out projections, SDPA scores and values (computed per sequence).

        The per-step work is not included, since it does not scale with the tokens of a step: the q and k
        projections of the stream (2 * 2 C^2 * seq_len per layer) and the stream's own pass through the earlier
        blocks (L tokens through those blocks). Add both, divided by the tokens per step, for small batches.
        """
        C = config.n_embd
        return 2 * 2 * C * C + 2 * 2 * seq_len * C

    @classmethod
    def kv_cache_values_per_token(cls, config: ModelConfig, options: FixedInputQKOptions) -> int:
        return config.n_embd  # only v depends on the input


class ReferenceKeyCache(LayerCache):
    """A `LayerCache` that also keeps the fixed stream's projected keys (nh, L, hs) of `rnd_emb_qk` / `fixed_seq_qk`.

    They are a function of the model alone (like `DecodeCache.reference`), shared by every row: `select` and `reset`
    keep them, and they count neither per token nor per sequence (`nbytes_per_token`, `fixed_nbytes`).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reference_keys: torch.Tensor | None = None


@dataclass
class RndEmbQKOptions(FixedInputQKOptions):
    """Options of `rnd_emb_qk`.

    Attributes:
        sigma: std of the fixed random input; None means the embedding init std (`init_std`).
        seed: seed of the fixed random input's own generator.
    """

    sigma: float | None = None
    seed: int = 0


class RndEmbQKAttention(FixedInputQKAttention):
    """`rnd_emb_qk`: q and k from fixed random embeddings passed through the earlier blocks; v from the input."""

    name = "rnd_emb_qk"
    Options = RndEmbQKOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: RndEmbQKOptions) -> None:
        super().__init__(config, layer_idx, options)
        device = self.q_proj.weight.device
        self.register_buffer("reference_embedding", self._draw().to(device), persistent=False)  # (1, L, C)

    def _draw(self) -> torch.Tensor:
        """eps ~ N(0, sigma^2), (1, L, C), from a generator seeded with `seed` (the same in every layer and run)."""
        sigma = self.config.init_std if self.options.sigma is None else self.options.sigma
        generator = torch.Generator(device="cpu").manual_seed(self.options.seed)
        L, C = stream_length(self.config, self.options), self.config.n_embd
        return torch.randn(1, L, C, generator=generator, device="cpu") * sigma

    def reset_backend_parameters(self) -> None:
        with torch.no_grad():
            self.reference_embedding.copy_(self._draw())

    def reference_input(self, embed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return self.reference_embedding  # (1, L, C)

    def stream_key(self) -> tuple:
        sigma = self.config.init_std if self.options.sigma is None else self.options.sigma
        return (stream_length(self.config, self.options), sigma, self.options.seed)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: RndEmbQKOptions) -> None:
        super().check_config(config, layer_idx, options)
        if options.sigma is not None and not options.sigma > 0:
            raise ValueError(f"rnd_emb_qk: sigma must be > 0 (null means init_std), got {options.sigma!r}.")


@dataclass
class FixedSeqQKOptions(FixedInputQKOptions):
    """Options of `fixed_seq_qk`.

    Attributes:
        token_file: a `.npy` or `.txt` file of token ids, or "builtin:python_docs" (UTF-8 bytes of the bundled
            Python documentation). The first `length` ids are the fixed sequence.
    """

    token_file: str = BUILTIN_TOKENS


class FixedSeqQKAttention(FixedInputQKAttention):
    """`fixed_seq_qk`: q and k from a fixed token sequence passed through the earlier blocks; v from the input."""

    name = "fixed_seq_qk"
    Options = FixedSeqQKOptions

    def __init__(self, config: ModelConfig, layer_idx: int, options: FixedSeqQKOptions) -> None:
        super().__init__(config, layer_idx, options)
        tokens = fixed_sequence(config, options)  # (L,)
        # Persistent: the checkpoint keeps the exact sequence even if the file changes later.
        self.register_buffer("reference_tokens", tokens.unsqueeze(0).to(self.q_proj.weight.device))  # (1, L)

    def reset_backend_parameters(self) -> None:
        with torch.no_grad():  # the same sequence again (a model materialised from the meta device needs it)
            self.reference_tokens.copy_(fixed_sequence(self.config, self.options).unsqueeze(0))

    def reference_input(self, embed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return embed(self.reference_tokens)  # (1, L, C)

    def stream_key(self) -> tuple:
        return (stream_length(self.config, self.options), self.options.token_file)

    @classmethod
    def check_config(cls, config: ModelConfig, layer_idx: int, options: FixedSeqQKOptions) -> None:
        super().check_config(config, layer_idx, options)
        tokens = fixed_sequence(config, options)
        top = int(tokens.max())
        if top >= config.vocab_size or int(tokens.min()) < 0:
            raise ValueError(
                f"fixed_seq_qk: token_file {options.token_file!r} holds ids up to {top}, outside the vocabulary "
                f"0..{config.vocab_size - 1}; make the file with the run's tokenizer."
            )


# ----------------------------------------------------------------------------------------------------------------------
# Token files
# ----------------------------------------------------------------------------------------------------------------------


def fixed_sequence(config: ModelConfig, options: FixedSeqQKOptions) -> torch.Tensor:
    """The fixed token ids t_s (L,) of `fixed_seq_qk`; built-in bytes are folded into toy vocabularies below 256."""
    tokens = load_token_ids(options.token_file, stream_length(config, options))  # (L,)
    if options.token_file == BUILTIN_TOKENS:
        # Only vocabularies smaller than a byte (test models) need this; the file-based sources are checked instead.
        tokens = tokens % config.vocab_size
    return tokens


def load_token_ids(source: str, length: int) -> torch.Tensor:
    """The first `length` token ids of `source` as an int64 tensor (length,): read by `lightning_cqk.data.token_ids`
    (numpy for `.npy`, the built-in corpus as `data/builtin.py` gathers it), which this model file does not import
    until a `fixed_seq_qk` model is built."""
    from lightning_cqk.data.token_ids import load_token_ids as read

    return read(source, length)
