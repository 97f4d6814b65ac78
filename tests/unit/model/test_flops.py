"""Analytic FLOPs agree with a measured count (torch.utils.flop_counter) for every backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from lightning_cqk import attention
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import forward_flops_per_step, forward_flops_per_token, training_flops_per_batch
from lightning_cqk.model_config import ModelConfig


def measured_training_flops(config: ModelConfig, B: int, T: int) -> int:
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (B, T))
    with FlopCounterMode(display=False) as counter:
        logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", attention.available())
def test_analytic_flops_match_measured(name):
    config = ModelConfig(vocab_size=97, n_layer=2, n_embd=64, n_head=4, block_size=32, attention=name)
    B, T = 2, 32
    measured = measured_training_flops(config, B, T)
    analytic = training_flops_per_batch(config, B, T)
    assert abs(analytic - measured) / measured < 0.15, (analytic, measured)


def test_forward_flops_formula_standard():
    c = ModelConfig(vocab_size=100, n_layer=2, n_embd=64, n_head=4, mlp_hidden=256, block_size=16)
    per_layer = 8 * 64 * 64 + 4 * 16 * 64 + 2 * 2 * 64 * 256
    assert forward_flops_per_token(c, 16) == 2 * per_layer + 2 * 64 * 100


def test_per_step_flops_only_for_reference_streams():
    plain = ModelConfig(vocab_size=97, n_layer=2, n_embd=64, n_head=4, block_size=32)
    assert forward_flops_per_step(plain) == 0
    stream = plain.replace(attention="rnd_emb_qk")
    assert forward_flops_per_step(stream) > 0
    a, b = training_flops_per_batch(stream, 1, 32), training_flops_per_batch(stream, 2, 32)
    assert b - a < a, "the stream is paid once per step, not per sequence"
