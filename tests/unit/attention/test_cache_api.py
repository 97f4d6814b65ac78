"""The decode cache's bookkeeping and refusals: capacity, masks, reset, select, and the training path untouched."""

from __future__ import annotations

import pytest
import torch
from backend_cases import Case, build_model

from lightning_cqk.attention.cache import LayerCache

STANDARD = Case("standard", {"qkv_sharing": "k_eq_v", "n_kv_groups": 2})


def test_writing_past_max_len_raises_and_says_what_to_do() -> None:
    model = build_model(STANDARD)
    cache = model.new_cache(2, 4)
    with torch.no_grad():
        model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match=r"holds 3 of max_len=4 .* cannot take 2 more.*max_len >= 5"):
            model(torch.zeros(2, 2, dtype=torch.long), cache=cache)
        assert cache.length == 3  # the refused forward left the cache as it was
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache)  # the last slot still works
    with pytest.raises(ValueError, match="exceeds the model's block_size 16"):
        model.new_cache(1, 17)
    layer = LayerCache(1, 2, buffers={"k": (1, 4)})
    with pytest.raises(ValueError, match="larger max_len"):
        layer.append(k=torch.zeros(1, 1, 3, 4))


def test_bad_masks_are_refused() -> None:
    model = build_model(STANDARD)
    idx = torch.zeros(2, 3, dtype=torch.long)
    with torch.no_grad():
        with pytest.raises(ValueError, match="LEFT padding"):
            model(idx, cache=model.new_cache(2, 4), attention_mask=torch.tensor([[True, False, True], [True] * 3]))
        with pytest.raises(ValueError, match=r"bool tensor of shape \(batch, tokens\) = \(2, 3\)"):
            model(idx, cache=model.new_cache(2, 4), attention_mask=torch.ones(2, 3))
        with pytest.raises(ValueError, match="only used with a decode cache"):
            model(idx, attention_mask=torch.ones(2, 3, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"built for 3.*model\.new_cache\(2, max_len\)"):
            model(idx, cache=model.new_cache(3, 4))


def test_decoding_in_training_mode_with_dropout_is_refused() -> None:
    model = build_model(Case("standard", {}, {"dropout": 0.1})).train()
    with pytest.raises(ValueError, match=r"call model.eval\(\) first"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=model.new_cache(1, 4))
    model.eval()
    model(torch.zeros(1, 2, dtype=torch.long), cache=model.new_cache(1, 4))  # the fix the message gives works


def test_reset_and_select_rows() -> None:
    """reset() gives a fresh cache; select(rows) keeps those rows' decoding exactly (incl. their padding)."""
    model = build_model(STANDARD)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 61, (3, 6), generator=g)  # (3, 6)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, :2] = False  # row 1 is left-padded
    nxt = torch.randint(0, 61, (3, 2), generator=g)  # (3, 2)
    with torch.no_grad():
        cache = model.new_cache(3, 8)
        model(idx, cache=cache, attention_mask=mask)
        ref = torch.cat([model(nxt[:, s : s + 1], cache=cache) for s in range(2)], dim=1)  # (3, 2, V)
        cache.reset()
        assert cache.length == 0 and all(layer.length == 0 for layer in cache.layers)
        model(idx, cache=cache, attention_mask=mask)
        again = model(nxt[:, :1], cache=cache)  # (3, 1, V)
        assert torch.equal(again, ref[:, :1])
        cache.select([2, 1])
        kept = model(nxt[[2, 1], 1:], cache=cache)  # (2, 1, V)
        assert (kept - ref[[2, 1], 1:]).abs().max().item() < 1e-12
        assert cache.batch_size == 2


def test_training_forward_ignores_decode_machinery() -> None:
    """The forward without a cache is the training forward: same logits before and after decoding, and gradients."""
    model = build_model(STANDARD)
    idx = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(3))
    before = model(idx)
    with torch.no_grad():
        cache = model.new_cache(2, 8)
        model(idx, cache=cache)
    after = model(idx)
    assert torch.equal(before, after)
    after.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_step_has_no_host_sync() -> None:
    """A decode step (T = 1, SDPA, with and without padding so far) never synchronises with the host."""
    model = build_model(STANDARD, dtype=torch.float32).cuda()
    idx = torch.randint(0, 61, (2, 6), device="cuda")
    mask = torch.ones(2, 6, dtype=torch.bool, device="cuda")
    mask[0, :2] = False
    for prefill_mask in (None, mask):
        cache = model.new_cache(2, 10)
        with torch.no_grad():
            model(idx, cache=cache, attention_mask=prefill_mask)
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(3):
                    model(idx[:, :1], cache=cache)
            finally:
                torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_masked_attention_sdpa_equals_math(n_kv: int) -> None:
    """The decode attention's fused path (grouped queries folded into the query axis) equals the explicit path."""
    from lightning_cqk.attention.kernels.functional import masked_attention

    g = torch.Generator().manual_seed(n_kv)
    q = torch.randn(3, 4, 5, 8, generator=g, dtype=torch.float64)  # (B, nh, T, d)
    k = torch.randn(3, n_kv, 9, 8, generator=g, dtype=torch.float64)  # (B, nkv, L, d)
    v = torch.randn(3, n_kv, 9, 6, generator=g, dtype=torch.float64)  # (B, nkv, L, hv)
    mask = torch.rand(3, 1, 5, 9, generator=g) < 0.6
    mask[..., -1] = True  # every query sees at least one key
    for m in (mask, None):
        fused = masked_attention(q, k, v, m, impl="sdpa")  # (B, nh, T, hv)
        assert (fused - masked_attention(q, k, v, m, impl="math")).abs().max().item() < 1e-12
