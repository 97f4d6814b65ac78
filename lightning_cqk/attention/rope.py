"""Rotary position embedding (RoPE), half-split convention (GPT-NeoX / litgpt layout).

The head vector is split into two halves (x1, x2) and rotated pairwise:
``rope(x) = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]`` with angles ``t * base^(-2i / hs)``.
"""

from __future__ import annotations

import torch


def build_rope_cache(
    seq_len: int, head_size: int, base: float = 10000.0, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables, each (seq_len, head_size // 2), in fp32."""
    inv_freq = base ** (-torch.arange(0, head_size, 2, device=device, dtype=torch.float32) / head_size)  # (hs/2,)
    t = torch.arange(seq_len, device=device, dtype=torch.float32)  # (T,)
    angles = torch.outer(t, inv_freq)  # (T, hs/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
    """Rotate the last dimension of x: (..., T, hs) with tables (T, hs/2). No-op when the tables are None."""
    if cos is None or sin is None:
        return x
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]  # (..., T, hs/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (..., T, hs)
