"""The output head and next-token cross-entropy, chunked over tokens so that the B x T x vocab logits are never held
at once, nor in fp32. Torch only.

    loss = sum_i CE(h_i W^T, y_i) / N            h (N, C) final hidden states, W (V, C) the head, y (N,) targets

`chunked_cross_entropy` runs the head and the loss on `chunk` tokens at a time inside a custom autograd function:
the forward keeps only h, W and the per-token log-sum-exp (N fp32 numbers); the backward recomputes each chunk's
logits and writes dL/dh and dL/dW directly (softmax - one-hot, times the incoming gradient), so the peak beyond the
inputs is one chunk's logits (chunk x V, in fp32 for the softmax) instead of 3 B T V (bf16 logits, their fp32 copy and
its gradient; 16 GB at B=32, T=1024, V=50k). Logits are formed in the dtype of h and W (bf16 under autocast, as
`F.linear` would) and the log-softmax is taken in fp32, as `F.cross_entropy(logits.float(), y)` on full logits.
Equal to that in fp64, forward and backward (tests/unit/model/test_loss_chunked.py). Padded vocabulary rows of W are
ordinary logits that are never targets, exactly as with the plain head.
"""

from __future__ import annotations

import torch


class _ChunkedHeadCE(torch.autograd.Function):
    """Summed CE of h (N, C) @ W (V, C)^T against y (N,), `chunk` rows at a time; backward recomputes the logits."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, chunk: int) -> torch.Tensor:
        n, acc = hidden.size(0), torch.promote_types(hidden.dtype, torch.float32)  # fp32 (fp64 for fp64 input)
        lse = torch.empty(n, dtype=acc, device=hidden.device)  # (N,) log-sum-exp per token
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            logits = (hidden[start:end] @ weight.t()).to(acc)  # (c, V)
            lse[start:end] = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, target[start:end, None]).squeeze(1)  # (c,)
            total = total + (lse[start:end] - picked).sum()
        ctx.save_for_backward(hidden, weight, target, lse)
        ctx.chunk = chunk
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        hidden, weight, target, lse = ctx.saved_tensors
        chunk, n = ctx.chunk, hidden.size(0)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h = hidden[start:end]  # (c, C)
            logits = (h @ weight.t()).to(lse.dtype)  # (c, V)
            g = torch.exp(logits - lse[start:end, None])  # softmax, (c, V)
            g[torch.arange(end - start, device=g.device), target[start:end]] -= 1.0
            g = (g * grad_total).to(hidden.dtype)  # dL/dlogits, (c, V)
            if grad_hidden is not None:
                grad_hidden[start:end] = g @ weight  # (c, C)
            grad_weight += (g.t() @ h).to(lse.dtype)  # (V, C)
        return grad_hidden, grad_weight.to(weight.dtype), None, None


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, chunk: int = 4096, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of the logits `hidden @ weight.T` against `target`, without materialising all logits.

    Args:
        hidden: (B, T, C) or (N, C) final hidden states.
        weight: (V, C) output head (the tied embedding when tied).
        target: (B, T) or (N,) token ids in [0, V).
        chunk: tokens per chunk (the peak is chunk x V fp32 logits).
        reduction: "mean" (over tokens) or "sum".

    Returns:
        The scalar loss (fp32; fp64 for fp64 inputs), equal to
        `F.cross_entropy((hidden @ weight.T).float(), target, reduction=...)`.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r}; chunked_cross_entropy supports 'mean' and 'sum'.")
    if chunk < 1:
        raise ValueError(f"chunk={chunk}; use a positive number of tokens.")
    h = hidden.reshape(-1, hidden.size(-1))  # (N, C)
    y = target.reshape(-1)  # (N,)
    if torch.is_autocast_enabled(h.device.type):  # the head's matmul in the autocast dtype, as F.linear would
        dtype = torch.get_autocast_dtype(h.device.type)
        h, w = h.to(dtype), weight.to(dtype)
    else:
        w = weight
    total = _ChunkedHeadCE.apply(h, w, y, chunk)
    return total / y.numel() if reduction == "mean" else total
