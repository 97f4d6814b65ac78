"""AttentionStats: values equal a hand computation; every backend reports the keys that apply to it."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_cqk.attention.rope import apply_rope
from lightning_cqk.callbacks import AttentionStats
from lightning_cqk.callbacks.attention_stats import attention_probe, stats_to_metrics
from lightning_cqk.model import GPT

SOFTMAX_STATS = {"max_logit", "entropy", "sink"}


def hand_stats(model: GPT, idx: torch.Tensor) -> dict[int, dict[str, float]]:
    """Per layer, from the weights: q, k, RoPE, scaled scores, then row-by-row softmax statistics in Python loops."""
    B, T = idx.shape
    nh, hs = model.config.n_head, model.config.head_size
    x = model.embed(model.wte(idx))
    ctx = model.context(T, embeddings=x)
    out = {}
    for layer, block in enumerate(model.blocks):
        a = block.norm_1(x)
        q = (a @ block.attn.q_proj.weight.T).view(B, T, nh, hs).transpose(1, 2)
        k = (a @ block.attn.k_proj.weight.T).view(B, T, nh, hs).transpose(1, 2)
        q, k = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
        max_logit, entropies, sinks = 0.0, [], []
        for b in range(B):
            for h in range(nh):
                for i in range(T):
                    row = scores[b, h, i, : i + 1].tolist()  # keys 0..i only (causal)
                    max_logit = max(max_logit, *(abs(s) for s in row))
                    top = max(row)
                    weights = [math.exp(s - top) for s in row]
                    p = [w / sum(weights) for w in weights]
                    entropies.append(-sum(pj * math.log(pj) for pj in p if pj > 0))
                    sinks.append(p[0])
        out[layer] = {
            "max_logit": max_logit,
            "entropy": sum(entropies) / len(entropies),
            "sink": sum(sinks) / len(sinks),
        }
        x = block(x, ctx)
    return out


def test_values_equal_hand_computation(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config()).double().eval()
    with torch.no_grad():
        for block in model.blocks:  # larger q/k weights: sharper maps, so the three statistics are not trivial
            block.attn.q_proj.weight.mul_(8.0)
            block.attn.k_proj.weight.mul_(8.0)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        got = attention_probe(model, idx)
        expected = hand_stats(model, idx)
    assert sorted(got) == [0, 1]
    for layer in (0, 1):
        assert set(got[layer]) == SOFTMAX_STATS
        for name in SOFTMAX_STATS:
            assert got[layer][name].item() == pytest.approx(expected[layer][name], rel=1e-10), (layer, name)
    assert expected[0]["max_logit"] > 1.0 and 0.05 < expected[0]["sink"] < 0.9


@pytest.mark.parametrize(
    "attention, options, keys",
    [
        ("standard", {}, SOFTMAX_STATS),
        ("mla", {}, SOFTMAX_STATS),
        ("coupled", {}, SOFTMAX_STATS | {"dt"}),
        ("uncoupled_mlp", {}, SOFTMAX_STATS | {"dt"}),
        ("differential", {}, SOFTMAX_STATS | {"lambda"}),
        ("static_emb_qk", {}, SOFTMAX_STATS),
        ("rnd_emb_qk", {}, SOFTMAX_STATS),
        ("non_approximate", {}, SOFTMAX_STATS),
        ("mlp", {}, set()),
        ("approximate", {}, set()),
    ],
)
def test_keys_per_backend(attention, options, keys, tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config(attention, attention_options=options)).eval()
    with torch.no_grad():
        stats = attention_probe(model, torch.randint(0, 64, (2, 16)))
    assert {layer: set(values) for layer, values in stats.items()} == {0: keys, 1: keys}
    metrics = stats_to_metrics(stats)
    assert set(metrics) == {f"attn/{k}/layer_{i:02d}" for k in keys for i in (0, 1)}
    assert all(torch.isfinite(v) for v in metrics.values())


def test_per_head_dt_gets_head_keys(tiny_config):
    model = GPT(tiny_config("coupled", attention_options={"dt_scope": "head"})).eval()
    with torch.no_grad():
        metrics = stats_to_metrics(attention_probe(model, torch.randint(0, 64, (1, 8))))
    assert {k for k in metrics if k.startswith("attn/dt/layer_01")} == {
        f"attn/dt/layer_01/head_{h:02d}" for h in range(4)
    }


def test_logged_in_training_on_a_fixed_probe(make_module, make_trainer, token_loader):
    monitor = AttentionStats(every_n_steps=2, probe_batch_size=2)
    trainer, logger = make_trainer([monitor], max_steps=5)
    loader = token_loader()
    trainer.fit(make_module(), loader)
    assert torch.equal(monitor.probe_tokens, next(iter(loader))[:2])
    for name in SOFTMAX_STATS:
        for layer in (0, 1):
            assert sorted(logger.series(f"attn/{name}/layer_{layer:02d}")) == [1, 3]
    assert monitor.calls == 2 and monitor.seconds > 0
    assert monitor.state_dict()["probe_tokens"].shape == (2, 17)


def test_finite_under_bf16_autocast(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config("differential")).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        metrics = stats_to_metrics(attention_probe(model, torch.randint(0, 64, (2, 16))))
    assert metrics and all(torch.isfinite(v) for v in metrics.values())
