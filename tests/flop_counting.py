"""What `torch.utils.flop_counter.FlopCounterMode` counts for SDPA on this machine, measured rather than assumed.

Whether the counter sees `scaled_dot_product_attention` depends on the torch release and on the kernel SDPA
dispatches to: on CPU, torch <= 2.13 registers no formula for the CPU flash kernel (the call counts 0), later
releases do (forward: the two products, 4 B nh T^2 hs; backward: five products, the scores recomputed), and a
fallback to the math kernel is counted as its batched matmuls. Tests that compare an analytic count with the counter
take the analytic count without the attention products and add what this probe measures for the same SDPA calls, so
they hold on every torch version.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode


def counted_sdpa_flops(
    batch: int, heads: int, seq_len: int, head_size: int, kv_heads: int | None = None, dtype=torch.float32
) -> int:
    """FLOPs FlopCounterMode reports for the forward and backward of one causal SDPA call of these shapes on CPU
    (grouped K/V heads with `kv_heads` < `heads`, through `enable_gqa` as `functional.causal_attention` calls it)."""
    kv_heads = heads if kv_heads is None else kv_heads
    q = torch.randn(batch, heads, seq_len, head_size, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, seq_len, head_size, dtype=dtype, requires_grad=True) for _ in range(2))
    gqa = {"enable_gqa": True} if kv_heads != heads else {}
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa).sum().backward()
    return counter.get_total_flops()


def analytic_sdpa_training_flops(batch: int, heads: int, seq_len: int, head_size: int) -> int:
    """The analytic convention's attention products for one call, forward + backward (3 x 2 products of
    2 seq_len^2 head_size per head and sequence; `AttentionBackend.forward_flops_per_token`)."""
    return 3 * 2 * 2 * batch * heads * seq_len * seq_len * head_size
