"""Sampling: greedy at temperature 0, top-k, the nucleus rule of top-p at its edges, temperature's distribution,
seeded draws."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from lightning_cqk.inference import SamplingConfig, filter_logits, make_generator, sample


def _logits(B: int = 6, V: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 3  # (B, V), no ties


def test_temperature_zero_is_argmax_and_needs_no_generator():
    logits = _logits()
    assert torch.equal(sample(logits, SamplingConfig(temperature=0)), logits.argmax(-1))
    assert torch.equal(sample(logits, SamplingConfig(temperature=0, top_k=3, top_p=0.1)), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [1e-30, 1e-38, 1e-45, 1e-300])
def test_a_tiny_positive_temperature_is_greedy_not_an_overflow(temperature):
    """Any temperature > 0 is accepted, so logits / temperature must not overflow to inf (softmax -> NaN)."""
    logits = _logits()
    drawn = sample(logits, SamplingConfig(temperature=temperature, top_p=0.9), make_generator(0))
    assert torch.equal(drawn, logits.argmax(-1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_k_one_is_greedy(seed):
    logits = _logits(seed=seed)
    drawn = sample(logits, SamplingConfig(temperature=1.5, top_k=1), make_generator(seed))
    assert torch.equal(drawn, logits.argmax(-1))


def test_top_k_keeps_exactly_k_and_larger_than_vocab_keeps_all():
    logits = _logits()
    kept = torch.isfinite(filter_logits(logits, SamplingConfig(top_k=5)))
    assert kept.sum(-1).tolist() == [5] * 6
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(5).indices, True))
    assert torch.isfinite(filter_logits(logits, SamplingConfig(top_k=10_000))).all()


def test_top_p_nucleus_edges():
    """probs (0.5, 0.375, 0.125) are exact in binary: top_p = 0.875 is reached by two tokens, a hair more needs
    three; any top_p <= 0.5 keeps the top token only; top_p = 1 keeps all."""
    logits = torch.log(torch.tensor([[0.125, 0.5, 0.375]]))  # (1, 3), the top token is id 1

    def kept(p: float) -> list[bool]:
        return torch.isfinite(filter_logits(logits, SamplingConfig(top_p=p)))[0].tolist()

    assert kept(0.875) == [False, True, True]
    assert kept(0.8751) == [True, True, True]
    assert kept(0.5) == [False, True, False]
    assert kept(1e-9) == [False, True, False]
    assert kept(1.0) == [True, True, True]


def test_tiny_top_p_is_greedy_and_filtered_draws_stay_in_the_set():
    logits = _logits(B=64)
    g = make_generator(0)
    assert torch.equal(sample(logits, SamplingConfig(top_p=1e-6), g), logits.argmax(-1))
    allowed = torch.isfinite(filter_logits(logits, SamplingConfig(temperature=2.0, top_k=7, top_p=0.6)))
    for _ in range(20):
        drawn = sample(logits, SamplingConfig(temperature=2.0, top_k=7, top_p=0.6), g)  # (B,)
        assert allowed.gather(1, drawn[:, None]).all()


def test_draws_follow_softmax_of_logits_over_temperature():
    """20,000 draws at temperature 2 match softmax(logits / 2) (chi-square); at temperature 1 they would not."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 3.0])
    n = 20_000
    drawn = sample(logits.expand(n, -1), SamplingConfig(temperature=2.0), make_generator(7))  # (n,)
    counts = torch.bincount(drawn, minlength=5).double()
    for temperature, should_fit in ((2.0, True), (1.0, False)):
        expected = torch.softmax(logits.double() / temperature, -1) * n
        p = chisquare(counts.numpy(), expected.numpy()).pvalue
        assert (p > 1e-3) == should_fit, (temperature, p)


def test_seeded_draws_are_reproducible():
    logits = _logits(B=32)
    cfg = SamplingConfig(temperature=1.0, top_p=0.9)
    a = sample(logits, cfg, make_generator(3))
    assert torch.equal(a, sample(logits, cfg, make_generator(3)))
    assert not torch.equal(a, sample(logits, cfg, make_generator(4)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"top_k": 2.5}, "whole number"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
    ],
)
def test_invalid_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_sampling_without_a_generator_is_refused():
    with pytest.raises(ValueError, match="torch.Generator"):
        sample(_logits(), SamplingConfig(temperature=1.0))
