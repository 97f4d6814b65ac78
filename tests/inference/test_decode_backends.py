"""Decoding with the paper's cache for mla, the deconstructed variants (arXiv 2510.11602) and hybrids (issue 16).

Every case: fp64, all parameters perturbed (norm gains away from 1, transforms away from the identity), the decode
logits equal the full forward's to 1e-10, token by token from an empty cache and after a left-padded prefill of
rows of different lengths followed by a multi-token chunk and single tokens. Also: the measured cache is what the
backend states (MLA: only the latent, no per-head keys, unless a q/k transform forbids absorption), recurrent
states have a size independent of the length, and the fixed-stream keys survive `select` / `reset`.
"""

from __future__ import annotations

import pytest
import torch

from lightning_cqk.attention import get_attention
from lightning_cqk.attention.deconstructed_mixing import recurrent_state_values
from lightning_cqk.config import ModelConfig
from lightning_cqk.model import GPT

C, NH, LAYERS, BLOCK, VOCAB = 32, 4, 2, 24, 61
# (id, attention, options, extra ModelConfig fields)
CASES = [
    ("mla", "mla", {}, {}),
    ("mla-math-bias", "mla", {"impl": "math"}, {"bias": True}),
    ("mla-qk_norm", "mla", {"qk_norm": True}, {}),
    ("mla-qk_norm-bias", "mla", {"qk_norm": True, "latent_norm": False}, {"bias": True}),
    ("mla-odd-dims", "mla", {"d_rope": 6, "d_nope": 5, "d_v": 7, "d_ckv": 9, "d_cq": 0}, {}),
    ("mla-d_rope-half", "mla", {"d_rope": 4}, {}),
    ("mla-learned-pos", "mla", {"qk_norm": True}, {"position": "learned"}),
    ("mla-invertible", "mla", {"qk_transform": {"kind": "invertible"}}, {}),
    ("mla-coupled-qk_norm", "mla", {"qk_norm": True, "qk_transform": {"kind": "coupled", "rope_order": "post"}}, {}),
    ("mlp", "mlp", {}, {}),
    ("approximate", "approximate", {}, {}),
    ("approximate-separate", "approximate", {"normalization": "separate", "chunk_size": 3, "qk_norm": True}, {}),
    ("approximate-math", "approximate", {"impl": "math"}, {"position": "learned"}),
    ("non_approximate", "non_approximate", {"chunk_size": 2}, {}),
    ("non_approximate-qk_norm", "non_approximate", {"chunk_size": 3, "qk_norm": True}, {}),
    ("static_emb_qk", "static_emb_qk", {}, {}),
    ("static_emb_qk-raw", "static_emb_qk", {"embedding_norm": False, "qk_norm": True, "impl": "math"}, {}),
    ("rnd_emb_qk", "rnd_emb_qk", {}, {}),
    ("rnd_emb_qk-learned", "rnd_emb_qk", {"qk_norm": True, "length": 20}, {"position": "learned"}),
    ("fixed_seq_qk", "fixed_seq_qk", {"qk_norm": True, "impl": "math"}, {}),
]
EVEN_STANDARD = [{"pattern": "even", "attention": "standard"}]
ODD_MLA = [{"pattern": "odd", "attention": "mla"}]
HYBRIDS = [  # the paper's hybrids: the variant in some layers, standard attention (or mla) in the others
    ("hybrid-approximate", "approximate", {}, {"n_layer": 3, "layer_overrides": EVEN_STANDARD}),
    ("hybrid-fixed_seq_qk", "fixed_seq_qk", {}, {"n_layer": 3, "layer_overrides": ODD_MLA}),
]
ALL = CASES + HYBRIDS


def build(attention: str, options: dict, extra: dict) -> GPT:
    fields = dict(n_embd=C, n_head=NH, n_layer=LAYERS, block_size=BLOCK, vocab_size=VOCAB, attention=attention)
    fields.update(extra)
    torch.manual_seed(0)
    model = GPT(ModelConfig(attention_options=options, **fields)).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the init's symmetries: gains != 1, transforms != identity
            p.add_(0.15 * torch.randn_like(p))
    return model


def full_logits(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """The training forward on one unpadded row (n,) -> (n, V)."""
    return model(tokens[None])[0]


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-10, f"{what}: max relative error {err:.3e}"


@pytest.mark.parametrize(("attention", "options", "extra"), [c[1:] for c in ALL], ids=[c[0] for c in ALL])
@torch.no_grad()
def test_token_by_token_from_empty_cache(attention, options, extra):
    model = build(attention, options, extra)
    tokens = torch.randint(0, VOCAB, (2, 9))
    cache = model.new_cache(2, 9)
    got = torch.cat([model(tokens[:, t : t + 1], cache=cache) for t in range(9)], dim=1)  # (2, 9, V)
    assert_close(got, model(tokens), "token by token")


@pytest.mark.parametrize(("attention", "options", "extra"), [c[1:] for c in ALL], ids=[c[0] for c in ALL])
@torch.no_grad()
def test_left_padded_prefill_then_chunk_then_tokens(attention, options, extra):
    """Rows of 3, 7 and 5 prompt tokens, left-padded to 7; then a 3-token chunk and 2 single tokens per row."""
    model = build(attention, options, extra)
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
        assert_close(got[b, P - n :], full_logits(model, rows[b]), f"row {b} ({n} prompt tokens)")


@pytest.mark.parametrize(("attention", "options", "extra"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_measured_cache_equals_the_analytic_count(attention, options, extra):
    model = build(attention, options, extra)
    cls = get_attention(attention)
    parsed = cls.parse_options(options)
    per_token = cls.kv_cache_values_per_token(model.config, parsed)
    for max_len in (4, 12):
        cache = model.new_cache(2, max_len)
        assert cache.nbytes_per_token() == LAYERS * per_token * 8, (max_len, cache.nbytes_per_token())
        assert cache.fixed_nbytes() == LAYERS * recurrent_state_values(model.config, parsed) * 8


def test_mla_caches_only_the_latent_and_decodes_absorbed():
    """Without a q/k transform the cache is [c_kv; RoPE(k_rope)] (plus one scale per head with qk_norm): no
    per-head key or value is ever materialised for a cached token, and W_uk / W_uv act on the query / output."""
    d_ckv, d_rope, hs = C // 4, C // NH, C // NH
    layer = build("mla", {}, {}).new_cache(2, 6).layers[0]
    assert {k: tuple(v.shape) for k, v in layer.buffers.items()} == {"latent": (2, 1, 6, d_ckv + d_rope)}
    layer = build("mla", {"qk_norm": True}, {}).new_cache(2, 6).layers[0]
    assert {k: tuple(v.shape) for k, v in layer.buffers.items()} == {
        "latent": (2, 1, 6, d_ckv + d_rope),
        "k_scale": (2, NH, 6, 1),
    }
    layer = build("mla", {"qk_transform": {"kind": "invertible"}}, {}).new_cache(2, 6).layers[0]
    assert {k: tuple(v.shape) for k, v in layer.buffers.items()} == {"k": (2, NH, 6, 2 * hs), "c_kv": (2, 1, 6, d_ckv)}
    # The decode path must not call the up-projections on the cache: W_uk and W_uv are only read as weights.
    model = build("mla", {"qk_norm": True}, {})
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


@pytest.mark.parametrize("attention", ["approximate", "non_approximate"])
def test_recurrent_state_does_not_grow_with_length(attention):
    model = build(attention, {}, {})
    sizes = {max_len: model.new_cache(3, max_len) for max_len in (2, 8, 24)}
    hs = C // NH
    per_layer = NH * ((1 + hs + hs * hs) * (hs + 1) if attention == "approximate" else hs + 2)
    for cache in sizes.values():
        assert cache.nbytes_per_token() == 0
        assert cache.fixed_nbytes() == LAYERS * per_layer * 8
    # and it stays that size while decoding
    cache = sizes[24]
    with torch.no_grad():
        for n in (1, 5, 17):
            model(torch.randint(0, VOCAB, (3, n)), cache=cache)
            assert cache.fixed_nbytes() == LAYERS * per_layer * 8


@torch.no_grad()
def test_select_and_reset_keep_decoding_exact():
    """Dropping a row and resetting keep every backend's state consistent (recurrent states are per row; the
    fixed-stream keys are per model)."""
    for attention in ("approximate", "non_approximate", "fixed_seq_qk", "mla"):
        model = build(attention, {}, {})
        tokens = torch.randint(0, VOCAB, (3, 8))
        cache = model.new_cache(3, 8)
        model(tokens[:, :5], cache=cache)
        cache.select([2, 0])
        got = torch.cat([model(tokens[[2, 0], t : t + 1], cache=cache) for t in (5, 6, 7)], dim=1)
        assert_close(got, model(tokens[[2, 0]])[:, 5:], f"{attention} after select")
        cache.reset()
        assert_close(model(tokens[[2, 0], :4], cache=cache), model(tokens[[2, 0], :4]), f"{attention} after reset")
