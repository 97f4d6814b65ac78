"""Issue 17 model knobs: the three dropouts (each acts only where it says), residual_init plain vs scaled, vocabulary
padding, grouped K/V heads for `differential` and no query latent for `mla`, each against its degenerate case."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lightning_cqk.attention import build_attention
from lightning_cqk.attention.base import AttentionContext
from lightning_cqk.attention.rope import build_rope_cache
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.optim import QKClip, QuacK


def small(**kw) -> ModelConfig:
    base = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)
    return ModelConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------------- dropouts
def zero_fractions(config: ModelConfig, seed: int = 0) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
    """Train-mode fraction of exact zeros in the embedding dropout's, every attention's and every MLP's output, and
    the train- and eval-mode logits on the same tokens."""
    torch.manual_seed(0)
    model = GPT(config).double()
    idx = torch.randint(0, 64, (4, 16))
    seen: dict[str, list[float]] = {"embd": [], "attn": [], "mlp": []}

    def hook(key):
        return lambda m, a, out: seen[key].append(float((out == 0).double().mean()))

    model.drop.register_forward_hook(hook("embd"))
    for block in model.blocks:
        block.attn.register_forward_hook(hook("attn"))
        block.mlp.register_forward_hook(hook("mlp"))
    torch.manual_seed(seed)
    train = model.train()(idx)
    seen_train = {k: max(v) for k, v in seen.items()}
    eval_ = model.eval()(idx)
    return seen_train, train, eval_


@pytest.mark.parametrize("attention", ["standard", "differential", "mla"])
def test_each_dropout_acts_only_where_it_says(attention: str):
    off = dict(embd_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)
    # embd: half the block input is zeroed, nothing downstream is
    zeros, train, eval_ = zero_fractions(small(attention=attention, **{**off, "embd_dropout": 0.5}))
    assert 0.4 < zeros["embd"] < 0.6 and zeros["attn"] == 0 and zeros["mlp"] == 0
    assert not torch.allclose(train, eval_)
    # resid: half of every residual branch output is zeroed, the embeddings are not
    zeros, train, eval_ = zero_fractions(small(attention=attention, **{**off, "resid_dropout": 0.5}))
    assert zeros["embd"] == 0 and 0.4 < zeros["attn"] < 0.6 and 0.4 < zeros["mlp"] < 0.6
    # attn: the attention weights are dropped (outputs change), the outputs are not: only a query whose every kept
    # weight was dropped (early positions, few keys) gives a zero row
    zeros, train, eval_ = zero_fractions(small(attention=attention, **{**off, "attn_dropout": 0.5}))
    assert zeros["embd"] == 0 and zeros["attn"] < 0.1 and zeros["mlp"] == 0
    assert not torch.allclose(train, eval_)
    # all three at 0 (whatever `dropout` says): train mode is eval mode exactly
    zeros, train, eval_ = zero_fractions(small(attention=attention, dropout=0.3, **off))
    assert zeros == {"embd": 0, "attn": 0, "mlp": 0} and torch.equal(train, eval_)


def test_dropout_is_the_shorthand_and_specific_values_win():
    cfg = small(dropout=0.2, resid_dropout=0.1)
    assert (cfg.embd_dropout_p, cfg.attn_dropout_p, cfg.resid_dropout_p) == (0.2, 0.2, 0.1)
    model = GPT(cfg)
    assert model.drop.p == 0.2 and model.blocks[0].attn.attn_dropout == 0.2
    assert model.blocks[0].attn.resid_dropout.p == 0.1 and model.blocks[0].mlp.dropout.p == 0.1
    # The shorthand alone gives today's model: one value everywhere.
    torch.manual_seed(0)
    a = GPT(small(dropout=0.3)).train()
    torch.manual_seed(0)
    b = GPT(small(embd_dropout=0.3, attn_dropout=0.3, resid_dropout=0.3)).train()
    idx = torch.randint(0, 64, (2, 16))
    torch.manual_seed(1)
    ya = a(idx)
    torch.manual_seed(1)
    assert torch.equal(ya, b(idx))
    with pytest.raises(ValueError, match="attn_dropout must be in"):
        small(attn_dropout=1.0)


# ----------------------------------------------------------------------------------------------- init
def test_plain_vs_scaled_residual_init_statistics():
    kw = dict(vocab_size=64, n_layer=8, n_embd=256, n_head=4, block_size=16, bias=True)
    models = {}
    for mode in ("scaled", "plain"):
        torch.manual_seed(0)
        models[mode] = GPT(ModelConfig(residual_init=mode, **kw))
    scaled_std = 0.02 / math.sqrt(2 * 8)
    for mode, model in models.items():
        for name, p in model.named_parameters():
            if p.dim() != 2:
                continue
            want = scaled_std if (mode == "scaled" and ".out_proj." in name) else 0.02
            assert float(p.std()) == pytest.approx(want, rel=0.05), (mode, name)
            assert abs(float(p.mean())) < 0.1 * want, (mode, name)
    # Only the out_proj weights differ between the two (the same draws everywhere else); biases are zero in both.
    for (name, a), b in zip(models["scaled"].named_parameters(), models["plain"].parameters(), strict=True):
        assert torch.equal(a, b) != (".out_proj.weight" in name), name
    with pytest.raises(ValueError, match="residual_init"):
        small(residual_init="gpt2")


def test_vocab_multiple_pads_the_table_and_head_only():
    cfg = ModelConfig(preset="tiny", vocab_multiple=64)
    assert cfg.vocab_size == 50257 and cfg.padded_vocab_size == 50304
    assert small(vocab_multiple=1).padded_vocab_size == 64
    with torch.device("meta"):
        model = GPT(cfg)
    assert model.wte.weight.shape == (50304, 128) and model.lm_head.weight is model.wte.weight
    counts = model.num_parameters()
    assert counts["vocab_padding"] == 47 * 128, "the padding rows, reported apart (tied: one table)"
    with torch.device("meta"):
        untied = GPT(ModelConfig(preset="tiny", vocab_multiple=64, tie_embeddings=False))
    assert untied.num_parameters()["vocab_padding"] == 2 * 47 * 128
    assert GPT(small(vocab_multiple=1)).num_parameters()["vocab_padding"] == 0
    with pytest.raises(ValueError, match="vocab_multiple"):
        small(vocab_multiple=0)


def test_every_shipped_gpt2_config_pads_the_vocabulary():
    """Issue 32 item 5: 50,257 head rows misalign the output head's GEMM on tensor cores (nanoGPT measured ~25% for
    50,257 -> 50,304). Every shipped GPT-2 training config pads to a multiple of 64; the ablation specs keep the
    configurations their committed runs were trained with."""
    import yaml

    configs = Path(__file__).resolve().parents[3] / "configs"
    checked = []
    for path in sorted(configs.rglob("*.yaml")):
        if "ablations" in path.parts:
            continue
        config = yaml.safe_load(path.read_text()) or {}
        data = (config.get("data") or {}).get("init_args") or config.get("data") or {}
        model = ((config.get("model") or {}).get("config")) or {}
        if isinstance(data, dict) and data.get("tokenizer") == "gpt2":
            checked.append(path.name)
            assert model.get("vocab_multiple", 1) % 64 == 0, f"{path}: vocab_multiple {model.get('vocab_multiple', 1)}"
    assert len(checked) >= 9, checked


# -------------------------------------------------------------------------------- differential GQA
def ctx_for(config: ModelConfig, T: int) -> AttentionContext:
    cos, sin = build_rope_cache(T, config.head_size, config.rope_base)
    return AttentionContext(cos=cos.double(), sin=sin.double())


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("groups", [2, 4])
def test_differential_grouped_kv_equals_the_official_repeat(impl: str, groups: int):
    """GQA-g differential == ungrouped differential whose K/V rows are repeated as the official `repeat_kv` does."""
    n_head, C = 8, 64
    hs = C // n_head
    grouped_cfg = ModelConfig(
        vocab_size=64, n_layer=3, n_embd=C, n_head=n_head, block_size=16, attention="differential",
        attention_options={"impl": impl, "n_kv_groups": groups},
    )  # fmt: skip
    full_cfg = grouped_cfg.replace(attention_options={"impl": impl})
    torch.manual_seed(0)
    g = build_attention(grouped_cfg, 2).double()
    f = build_attention(full_cfg, 2).double()
    n_rep = n_head // groups
    with torch.no_grad():
        shared = {k: v for k, v in g.state_dict().items() if not k.startswith(("k_proj", "v_proj"))}
        f.load_state_dict(shared, strict=False)  # q, out, lambda vectors, head norm
        # key half-head j of the full layer is key half-head j // n_rep; value head i is value head i // n_rep
        f.k_proj.weight.copy_(g.k_proj.weight.view(groups, hs, C).repeat_interleave(n_rep, 0).reshape(C, C))
        f.v_proj.weight.copy_(g.v_proj.weight.view(groups // 2, 2 * hs, C).repeat_interleave(n_rep, 0).reshape(C, C))
    x = torch.randn(2, 16, C, dtype=torch.float64)
    ctx = ctx_for(grouped_cfg, 16)
    torch.testing.assert_close(g(x, ctx), f(x, ctx), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g.attention_logits(x, ctx), f.attention_logits(x, ctx), rtol=1e-12, atol=1e-12)
    # Parameters: K and V shrink to nkv * hs rows, as standard GQA-g.
    assert g.k_proj.weight.shape == (groups * hs, C) and g.v_proj.weight.shape == (groups * hs, C)
    std = build_attention(grouped_cfg.replace(attention="standard", attention_options={"n_kv_groups": groups}), 2)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(g) == count(std) + 6 * hs


def test_differential_kv_groups_equal_to_n_head_is_todays_layer():
    torch.manual_seed(0)
    a = GPT(small(attention="differential")).double()
    torch.manual_seed(0)
    b = GPT(small(attention="differential", attention_options={"n_kv_groups": 4})).double()
    idx = torch.randint(0, 64, (2, 16))
    assert torch.equal(a(idx), b(idx))
    with pytest.raises(ValueError, match="choose among \\[2, 4\\]"):
        small(attention="differential", attention_options={"n_kv_groups": 1})


def test_quack_and_qk_clip_on_grouped_differential():
    model = GPT(small(attention="differential", attention_options={"n_kv_groups": 2}))
    control = QuacK(model, tau=0.3)
    assert [t.n_blocks for t in control.targets[:2]] == [4, 2]  # q half-heads, key half-heads
    assert all(torch.allclose(f, torch.full_like(f, 0.3)) for f in control.factors())
    clip = QKClip(model, tau_clip=1e-3)
    model.train()(torch.randint(0, 64, (2, 16))).sum().backward()
    q_before = model.blocks[0].attn.q_proj.weight.detach().clone()
    k_before = model.blocks[0].attn.k_proj.weight.detach().clone()
    clip.after_step()
    assert torch.equal(model.blocks[0].attn.k_proj.weight, k_before), "shared key heads stay"
    assert not torch.equal(model.blocks[0].attn.q_proj.weight, q_before)
    clip.remove_hooks()


# ------------------------------------------------------------------------------------- mla without q latent
@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_mla_without_query_latent_is_the_latent_form_with_identity_down_projection(impl: str):
    C = 32
    base = dict(vocab_size=64, n_layer=1, n_embd=C, n_head=4, block_size=16, attention="mla")
    plain_cfg = ModelConfig(**base, attention_options={"impl": impl, "d_cq": 0, "latent_norm": False})
    latent_cfg = ModelConfig(**base, attention_options={"impl": impl, "d_cq": C, "latent_norm": False})
    torch.manual_seed(0)
    a = build_attention(plain_cfg, 0).double()
    b = build_attention(latent_cfg, 0).double()
    assert a.dq_proj is None and a.q_latent_norm is None and a.uq_proj.in_features == C
    with torch.no_grad():
        for name in ("uq_proj", "qr_proj", "dkv_proj", "uk_proj", "uv_proj", "kr_proj", "out_proj"):
            getattr(b, name).weight.copy_(getattr(a, name).weight)
        b.dq_proj.weight.copy_(torch.eye(C, dtype=torch.float64))
    x = torch.randn(2, 16, C, dtype=torch.float64)
    ctx = ctx_for(plain_cfg, 16)
    torch.testing.assert_close(a(x, ctx), b(x, ctx), rtol=1e-12, atol=1e-12)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(a) == count(b) - C * C
    # With latent norms: only the key/value latent keeps its norm.
    c = build_attention(ModelConfig(**base, attention_options={"d_cq": 0}), 0)
    assert c.q_latent_norm is None and c.kv_latent_norm is not None
    assert count(c) == count(a) + c.dims.d_ckv


def test_quack_mla_without_query_latent():
    model = GPT(small(attention="mla", attention_options={"d_cq": 0}))
    control = QuacK(model, tau=0.5)
    assert [t.role for t in control.targets[:5]] == ["uq", "qr", "dkv", "uk", "kr"]
    assert all(torch.allclose(f, torch.full_like(f, 0.5)) for f in control.factors())
    with torch.no_grad():  # doubling W_uk^h halves W_uq^h's factor (|W_dq| = 1 is constant)
        model.blocks[0].attn.uk_proj.weight[8:16] *= 2.0
    factors = control.factors()
    torch.testing.assert_close(factors[0], torch.tensor([0.5, 0.25, 0.5, 0.5]))
