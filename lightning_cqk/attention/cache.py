"""One layer's inference cache: preallocated time-axis buffers plus fixed-size recurrent state.

A backend builds its cache in `AttentionBackend.new_cache` and, in decode mode (`ctx.cache` set), appends what it
keeps of the new tokens and attends over the views it gets back::

    cache = LayerCache(B, max_len, device, dtype, buffers={"k": (nkv, hs), "v": (nkv, hs)})
    k_all, v_all = cache.append(k=k_new, v=v_new).values()      # (B, nkv, length + T, hs) each

Buffers have their time axis at dim 2, ``(B, heads, max_len, dim)``; recurrent state (`state`) is any named tensor
without a time axis, e.g. (B, nh, d, d), zeroed by `reset`. `length` (a python int, pads included) is advanced by
the model once per forward after every layer ran (`DecodeCache.advance`), so all layers of one forward see the
same `length` and write at [length, length + T).
"""

from __future__ import annotations

import torch


class LayerCache:
    """Preallocated per-layer decode state.

    Attributes:
        buffers: name -> (B, heads, max_len, dim) tensor, the time-axis caches (e.g. "k", "v", a latent "c_kv").
        state: name -> tensor without a time axis (recurrent state), zero after construction and `reset`.
        max_len: capacity of the time axis.
        length: tokens (pads included) already written for every row.
    """

    def __init__(
        self,
        batch_size: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        buffers: dict[str, tuple[int, int]] | None = None,
        state: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        """Allocate `buffers` {name: (heads, dim)} as (B, heads, max_len, dim) and `state` {name: shape} as (B, *shape).

        All tensors take `device` and `dtype` (the model's); nothing is allocated per forward afterwards.
        """
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"LayerCache needs batch_size >= 1 and max_len >= 1, got {batch_size} and {max_len}.")
        self.max_len = int(max_len)
        self.length = 0
        self.buffers: dict[str, torch.Tensor] = {
            name: torch.zeros(batch_size, heads, max_len, dim, device=device, dtype=dtype)
            for name, (heads, dim) in (buffers or {}).items()
        }
        self.state: dict[str, torch.Tensor] = {
            name: torch.zeros(batch_size, *shape, device=device, dtype=dtype) for name, shape in (state or {}).items()
        }

    @property
    def batch_size(self) -> int:
        tensors = [*self.buffers.values(), *self.state.values()]
        return tensors[0].size(0) if tensors else 0

    def append(self, **new: torch.Tensor) -> dict[str, torch.Tensor]:
        """Write each new (B, heads, T, dim) tensor at [length, length + T) of its buffer; return the views
        (B, heads, length + T, dim) in the order given. Does not advance `length` (the model does)."""
        out: dict[str, torch.Tensor] = {}
        for name, t in new.items():
            if name not in self.buffers:
                raise KeyError(f"LayerCache has no buffer {name!r}; it has {sorted(self.buffers)}.")
            buf = self.buffers[name]
            end = self.length + t.size(2)
            if end > self.max_len:
                raise ValueError(
                    f"Cannot write {t.size(2)} more tokens into a cache holding {self.length} of max_len="
                    f"{self.max_len}; build the cache with a larger max_len (model.new_cache(batch_size, max_len))."
                )
            buf[:, :, self.length : end].copy_(t)  # (B, heads, T, dim)
            out[name] = buf[:, :, :end]  # (B, heads, length + T, dim)
        return out

    def view(self, name: str) -> torch.Tensor:
        """The filled part of buffer `name`, (B, heads, length, dim)."""
        return self.buffers[name][:, :, : self.length]

    def nbytes_per_token(self) -> float:
        """Bytes the time-axis buffers hold per cached token of one sequence: their bytes / (B * max_len)."""
        total = sum(t.numel() * t.element_size() for t in self.buffers.values())
        rows = self.batch_size or 1
        return total / (rows * self.max_len)

    def fixed_nbytes(self) -> int:
        """Bytes of the recurrent state of one sequence (does not grow with the tokens held)."""
        total = sum(t.numel() * t.element_size() for t in self.state.values())
        return total // (self.batch_size or 1)

    def reset(self) -> None:
        """Forget every token: length 0 and zero state (buffers are overwritten before they are read again)."""
        self.length = 0
        for t in self.state.values():
            t.zero_()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (a long index tensor on the cache's device), in that order."""
        self.buffers = {name: t.index_select(0, rows) for name, t in self.buffers.items()}
        self.state = {name: t.index_select(0, rows) for name, t in self.state.items()}
