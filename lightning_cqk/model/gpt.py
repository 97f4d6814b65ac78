"""GPT-style decoder with a pluggable attention backend. Torch only: no Lightning imports.

    tokens (B, T) -> embedding (B, T, C) -> n_layer x Block -> final norm -> lm_head -> logits (B, T, vocab)

    Block(x) = x + attn(norm_1(x), ctx);  x + mlp(norm_2(x))          (pre-norm residual blocks)

The attention module of every block comes from `lightning_cqk.attention.build_attention`, so the block never
knows which variant it holds. Backends whose q and k come from a fixed input (`uses_reference_stream`, e.g.
`rnd_emb_qk`) get it through `reference_states`: the model runs that input through its own blocks before the batch
and hands every layer's state to attention in the context.

Decoding (issue 16): `new_cache(batch_size, max_len)` builds a `DecodeCache` (`model/decode.py`) and
`forward(idx, cache=cache, attention_mask=mask)` runs the next T tokens of every row against it (prefill, then one
token at a time; left-padded batches with per-row positions); the contract is in `lightning_cqk.attention.base`.
Without a cache the forward is the training forward, unchanged.

Initialisation follows GPT-2: N(0, init_std) for linear and embedding weights, zero biases, and (with
`residual_init: scaled`, the default) N(0, init_std / sqrt(2 * n_layer)) for the projections that write into the
residual stream (every module attribute named `out_proj`), so the residual variance does not grow with depth.
`residual_init: plain` keeps N(0, init_std) there too, as the official code of arXiv 2606.04032 (Q-K=V).

Dropout: `embd_dropout_p` on the block input, `attn_dropout_p` on the attention weights (inside each backend) and
`resid_dropout_p` on each residual branch's output (`ModelConfig.dropout` is the shorthand for the three).
The embedding table and output head have `padded_vocab_size` rows (`vocab_multiple`).

Paired initialisation (`paired_init`): every module draws its initial values from the global generator re-seeded by
(seed, the module's name), where seed is the global generator's seed (`torch.initial_seed()`, which
`seed_everything` sets). Two models built with the same seed therefore start from the same values for every
parameter they have in common (same name, same shape), whatever other modules either has: an ablation's levels
differ only in what they change. Building a model leaves the global CPU generator where it was (later draws, e.g.
dropout masks, do not depend on the architecture).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from lightning_cqk.attention import AttentionBackend, AttentionContext, build_attention
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.model.components import in_autocast_dtype, make_mlp, make_norm
from lightning_cqk.model.decode import DecodeCache
from lightning_cqk.model_config import ModelConfig


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual connection."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_1 = make_norm(config)
        self.attn = build_attention(config, layer_idx)
        self.norm_2 = make_norm(config)
        self.mlp = make_mlp(config)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.attn(in_autocast_dtype(self.norm_1(x)), ctx)  # (B, T, C)
        return x + self.mlp(in_autocast_dtype(self.norm_2(x)))  # (B, T, C)


class GPT(nn.Module):
    """Decoder-only language model mapping token ids (B, T) to next-token logits (B, T, vocab_size)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        cpu_rng = torch.get_rng_state()  # restored below: building a model draws nothing from the global generator
        self.config = config
        self.wte = nn.Embedding(config.padded_vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.position == "learned" else None
        self.drop = nn.Dropout(config.embd_dropout_p)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self._share_backend_modules()
        self.reference_layers = self._find_reference_layers()
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if config.position == "rope":
            cos, sin = build_rope_cache(config.block_size, config.head_size, config.rope_base)
            # Not persistent: derived from the config, so checkpoints do not carry (and cannot disagree on) them.
            self.register_buffer("rope_cos", cos, persistent=False)  # (block_size, hs/2)
            self.register_buffer("rope_sin", sin, persistent=False)  # (block_size, hs/2)
        else:
            self.rope_cos = self.rope_sin = None
        self.init_seed = torch.initial_seed()  # the seed of the paired init, kept for `materialize`
        #: Recompute each block's activations in backward (`torch.utils.checkpoint`); set by the trainer (LitLM).
        self.activation_checkpointing = False
        self.reset_parameters(self.init_seed)
        torch.set_rng_state(cpu_rng)

    def materialize(self, device: torch.device | str) -> None:
        """Give a model built on the meta device (``with torch.device("meta"): GPT(config)``) storage on `device` and
        exactly the initial values a model built on the CPU with the same seed has (tested for every backend).

        Each random draw of the init runs on the CPU generator seeded by (seed, the module's name) (`paired_init`)
        and is copied to `device` one tensor at a time, so the host never holds more than one tensor and a model
        materialised on a GPU starts from the weights of today's CPU-built model. Parameters tied by identity (the
        tied embedding/head, banks shared across layers) stay tied.
        """
        groups: dict[int, list[tuple[nn.Module, str]]] = {}
        for module in self.modules():
            for name, p in module.named_parameters(recurse=False):
                groups.setdefault(id(p), []).append((module, name))
        self.to_empty(device=device)
        for owners in groups.values():  # `to_empty` makes a new Parameter per owning module: tie them again
            first_module, first_name = owners[0]
            for module, name in owners[1:]:
                setattr(module, name, getattr(first_module, first_name))
        with torch.no_grad(), cpu_draws():
            for module in self.modules():  # norm gains and biases are set at construction, not by reset_parameters
                if isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)):
                    module.reset_parameters()
            self.reset_parameters(self.init_seed)

    def _share_backend_modules(self) -> None:
        """Let each backend class tie modules across the layers that use it (e.g. one dynamics net per model)."""
        by_class: dict[type[AttentionBackend], list[AttentionBackend]] = {}
        for block in self.blocks:
            by_class.setdefault(type(block.attn), []).append(block.attn)
        for cls, backends in by_class.items():
            cls.share_across_layers(backends)

    def _find_reference_layers(self) -> list[int]:
        """Layers whose attention reads the fixed reference stream (`uses_reference_stream`); one backend class only."""
        layers = [i for i, block in enumerate(self.blocks) if block.attn.uses_reference_stream]
        classes = sorted({type(self.blocks[i].attn).name for i in layers})
        if len(classes) > 1:
            raise ValueError(
                f"Layers {layers} use backends {classes}, which each bring their own fixed reference stream; a model "
                "runs one reference stream, so use one of these backends for all of those layers."
            )
        return layers

    @property
    def context_length(self) -> int:
        """The most positions one sequence may have: block_size, or the length L of the fixed reference stream when
        layers take q and k from one (`uses_reference_stream`) and L is shorter (their maps exist for L positions)."""
        if not self.reference_layers:
            return self.config.block_size
        attn = self.blocks[self.reference_layers[0]].attn
        return min(self.config.block_size, type(attn).reference_length(self.config, attn.options))

    def reset_parameters(self, seed: int | None = None) -> None:
        """GPT-2 initialisation, then each backend's own init for its special parameters (each module's draws from a
        generator seeded by the seed and its name: `paired_init`). `seed`: default `torch.initial_seed()`."""
        std = self.config.init_std
        seed = torch.initial_seed() if seed is None else seed
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                with paired_init(seed, name, module.weight):
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                with paired_init(seed, name, module.weight):
                    nn.init.normal_(module.weight, mean=0.0, std=std)
        self.init_residual_projections(seed)
        for name, module in self.named_modules():
            if isinstance(module, AttentionBackend):
                with paired_init(seed, f"{name}#backend", *module.parameters()):
                    module.reset_backend_parameters()
        if self.rope_cos is not None:
            cos, sin = build_rope_cache(
                self.config.block_size, self.config.head_size, self.config.rope_base, device=self.rope_cos.device
            )
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def init_residual_projections(self, seed: int) -> None:
        """`residual_init`: "scaled" redraws every `out_proj` weight from N(0, init_std / sqrt(2 n_layer)) (GPT-2,
        Radford et al. 2019 §2.3); "plain" leaves it at N(0, init_std), like every other linear layer. Each draw is
        seeded by (seed, the projection's name): `paired_init`."""
        if self.config.residual_init == "plain":
            return
        residual_std = self.config.init_std / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            out_proj = getattr(module, "out_proj", None)
            if isinstance(out_proj, nn.Linear):
                with paired_init(seed, f"{name}.out_proj" if name else "out_proj", out_proj.weight):
                    nn.init.normal_(out_proj.weight, mean=0.0, std=residual_std)

    def context(
        self, T: int, embeddings: torch.Tensor, reference: list[torch.Tensor] | None = None
    ) -> AttentionContext:
        """What every block's attention receives besides its input."""
        if self.rope_cos is None:
            return AttentionContext(embeddings=embeddings, reference=reference)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, hs/2) each
        return AttentionContext(cos=cos, sin=sin, embeddings=embeddings, reference=reference)

    def embed(self, tok_emb: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, C) -> block input (B, T, C): learned positions (if any), then dropout."""
        if self.wpe is not None:
            tok_emb = tok_emb + self.wpe(torch.arange(tok_emb.size(1), device=tok_emb.device))  # (B, T, C)
        return self.drop(tok_emb)

    def reference_states(self, T: int) -> list[torch.Tensor] | None:
        """Run the fixed reference stream through the blocks; what each block's attention sees, (1, L, C) per layer.

        Only for models with a backend that sets `uses_reference_stream` (None otherwise). The stream is the input
        given by the first such layer's `reference_input`, embedded like real tokens; it passes through the blocks
        below the last layer that reads it, with gradients (a backend may detach what it reads). Inside this pass
        a reading layer sees its own input as reference, i.e. it acts as standard attention on the stream. Costs
        one B=1 forward of L tokens per step, whatever the batch size.
        """
        if not self.reference_layers:
            return None
        r = self.blocks[self.reference_layers[0]].attn.reference_input(self.wte)  # (1, L, C)
        L = r.size(1)
        if T > L:
            raise ValueError(
                f"Sequence length {T} exceeds the length {L} of the fixed reference stream that layers "
                f"{self.reference_layers} take q and k from: their attention map is only defined for the first {L} "
                "positions. Use shorter sequences or a longer stream (attention option `length`, at most block_size)."
            )
        r = self.embed(r)  # (1, L, C)
        states: list[torch.Tensor] = []
        ctx = self.context(L, embeddings=r, reference=states)
        last = self.reference_layers[-1]
        for i, block in enumerate(self.blocks[: last + 1]):
            states.append(block.norm_1(r))  # (1, L, C): block i's attention input on the stream
            if i < last:
                r = block(r, ctx.for_layer(i))  # (1, L, C)
        return states

    def forward(
        self,
        idx: torch.Tensor,
        cache: DecodeCache | None = None,
        attention_mask: torch.Tensor | None = None,
        head: bool = True,
    ) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, padded_vocab_size); the padding rows are never targets.

        With `cache` (from `new_cache`), `idx` are the next T tokens of every row after those the cache holds
        (prefill: the prompts; decode: T = 1) and `attention_mask` (B, T) bool, optional, marks left padding with
        False; see `hidden_states`. `head=False`: the final-normed hidden states (B, T, C) instead of logits (for a
        chunked head + loss; through `forward`, so FSDP's hooks on the model run).
        """
        hidden = self.hidden_states(idx, cache, attention_mask)  # (B, T, C)
        return self.lm_head(hidden) if head else hidden  # (B, T, padded_vocab_size) or (B, T, C)

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> DecodeCache:
        """An empty decode cache for `batch_size` rows of up to `max_len` tokens (pads included), on the model's device
        and in its dtype (or `dtype`). Each layer's backend builds its own part (`AttentionBackend.new_cache`);
        models with a fixed reference stream compute its states once here (no gradients) and keep them in it."""
        if max_len > self.config.block_size:
            raise ValueError(
                f"max_len={max_len} exceeds the model's block_size {self.config.block_size}: the model has no "
                f"positions beyond it. Use max_len <= {self.config.block_size} (a longer text needs a sliding window "
                "over a fresh cache)."
            )
        weight = self.lm_head.weight
        dtype = dtype or weight.dtype
        layers = [block.attn.new_cache(batch_size, max_len, weight.device, dtype) for block in self.blocks]
        reference = None
        if self.reference_layers:
            with torch.no_grad():
                reference = [r.to(dtype) for r in self.reference_states(max_len)]
        return DecodeCache(layers, batch_size, max_len, weight.device, reference=reference)

    def hidden_states(
        self, idx: torch.Tensor, cache: DecodeCache | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token ids (B, T) -> the final-normed hidden states (B, T, C) the LM head reads (downstream heads too).

        With `cache`: decode mode (the contract of `lightning_cqk.attention.base`): each new token's position is the
        number of real tokens before it in its row (learned positions and RoPE tables are gathered per row), every
        layer appends to its cache, and `cache.length` advances by T after the last layer.
        """
        if cache is not None:
            return self._decode_hidden_states(idx, cache, attention_mask)
        if attention_mask is not None:
            raise ValueError(
                "attention_mask is only used with a decode cache: run padded batches as "
                "model(idx, cache=model.new_cache(batch_size, max_len), attention_mask=mask)."
            )
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"Sequence length {T} exceeds the model's block_size {self.config.block_size}; "
                "use a shorter data.seq_len or a larger model.config.block_size."
            )
        x = self.embed(self.wte(idx))  # (B, T, C)
        ctx = self.context(T, embeddings=x, reference=self.reference_states(T))
        checkpointing = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            layer_ctx = ctx.for_layer(i)  # its own reference state, if any: one compiled graph for every layer
            if checkpointing:  # keep only the block's input; recompute its activations in backward
                x = checkpoint(block, x, layer_ctx, use_reentrant=False)  # (B, T, C)
            else:
                x = block(x, layer_ctx)  # (B, T, C)
        return self.norm_f(x)  # (B, T, C)

    def _decode_hidden_states(
        self, idx: torch.Tensor, cache: DecodeCache, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """`hidden_states` in decode mode: idx (B, T) are the next tokens of the rows `cache` holds."""
        B, T = idx.shape
        if self.training and max(self.config.embd_dropout_p, self.config.attn_dropout_p, self.config.resid_dropout_p):
            raise ValueError(
                "Decoding with a cache runs the inference forward, but the model is in training mode with dropout; "
                "call model.eval() first."
            )
        if B != cache.batch_size:
            raise ValueError(
                f"idx has {B} rows but the decode cache was built for {cache.batch_size}: build one for these rows, "
                f"model.new_cache({B}, max_len), or drop finished rows from the cache with cache.select(rows)."
            )
        ctx = cache.prepare(T, attention_mask)  # positions (B, T), key_valid (B, L), attn_mask
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(ctx.positions)  # (B, T, C)
        x = self.drop(x)
        ctx.embeddings = x
        if self.rope_cos is not None:
            ctx.cos = self.rope_cos[ctx.positions].unsqueeze(1)  # (B, 1, T, hs/2)
            ctx.sin = self.rope_sin[ctx.positions].unsqueeze(1)  # (B, 1, T, hs/2)
            ctx.rope_tables = (self.rope_cos, self.rope_sin)
        for i, (block, layer_cache) in enumerate(zip(self.blocks, cache.layers, strict=True)):
            ctx.cache = layer_cache  # set in place (no copy): the gathered key RoPE tables stay shared by every layer
            ctx.layer_reference = ctx.for_layer(i).layer_reference
            x = block(x, ctx)  # (B, T, C)
        ctx.cache = ctx.layer_reference = None
        cache.advance(T)
        return self.norm_f(x)  # (B, T, C)

    def num_parameters(self) -> dict[str, int]:
        """Total and non-embedding parameter counts (tied weights counted once), and the padding rows apart.

        Non-embedding excludes the token embedding, the learned position table and an untied output head, the
        convention of Kaplan et al. (2020) that makes models of different vocabularies comparable. `vocab_padding`:
        the parameters of the rows beyond vocab_size (`vocab_multiple`: GPT-2's 50,257 ids -> 50,304 rows), part of
        total and embedding; never a target, they only take part in the softmax (as in nanoGPT and arXiv
        2606.04032's code). A paper's count with an unpadded vocabulary is total - vocab_padding.
        """
        unique = {id(p): p for p in self.parameters()}
        total = sum(p.numel() for p in unique.values())
        embedding = {id(self.wte.weight): self.wte.weight, id(self.lm_head.weight): self.lm_head.weight}
        if self.wpe is not None:
            embedding[id(self.wpe.weight)] = self.wpe.weight
        n_embedding = sum(p.numel() for p in embedding.values())
        tables = 1 if self.lm_head.weight is self.wte.weight else 2
        padding = tables * (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        counts = {"total": total, "non_embedding": total - n_embedding, "embedding": n_embedding}
        return {**counts, "vocab_padding": padding}


# ------------------------------------------------------------------------------------------ paired initialisation
class _CPUDraws(TorchFunctionMode):
    """Run `nn.init.normal_` / `Tensor.normal_` on a tensor outside the CPU as a CPU draw copied in (see
    `cpu_draws`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (nn.init.normal_, torch.Tensor.normal_) and args and args[0].device.type != "cpu":
            target = args[0]
            draw = torch.empty(target.shape, dtype=target.dtype, device="cpu")
            func(draw, *args[1:], **kwargs)
            with torch.no_grad():
                target.copy_(draw)
            return target
        return func(*args, **kwargs)


def cpu_draws() -> TorchFunctionMode:
    """A context in which the init's normal draws come from the CPU generator whatever the tensor's device, so a model
    materialised on a GPU gets the values of a CPU-built one (the CUDA generator draws other numbers)."""
    return _CPUDraws()


def paired_init_seed(seed: int, name: str) -> int:
    """The generator seed of module `name` under run seed `seed` (sha256: the same in every process and Python)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@contextlib.contextmanager
def paired_init(seed: int, name: str, *tensors: torch.Tensor) -> Iterator[None]:
    """Run the block with the global generator (and the CUDA generators of `tensors`' devices) seeded from
    (seed, name); restore every generator afterwards. Init draws inside depend on the seed and the name only."""
    cuda = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        s = paired_init_seed(seed, name)
        torch.default_generator.manual_seed(s)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(s)
        yield
