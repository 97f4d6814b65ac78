"""Verdicts on synthetic sweeps: a planted effect in the paper's direction supports the claim, the opposite effect
contradicts it, pure noise is inconclusive with the right minimum detectable effect, and a control without power
voids every verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lightning_cqk.sweep.stats import mde_log
from lightning_cqk.sweep.verdict import ClaimError, judge, parse_claim

SEEDS = (1, 2, 3, 4, 5)
NOISE = 0.004  # per-seed sd of the log metric (0.4%)


def _sweep(effects: dict[str, float], seed: int = 0, noise: float = NOISE) -> dict[str, dict[int, float]]:
    """group -> {seed: ppl}: a shared per-seed level (paired design) times exp(effect + independent noise)."""
    rng = np.random.default_rng(seed)
    base = {s: 20.0 * math.exp(rng.normal(0, 0.02)) for s in SEEDS}
    return {g: {s: base[s] * math.exp(e + rng.normal(0, noise)) for s in SEEDS} for g, e in effects.items()}


CLAIM = {"name": "helps", "group": "new", "vs": "base", "expect": "lower", "published_pct": -6.6}
CONTROL = {"name": "control-half", "group": "half", "vs": "base", "expect": "higher"}


def test_planted_effect_in_the_papers_direction_supports():
    values = _sweep({"base": 0.0, "new": -0.05, "half": 0.15})
    control, claim = judge(values, [CLAIM], CONTROL)
    assert control.verdict == "supports" and claim.verdict == "supports"
    assert claim.effect.delta_pct == pytest.approx(100 * math.expm1(-0.05), abs=1.0)
    assert claim.effect.ci_low_pct < claim.effect.delta_pct < claim.effect.ci_high_pct < 0


def test_planted_opposite_effect_contradicts():
    values = _sweep({"base": 0.0, "new": 0.05, "half": 0.15})
    assert judge(values, [CLAIM], CONTROL)[1].verdict == "contradicts"


def test_pure_noise_is_inconclusive_with_the_right_mde():
    values = _sweep({"base": 0.0, "new": 0.0, "half": 0.15}, seed=4)
    claim = judge(values, [CLAIM], CONTROL)[1]
    assert claim.verdict == "inconclusive" and "detectable" in claim.why
    d = [math.log(values["new"][s] / values["base"][s]) for s in SEEDS]
    expected = 100 * math.expm1(mde_log(np.std(d, ddof=1) / math.sqrt(len(d)), len(d) - 1))
    assert claim.effect.mde_pct == pytest.approx(expected, rel=1e-9)
    # the noise between two groups of the same pair has sd sqrt(2) x NOISE; the MDE is ~3.8 standard errors at df 4
    assert 0.3 < claim.effect.mde_pct < 2.5


def test_holm_decides_and_a_control_without_power_voids_everything():
    values = _sweep({"base": 0.0, "new": -0.05, "half": 0.0})  # the control shows nothing
    control, claim = judge(values, [CLAIM], CONTROL)
    assert control.verdict == "inconclusive" and claim.verdict == "void" and "supports" in claim.why
    m = sorted([control.effect.p, claim.effect.p])  # Holm over the family of two: 2 x smallest, then max(., largest)
    expected = min(1.0, 2 * m[0]) if claim.effect.p == m[0] else max(min(1.0, 2 * m[0]), m[1])
    assert claim.p_holm == pytest.approx(expected, rel=1e-12)


def test_same_claims_need_the_interval_inside_the_margin():
    same = {"name": "steps", "group": "new", "vs": "base", "expect": "same", "margin_pct": 1.0}
    tight = judge(_sweep({"base": 0.0, "new": 0.001, "half": 0.15}, noise=0.001), [same], CONTROL)[1]
    assert tight.verdict == "supports"
    far = judge(_sweep({"base": 0.0, "new": 0.05, "half": 0.15}), [same], CONTROL)[1]
    assert far.verdict == "contradicts"
    wide = judge(_sweep({"base": 0.0, "new": 0.0, "half": 0.15}, noise=0.02), [same], CONTROL)[1]
    assert wide.verdict == "inconclusive"


def test_seed_variance_claim_uses_the_variance_test():
    rng = np.random.default_rng(5)
    seeds = range(1, 21)
    values = {
        "coupled": {s: 20.0 + 0.05 * rng.normal() for s in seeds},
        "uncoupled": {s: 20.0 + 0.5 * rng.normal() for s in seeds},
    }
    claim = {"name": "var", "group": "uncoupled", "vs": "coupled", "expect": "more_variance", "published_ratio": 8}
    j = judge(values, [claim])[0]
    assert j.verdict == "supports" and j.variance.test == "Pitman-Morgan" and j.variance.ci_low > 1
    flipped = judge({"coupled": values["uncoupled"], "uncoupled": values["coupled"]}, [claim])[0]
    assert flipped.verdict == "contradicts"


def test_nan_and_inf_seeds_never_crash_a_verdict():
    values = _sweep({"base": 0.0, "new": -0.05, "half": 0.15})
    values["new"][1], values["new"][2] = float("nan"), float("inf")
    control, claim = judge(values, [CLAIM], CONTROL)
    assert claim.effect.diverged == 2 and claim.effect.n == 3 and claim.verdict == "supports"
    values["new"] = {s: float("nan") for s in SEEDS}
    claim = judge(values, [CLAIM], CONTROL)[1]
    assert claim.verdict == "inconclusive" and claim.effect.diverged == 5


@pytest.mark.parametrize(
    "claim, message",
    [
        ({"name": "x", "group": "a", "vs": "b", "expect": "better"}, "expect 'better'"),
        ({"name": "x", "group": "a", "expect": "lower"}, "group \\+ vs"),
        ({"name": "x", "plus": ["a"], "expect": "lower"}, "non-empty plus and minus"),
        ({"name": "x", "group": "a", "vs": "b", "expect": "same"}, "margin_pct"),
        ({"name": "x", "plus": ["a", "b"], "minus": ["c"], "expect": "more_variance"}, "one group with one"),
    ],
)
def test_malformed_claims_are_refused(claim, message):
    with pytest.raises(ClaimError, match=message):
        parse_claim(claim)


def test_scipy_is_the_reference():
    values = _sweep({"base": 0.0, "new": -0.01, "half": 0.15})
    j = judge(values, [CLAIM])[0]
    ref = stats.ttest_rel(np.log(list(values["new"].values())), np.log(list(values["base"].values())))
    assert j.effect.p == pytest.approx(ref.pvalue, rel=1e-12) and j.p_holm == pytest.approx(ref.pvalue, rel=1e-12)
