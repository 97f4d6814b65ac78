"""Decoding with the paper's cache for mla, the deconstructed variants (arXiv 2510.11602) and hybrids (issue 16).

Their option sets are in `backend_cases.CASES`, so `test_decode.py` checks them like every backend (fp64 parity to
1e-10 token by token, chunked and left-padded; measured bytes = the analytic count; a narrower cache). Here, for
these backends: a left-padded prefill followed by a multi-token block (recurrent states and fixed-stream keys at
per-row positions); MLA caches only the latent and never up-projects a cached token (absorbed form); recurrent states
have a size independent of the length; `select` / `reset` keep decoding exact.
"""

from __future__ import annotations

import pytest
import torch
from backend_cases import CASES, Case, build_model, case_params

from lightning_cqk.attention.backends.deconstructed_mixing import recurrent_state_values

#: The backends whose decode paths live in mla.py, deconstructed_mixing.py and deconstructed_qk.py.
MINE = {"mla", "mlp", "approximate", "non_approximate", "static_emb_qk", "rnd_emb_qk", "fixed_seq_qk"}
MY_CASES = [case for case in CASES if case.backend in MINE]
C, NH, LAYERS, VOCAB = 32, 4, 2, 61  # backend_cases.BASE_CONFIG


def build(attention: str, options: dict | None = None, config: dict | None = None):
    return build_model(Case(attention, options or {}, config or {}))


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = (got - want).abs().max().item()
    assert err < 1e-10, f"{what}: max |decoded - full| = {err:.3e}"


@pytest.mark.parametrize("case", case_params(MY_CASES, decode=True))
@torch.no_grad()
def test_left_padded_prefill_then_chunk_then_tokens(case):
    """Rows of 3, 7 and 5 prompt tokens, left-padded to 7; then a 3-token chunk and 2 single tokens per row (a
    multi-token block after padding: recurrent states and the fixed-stream keys at per-row positions)."""
    model = build_model(case)
    lengths, P, extra_tokens = [3, 7, 5], 7, 5
    rows = [torch.randint(0, VOCAB, (n + extra_tokens,)) for n in lengths]
    prompt = torch.zeros(3, P, dtype=torch.long)
    mask = torch.zeros(3, P, dtype=torch.bool)
    for b, n in enumerate(lengths):
        prompt[b, P - n :] = rows[b][:n]
        mask[b, P - n :] = True
    cache = model.new_cache(3, P + extra_tokens)
    outs = [model(prompt, cache=cache, attention_mask=mask)]  # (3, P, V)
    rest = torch.stack([r[n:] for r, n in zip(rows, lengths, strict=True)])  # (3, 5)
    outs.append(model(rest[:, :3], cache=cache))  # (3, 3, V): several tokens after the prompt
    outs += [model(rest[:, t : t + 1], cache=cache) for t in (3, 4)]
    got = torch.cat(outs, dim=1)  # (3, P + 5, V)
    assert torch.isfinite(got).all(), "pad positions must be finite garbage"
    for b, n in enumerate(lengths):
        assert_close(got[b, P - n :], model(rows[b][None])[0], f"row {b} ({n} prompt tokens)")


def test_mla_caches_only_the_latent_and_decodes_absorbed():
    """Without a q/k transform the cache is [c_kv; RoPE(k_rope)] (plus one scale per head with qk_norm): a
    single-token step materialises no per-head key or value of a cached token, W_uk / W_uv act on the query / output
    (a multi-token prefill chunk materialises them: `test_mla_prefill_materialises_and_steps_stay_absorbed`)."""
    d_ckv, d_rope, hs = C // 4, C // NH, C // NH
    layer = build("mla").new_cache(2, 6).layers[0]
    assert {k: tuple(v.shape) for k, v in layer.buffers.items()} == {"latent": (2, 1, 6, d_ckv + d_rope)}
    layer = build("mla", {"qk_norm": True}).new_cache(2, 6).layers[0]
    assert {k: tuple(v.shape) for k, v in layer.buffers.items()} == {
        "latent": (2, 1, 6, d_ckv + d_rope),
        "k_scale": (2, NH, 6, 1),
    }
    layer = build("mla", {"qk_transform": {"kind": "invertible"}}).new_cache(2, 6).layers[0]
    assert {k: tuple(v.shape) for k, v in layer.buffers.items()} == {"k": (2, NH, 6, 2 * hs), "c_kv": (2, 1, 6, d_ckv)}
    # The decode path must not call the up-projections on the cache: W_uk and W_uv are only read as weights.
    model = build("mla", {"qk_norm": True})
    calls = []
    for block in model.blocks:
        for name in ("uk_proj", "uv_proj"):
            getattr(block.attn, name).register_forward_hook(lambda m, i, o, name=name: calls.append(i[0].shape))
    cache = model.new_cache(1, 8)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 5)), cache=cache)
        calls.clear()
        model(torch.randint(0, VOCAB, (1, 1)), cache=cache)
    # qk_norm computes the new token's key scale from its own k^h (one token), never the 6 held ones.
    assert all(shape[-2] == 1 for shape in calls), calls


@pytest.mark.parametrize(
    "options, config",
    [
        ({}, {}),
        ({"qk_norm": True, "latent_norm": False}, {"bias": True}),
        ({"d_rope": 6, "d_nope": 5, "d_v": 7, "d_ckv": 9, "d_cq": 0}, {}),
        ({"qk_transform": {"kind": "invertible"}}, {}),
    ],
    ids=["plain", "qk_norm-bias", "odd-widths-no-q-latent", "qk_transform"],
)
@torch.no_grad()
def test_mla_prefill_materialises_and_steps_stay_absorbed(options, config):
    """prefill "materialised" (default): a chunk of T > 1 tokens up-projects the L held latents once through W_uk
    (keys; with a qk_transform the cache holds the keys) and W_uv (values); a single token calls neither on more than
    its own row (qk_norm's key scale). prefill "absorbed" never up-projects held latents. Both give the same outputs
    to 1e-10 (left-padded prompt of 6, a 3-token chunk, 2 single tokens), and the same cache contents."""
    models = {p: build("mla", {**options, "prefill": p}, config) for p in ("materialised", "absorbed")}
    models["absorbed"].load_state_dict(models["materialised"].state_dict())
    idx = torch.randint(0, VOCAB, (2, 11))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :2] = False  # row 1: 4 prompt tokens after 2 pads
    rows = {}  # {(prefill, name): rows seen per call}
    outs, caches = {}, {}
    for prefill, model in models.items():
        for name in ("uk_proj", "uv_proj"):
            rows[prefill, name] = seen = []
            for block in model.blocks:
                getattr(block.attn, name).register_forward_hook(lambda m, i, o, seen=seen: seen.append(i[0].shape[-2]))
        caches[prefill] = cache = model.new_cache(2, 11)
        steps = [model(idx[:, :6], cache=cache, attention_mask=mask), model(idx[:, 6:9], cache=cache)]
        steps += [model(idx[:, t : t + 1], cache=cache) for t in (9, 10)]
        outs[prefill] = torch.cat(steps, dim=1)  # (2, 11, V)
    assert_close(outs["absorbed"], outs["materialised"], "prefill absorbed vs materialised")
    for a, b in zip(caches["absorbed"].layers, caches["materialised"].layers, strict=True):
        assert a.buffers.keys() == b.buffers.keys()
        for key in a.buffers:
            assert_close(a.buffers[key], b.buffers[key], f"cache {key!r}")
    # Rows each hooked call sees, layer by layer: the prompt (6), the chunk (3; 9 held), then single tokens (1).
    new_rows = [n for n in (6, 3, 1, 1) for _ in range(LAYERS)]  # W_uk on the new tokens (key scale / transform)
    held_rows = [n for n in (6, 9) for _ in range(LAYERS)]  # W_uv (and W_uk) on every held latent, chunks only
    assert rows["materialised", "uv_proj"] == held_rows, rows["materialised", "uv_proj"]
    assert rows["absorbed", "uv_proj"] == []
    uk = rows["materialised", "uk_proj"]
    if "qk_transform" in options:  # the transformed keys come from the cache: W_uk only on each call's new rows
        assert uk == new_rows, uk
    elif options.get("qk_norm"):  # per layer: new rows (key scale), then in a chunk the held rows (keys)
        assert uk == [n for pair in ((6, 6), (3, 9), (1,), (1,)) for _ in range(LAYERS) for n in pair], uk
    else:  # no W_uk call in a single-token step
        assert uk == held_rows, uk
    plain = "qk_transform" not in options and not options.get("qk_norm")
    assert rows["absorbed", "uk_proj"] == ([] if plain else new_rows), rows["absorbed", "uk_proj"]


@pytest.mark.parametrize("attention", ["approximate", "non_approximate"])
def test_recurrent_state_does_not_grow_with_length(attention):
    """0 bytes per token; a fixed state per sequence (the count by hand), whatever max_len and the tokens held, kept
    in fp32 even for a bf16 cache (a running sum)."""
    model = build(attention)
    hs = C // NH
    per_layer = NH * ((1 + hs + hs * hs) * (hs + 1) if attention == "approximate" else hs + 2)
    assert recurrent_state_values(model.config, model.blocks[0].attn.options) == per_layer
    caches = [model.new_cache(3, max_len) for max_len in (2, 8, 16)]
    for cache in caches:
        assert cache.nbytes_per_token() == 0
        assert cache.fixed_nbytes() == LAYERS * per_layer * 8
    cache = caches[-1]
    with torch.no_grad():
        for n in (1, 5, 9):
            model(torch.randint(0, VOCAB, (3, n)), cache=cache)
            assert cache.fixed_nbytes() == LAYERS * per_layer * 8
    assert model.new_cache(3, 8, dtype=torch.bfloat16).fixed_nbytes() == LAYERS * per_layer * 4


@torch.no_grad()
def test_select_and_reset_keep_decoding_exact():
    """Dropping a row and resetting keep every backend's state consistent (recurrent states are per row; the
    fixed-stream keys are per model)."""
    for attention in ("approximate", "non_approximate", "fixed_seq_qk", "mla"):
        model = build(attention)
        tokens = torch.randint(0, VOCAB, (3, 8))
        cache = model.new_cache(3, 8)
        model(tokens[:, :5], cache=cache)
        cache.select([2, 0])
        got = torch.cat([model(tokens[[2, 0], t : t + 1], cache=cache) for t in (5, 6, 7)], dim=1)
        assert_close(got, model(tokens[[2, 0]])[:, 5:], f"{attention} after select")
        cache.reset()
        assert_close(model(tokens[[2, 0], :4], cache=cache), model(tokens[[2, 0], :4]), f"{attention} after reset")
