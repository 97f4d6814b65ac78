"""Weight-decay groups and the warmup + cosine schedule."""

from __future__ import annotations

import math

import pytest

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.optim import OptimConfig, warmup_cosine, weight_decay_groups


def test_schedule_shape():
    lrs = [warmup_cosine(s, warmup_steps=10, decay_steps=110, min_ratio=0.1) for s in range(130)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0)
    assert max(lrs) == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(lrs[10:110], lrs[11:111])), "monotone decay after warmup"
    assert lrs[110:] == [pytest.approx(0.1)] * 20


def test_weight_decay_on_matrices_only():
    model = GPT(ModelConfig(vocab_size=50, n_layer=2, bias=True))
    decay, no_decay = weight_decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == model.num_parameters()["total"], "every parameter exactly once (tied weights once)"
    assert any(p is model.wte.weight for p in decay["params"])


def test_bad_optim_values():
    with pytest.raises(ValueError, match="lr"):
        OptimConfig(lr=0)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        OptimConfig(min_lr_ratio=2)


def test_bias_banks_opt_out_of_weight_decay():
    model = GPT(ModelConfig(vocab_size=50, n_layer=2, attention="coupled"))
    decay, no_decay = weight_decay_groups(model, 0.1)
    bank = model.blocks[0].attn
    biases = [p for n, p in bank.named_parameters() if n.rsplit(".", 1)[-1] in ("b1", "b2")]
    assert biases and all(p.dim() == 2 for p in biases)
    assert all(any(p is q for q in no_decay["params"]) for p in biases)
    assert not any(any(p is q for q in decay["params"]) for p in biases)
