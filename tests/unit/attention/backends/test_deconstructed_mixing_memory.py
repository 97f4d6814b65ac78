"""`approximate` saves no T x T tensor for backward (the mixing is recomputed) and gives the same numbers (fp64)."""

from __future__ import annotations

import torch

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig


def _largest_saved(model: GPT, x: torch.Tensor) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """The largest saved (..., n, n) tensor's n (0 if none), the loss and the gradients."""
    sizes: list[int] = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() >= 2 and t.size(-1) == t.size(-2):
            sizes.append(t.size(-1))
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).logsumexp(-1).mean()
    loss.backward()
    return max(sizes), loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_approximate_keeps_no_t_squared_and_same_numbers():
    torch.manual_seed(0)
    T, B = 48, 2
    cfg = ModelConfig(
        preset="tiny", n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=53, attention="approximate"
    )
    model = GPT(cfg).double()  # hs 16: T < hs^2 = 256, so the mixing runs one quadratic chunk
    x = torch.randint(0, 53, (B, T))
    largest, loss, grads = _largest_saved(model, x)
    assert largest < T  # no (..., T, T) kernel kept (the 32 x 32 square weights are all that is square)
    # Without the recomputation (recompute: false, the old behaviour) the kernels are saved: the probe sees them.
    for block in model.blocks:
        block.attn.options.recompute = False
    largest_plain, loss_plain, grads_plain = _largest_saved(model, x)
    assert largest_plain >= T  # the (B, nh, 1, c, c) kernels, c >= T
    assert torch.equal(loss, loss_plain)
    for a, b in zip(grads, grads_plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
