"""The model-level decode cache: every layer's `LayerCache` plus the per-row bookkeeping of positions and padding.

`GPT.new_cache(batch_size, max_len)` builds it; `GPT.forward(idx, cache=cache, attention_mask=mask)` runs the next
T tokens of every row against it (the decode contract of `lightning_cqk.attention.base`). Per row the cache keeps
which of its tokens are real (`valid`, False for left padding), each token's position (`positions`: the number of
real tokens before it, so a left-padded row's first real token is at position 0, exactly as if the row were alone)
and the running count of real tokens (`n_real`). All of it lives on the model's device and is updated with tensor
ops: the only python state is `length`, so decoding never waits for the device.

Not counted in `nbytes_per_token` (which measures what the attention layers keep, the paper's KV cache): this
bookkeeping, 9 bytes per token and row (a long position and a bool), and the reference-stream states of models
that have one (fixed, in `reference`).
"""

from __future__ import annotations

import torch

from lightning_cqk.attention import AttentionContext
from lightning_cqk.attention.cache import LayerCache


class DecodeCache:
    """What a model keeps between decode forwards.

    Attributes:
        layers: one `LayerCache` (or None: the layer keeps nothing) per block.
        max_len: capacity in tokens (pads included) of every row.
        length: tokens (pads included) held by every row (python int).
        valid: (B, max_len) bool, True for real tokens among the first `length`.
        positions: (B, max_len) long, each held token's position (pads: 0).
        n_real: (B,) long, real tokens held per row (the next real token's position).
        reference: per-layer reference-stream states (1, L, C) for models with `uses_reference_stream`, else None.
        has_padding: False while no attention_mask has been passed (every key is then visible to decode queries).
    """

    def __init__(
        self,
        layers: list[LayerCache | None],
        batch_size: int,
        max_len: int,
        device: torch.device,
        reference: list[torch.Tensor] | None = None,
    ) -> None:
        self.layers = layers
        self.max_len = int(max_len)
        self.length = 0
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.positions = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.reference = reference
        self.has_padding = False
        self._n_real_next = self.n_real

    @property
    def batch_size(self) -> int:
        return self.valid.size(0)

    def prepare(self, T: int, attention_mask: torch.Tensor | None) -> AttentionContext:
        """Record the next T tokens of every row (their validity and positions) and return the decode context
        (positions, key_valid, attn_mask, key_positions; the model adds RoPE tables and the layer caches).

        Raises ValueError when the tokens do not fit in `max_len` or the mask is not (B, T) bool left padding.
        """
        B, start, end = self.batch_size, self.length, self.length + T
        if end > self.max_len:
            raise ValueError(
                f"The decode cache holds {start} of max_len={self.max_len} tokens per row and cannot take {T} more; "
                f"build it with a larger max_len (model.new_cache(batch_size, max_len >= {end}), at most the "
                "model's block_size), or start a new cache."
            )
        device = self.valid.device
        if attention_mask is None:
            mask = None
            pos = self.n_real[:, None] + torch.arange(T, device=device)  # (B, T)
            self.valid[:, start:end] = True
            self._n_real_next = self.n_real + T
        else:
            if attention_mask.shape != (B, T) or attention_mask.dtype != torch.bool:
                raise ValueError(
                    f"attention_mask must be a bool tensor of shape (batch, tokens) = ({B}, {T}), got "
                    f"{attention_mask.dtype} {tuple(attention_mask.shape)}; False marks left padding."
                )
            mask = attention_mask.to(device)
            if T > 1 and bool(((mask[:, 1:].long() - mask[:, :-1].long()) < 0).any()):
                raise ValueError(
                    "attention_mask has a pad (False) after a real token (True) in some row; only LEFT padding is "
                    "supported (pads at the start of a row's prompt): pad your prompts on the left."
                )
            pos = (self.n_real[:, None] + mask.long().cumsum(1) - 1).clamp_min(0)  # (B, T)
            self.valid[:, start:end] = mask
            self._n_real_next = self.n_real + mask.long().sum(1)
            self.has_padding = True
        self.positions[:, start:end] = pos
        key_valid = self.valid[:, :end]  # (B, L)
        if not self.has_padding and T == 1:
            attn_mask = None  # the one new query sees every held key
        else:
            causal = torch.ones(T, end, dtype=torch.bool, device=device).tril(diagonal=start)  # (T, L)
            if self.has_padding:
                own = torch.zeros(T, end, dtype=torch.bool, device=device)
                own[:, start:] = torch.eye(T, dtype=torch.bool, device=device)  # (T, L): query i is key start + i
                attn_mask = causal & (key_valid[:, None, :] | own)  # (B, T, L)
                attn_mask = attn_mask[:, None]  # (B, 1, T, L)
            else:
                attn_mask = causal[None, None]  # (1, 1, T, L)
        return AttentionContext(
            positions=pos,
            key_valid=key_valid,
            attn_mask=attn_mask,
            key_positions=self.positions[:, :end],
            reference=self.reference,
        )

    def advance(self, T: int) -> None:
        """After every layer ran on T new tokens: move `length` (of this cache and of every layer's) on by T."""
        self.length += T
        self.n_real = self._n_real_next  # (B,), counted in `prepare`, committed once every layer ran
        for layer in self.layers:
            if layer is not None:
                layer.length = self.length

    def nbytes_per_token(self) -> float:
        """Bytes the layers' time-axis caches hold per cached token of one sequence, summed over layers (the
        measured KV cache; compare with `kv_cache_values_per_token` x element size)."""
        return float(sum(layer.nbytes_per_token() for layer in self.layers if layer is not None))

    def fixed_nbytes(self) -> int:
        """Bytes of per-sequence state that does not grow with the tokens held (recurrent states), summed."""
        return sum(layer.fixed_nbytes() for layer in self.layers if layer is not None)

    def reset(self) -> None:
        """Forget every token of every row (keep the allocations and the reference states)."""
        self.length = 0
        self.valid.zero_()
        self.positions.zero_()
        self.n_real.zero_()
        self._n_real_next = self.n_real
        self.has_padding = False
        for layer in self.layers:
            if layer is not None:
                layer.reset()

    def select(self, rows: torch.Tensor | list[int]) -> None:
        """Keep only batch rows `rows` (indices, in the order given), e.g. to drop finished sequences."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.valid.device)
        self.valid = self.valid.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
        self.n_real = self.n_real.index_select(0, rows)
        self._n_real_next = self.n_real
        for layer in self.layers:
            if layer is not None:
                layer.select(rows)
