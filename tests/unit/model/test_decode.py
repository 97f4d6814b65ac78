"""Decoding with a cache, for every backend and option set in `backend_cases.CASES`, beyond the contract harness.

Token by token and prefill-then-decode parity with the full forward is part of the contract harness
(`tests/contract/test_contract.py`). Here, in fp64: left-padded batches of prompts of different lengths give every row
the logits it gets alone; the measured cache bytes per token equal `kv_cache_values_per_token` x the element size.
"""

from __future__ import annotations

import pytest
import torch
from backend_cases import Case, build_model, case_params

TOL = 1e-10
T = 10  # tokens per row (<= the test model's block_size 16)


def _tokens(model, B: int, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, n), generator=g)  # (B, n)


@pytest.mark.parametrize("case", case_params(decode=True))
def test_left_padded_batch_equals_rows_alone(case: Case) -> None:
    """Prompts of lengths 7, 3, 5 left-padded into one batch, prefilled with a mask, then 3 decode steps: every
    row's logits equal its own unpadded full forward (positions count real tokens only)."""
    model = build_model(case)
    lengths, steps = [7, 3, 5], 3
    width = max(lengths)
    prompts = [_tokens(model, 1, n, seed=10 + i)[0] for i, n in enumerate(lengths)]
    new = _tokens(model, len(lengths), steps, seed=20)  # (3, steps)
    idx = torch.zeros(len(lengths), width, dtype=torch.long)  # pads: token 0, which must not matter
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        idx[row, width - p.numel() :] = p
        mask[row, width - p.numel() :] = True
    with torch.no_grad():
        cache = model.new_cache(len(lengths), width + steps)
        prefill = model(idx, cache=cache, attention_mask=mask)  # (3, width, V)
        decoded = torch.cat([model(new[:, s : s + 1], cache=cache) for s in range(steps)], dim=1)  # (3, steps, V)
        assert torch.isfinite(prefill).all(), "pad positions must give finite (if meaningless) outputs"
        for row, p in enumerate(prompts):
            alone = model(torch.cat([p, new[row]])[None])[0]  # (n + steps, V)
            n = p.numel()
            err_prompt = (prefill[row, width - n :] - alone[:n]).abs().max().item()
            err_decode = (decoded[row] - alone[n:]).abs().max().item()
            assert err_prompt < TOL and err_decode < TOL, f"row {row}: {err_prompt:.3e} / {err_decode:.3e}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", case_params(decode=True))
def test_measured_cache_bytes_equal_analytic_count(case: Case, dtype: torch.dtype) -> None:
    """Bytes per cached token (summed over layers) == sum of `kv_cache_values_per_token` x element size."""
    model = build_model(case, dtype=dtype)
    cache = model.new_cache(3, 8)
    analytic = sum(
        type(block.attn).kv_cache_values_per_token(model.config, block.attn.options) for block in model.blocks
    )
    element = torch.tensor([], dtype=dtype).element_size()
    assert cache.nbytes_per_token() == analytic * element


@pytest.mark.parametrize("case", case_params(decode=True))
def test_cache_narrower_than_the_model(case: Case) -> None:
    """An fp32 model decodes against a bf16 cache (`new_cache(dtype=...)`): half the bytes, logits within bf16
    rounding of the full forward (the cached values are rounded, nothing else changes)."""
    model = build_model(case, dtype=torch.float32)
    idx = _tokens(model, 2, 8)  # (2, 8)
    with torch.no_grad():
        full = model(idx)  # (2, 8, V)
        cache = model.new_cache(2, 8, dtype=torch.bfloat16)
        got = torch.cat(
            [model(idx[:, :4], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(4, 8)], 1
        )
    assert got.dtype == torch.float32
    assert (got - full).abs().max().item() < 0.05 * full.abs().max().item()
    assert cache.nbytes_per_token() == model.new_cache(2, 8).nbytes_per_token() / 2
