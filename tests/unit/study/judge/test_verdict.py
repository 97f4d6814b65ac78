"""Verdicts on planted synthetic sweeps: each label (replicated, size differs, not replicated at this scale,
opposite direction, inconclusive, equivalent) appears exactly where the planted effect and its interval put it; the
detectable effect is at the Holm level of a family that counts claims; TOST matches the textbook; a control too
small to be detected marks the null-type verdicts and keeps the significant ones; a report short of its planned seeds
gives no verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from lightning_cqk.study.design.units import convert_pct
from lightning_cqk.study.judge.stats import claims_holm, holm, mde_log, tost
from lightning_cqk.study.judge.verdict import ClaimError, judge, parse_claim

SEEDS = tuple(range(1, 9))
PUBLISHED = {"value": -6.6, "unit": "token_ppl", "tokenizer": "gpt2", "corpus": "wikitext", "baseline": 24.22}
E_LOG = math.log1p(convert_pct(-6.6, "token_ppl", "gpt2", "wikitext")[0] / 100)  # the paper's effect, our unit
CLAIM = {"name": "helps", "group": "new", "vs": "base", "expect": "lower", "published": PUBLISHED}
CONTROL = {"name": "control-fewer", "group": "fewer", "vs": "base", "expect": "higher", "expected_pct": 3.5}
_Z = np.random.default_rng(7).normal(size=len(SEEDS))
Z = (_Z - _Z.mean()) / _Z.std(ddof=1)  # fixed residuals: mean exactly 0, sd exactly 1


def _sweep(effects: dict[str, float], sd: float = 0.004) -> dict[str, dict[int, float]]:
    """group -> {seed: ppl}: a shared per-seed level (paired design) times exp(planted effect + sd x fixed residual);
    the mean log difference of a group from `base` is exactly its planted effect."""
    rng = np.random.default_rng(0)
    base = {s: 7.0 * math.exp(rng.normal(0, 0.02)) for s in SEEDS}
    z = {g: np.roll(Z, i) for i, g in enumerate(effects)}
    return {
        g: {s: base[s] * math.exp(e + (0.0 if g == "base" else sd * z[g][i])) for i, s in enumerate(SEEDS)}
        for g, e in effects.items()
    }


def _claim(effect: float, sd: float = 0.004, control: float = 0.035):
    values = _sweep({"base": 0.0, "new": effect, "fewer": control}, sd)
    control_j, claim = judge(values, [CLAIM], CONTROL)
    assert control_j.verdict == "detected"
    return claim


def test_the_converted_paper_effect_is_replicated():
    j = _claim(E_LOG)
    assert j.verdict == "replicated"
    assert j.converted_pct == pytest.approx(100 * math.expm1(math.log(0.934) / 4.5454), rel=1e-12)
    assert j.v_low_pct < j.converted_pct < j.v_high_pct < 0


def test_a_quarter_of_it_is_direction_replicated_smaller():
    assert _claim(E_LOG / 4).verdict == "direction replicated, size differs (smaller)"
    assert _claim(E_LOG * 3).verdict == "direction replicated, size differs (larger)"


def test_zero_with_a_tight_interval_is_not_replicated_and_says_what_is_excluded():
    j = _claim(0.0, sd=0.001)
    assert j.verdict == "not replicated at this scale"
    # X: the interval bound on E's side at the level the test against E used; between 0 and E
    assert j.converted_pct < j.excluded_pct < 0 and f"effects beyond {j.excluded_pct:+.2f}% excluded" in j.why


def test_the_opposite_sign_is_opposite_direction():
    assert _claim(-E_LOG).verdict == "opposite direction"


def test_a_wide_interval_is_inconclusive():
    j = _claim(E_LOG / 2, sd=0.03)
    assert j.verdict == "inconclusive" and j.v_low_pct < j.converted_pct and j.v_high_pct > 0
    assert "holds 0 and E" in j.why


def test_the_other_rule_is_shown_when_it_changes_the_verdict():
    j = _claim(E_LOG)  # replicated under nats per byte; relative loss asks for about -4% at a 7-PPL baseline
    expected = 100 * math.expm1(math.log(0.934) / math.log(24.22) * math.log(7.0))
    assert j.alt_pct == pytest.approx(expected, rel=0.05)
    assert j.alt_verdict.startswith("direction replicated, size differs (smaller)")


def test_the_detectable_effect_is_at_the_holm_level():
    values = _sweep({"base": 0.0, "new": 0.0, "fewer": 0.035}, sd=0.004)
    other = {**CLAIM, "name": "also", "group": "fewer"}
    control, claim, _ = judge(values, [CLAIM, other], CONTROL)
    # two claims (each with a test vs 0 and vs E: one family member each), the control outside the family
    assert claim.family == 2 and claim.level == pytest.approx(0.05 / 2)
    d = [math.log(values["new"][s] / values["base"][s]) for s in SEEDS]
    se = np.std(d, ddof=1) / math.sqrt(len(d))
    at_level = 100 * math.expm1(-mde_log(se, len(d) - 1, 0.05 / 2))  # a decrease: the claim is `lower`
    assert claim.mde_pct == pytest.approx(at_level, rel=1e-9) and claim.mde_pct < 0  # signed like its claim
    assert -claim.mde_pct > -100 * math.expm1(-mde_log(se, len(d) - 1, 0.05)) * 1.1  # stricter than unadjusted
    # seeds for E: the smallest n whose detectable effect at the level is at most |E| (same sd)
    n = claim.seeds_needed
    sd = np.std(d, ddof=1)
    assert mde_log(sd / math.sqrt(n), n - 1, 0.05 / 2) <= abs(E_LOG) < mde_log(sd / math.sqrt(n - 1), n - 2, 0.05 / 2)


def test_the_family_counts_claims_not_tests_against_a_hand_computation():
    """Shaffer's step-down on fixed p-values: claims a (vs 0, vs E), b (vs 0, vs E), c (one test). Sorted: a0 .001,
    b0 .004, aE .012, c .02, bE .3. Open claims at each step: 3, 3 (a still open by aE), 3, 2 (b, c), 1 (b)."""
    p = [0.001, 0.012, 0.004, 0.3, 0.02]
    claims = ["a", "a", "b", "b", "c"]
    by_hand = [3 * 0.001, max(3 * 0.004, 3 * 0.012), 3 * 0.004, max(0.036, 1 * 0.3), max(0.036, 2 * 0.02)]
    assert claims_holm(p, claims) == pytest.approx(by_hand, abs=1e-15)
    assert claims_holm(p, ["a", "b", "c", "d", "e"]) == holm(p)  # one test a claim: Holm itself
    assert holm(p)[2] == pytest.approx(4 * 0.004) and claims_holm(p, claims)[2] == pytest.approx(3 * 0.004)
    nan = claims_holm([0.01, math.nan], ["a", "b"])
    assert nan[0] == pytest.approx(0.01) and math.isnan(nan[1])


def test_a_control_not_detected_marks_the_null_verdicts_and_keeps_a_significant_one():
    values = _sweep({"base": 0.0, "new": E_LOG, "null": 0.0, "fewer": 0.0005}, sd=0.004)
    null = {**CLAIM, "name": "no-effect", "group": "null"}
    control, claim, nothing = judge(values, [CLAIM, null], CONTROL)
    assert control.verdict == "not detected" and "one-sided p" in control.why
    assert claim.verdict == "replicated" and not claim.gated  # significant and directional: stands
    assert nothing.verdict.endswith("; sensitivity not shown") and nothing.gated
    assert nothing.verdict.startswith(("inconclusive", "not replicated at this scale"))
    detected = judge(_sweep({"base": 0.0, "null": 0.0, "fewer": 0.035}), [null], CONTROL)
    assert detected[0].verdict == "detected" and "sensitivity" not in detected[1].verdict
    assert detected[1].family == 1  # the control is not in the family


def test_a_control_significantly_reversed_marks_every_verdict_against_its_baseline():
    """The coupling rerun: the baseline at 0.3 x its tuned rate did 10% *better* than at the tuned rate, so the
    baseline was off its optimum; a significant coupled-vs-standard difference then says little about coupling. The
    verdicts against that baseline are marked; a claim between two other groups is not."""
    values = _sweep({"base": 0.0, "new": E_LOG, "other": E_LOG, "fewer": -0.02}, sd=0.004)
    between = {**CLAIM, "name": "between", "group": "new", "vs": "other", "expect": "lower"}
    control, claim, other = judge(values, [CLAIM, between], CONTROL)
    assert control.verdict == "not detected; reversed: the baseline did better off its tuned setting"
    assert claim.verdict == "replicated; baseline off its optimum"
    assert "baseline off its optimum" not in other.verdict and other.gated
    slight = judge(_sweep({"base": 0.0, "new": E_LOG, "fewer": -0.0005}, sd=0.004), [CLAIM], CONTROL)
    assert slight[0].verdict == "not detected" and slight[1].verdict == "replicated", "not significant: no mark"


def test_the_control_is_tested_one_sided_at_alpha():
    """A control whose two-sided p is between 0.05 and 0.10 in the expected direction is detected (one-sided p =
    half); the same size in the other direction is not."""
    values = _sweep({"base": 0.0, "fewer": 0.0, "new": 0.0}, sd=0.004)
    d = [math.log(values["fewer"][s] / values["base"][s]) for s in SEEDS]
    se = float(np.std(d, ddof=1)) / math.sqrt(len(d))
    shift = stats.t.ppf(1 - 0.07 / 2, len(d) - 1) * se  # two-sided p 0.07
    up = _sweep({"base": 0.0, "fewer": shift, "new": 0.0}, sd=0.004)
    control = judge(up, [CLAIM], CONTROL)[0]
    assert control.p_holm == pytest.approx(0.035, rel=1e-6) and control.verdict == "detected"
    down = _sweep({"base": 0.0, "fewer": -shift, "new": 0.0}, sd=0.004)
    assert judge(down, [CLAIM], CONTROL)[0].verdict == "not detected"


def test_a_report_short_of_its_planned_seeds_is_interim_and_gives_no_verdict():
    values = _sweep({"base": 0.0, "new": E_LOG, "fewer": 0.035})
    complete = judge(values, [CLAIM], CONTROL, planned={"base": 8, "new": 8, "fewer": 8})
    assert complete[1].verdict == "replicated" and complete[1].seeds_done == complete[1].seeds_planned == 8
    short = judge(values, [CLAIM], CONTROL, planned={"base": 26, "new": 26, "fewer": 8})
    control, claim = short
    assert claim.verdict == "interim, 8 of 26 seeds" and "optional stopping" in claim.why
    assert control.verdict == "interim, 8 of 8 seeds"  # complete itself, but the study's report is interim
    assert claim.alt_verdict == ""


def test_an_interval_holding_both_0_and_e_is_inconclusive_whatever_the_step_down_found():
    """Holm's later steps use a smaller multiplier than alpha / k, so a claim can be significant while the interval
    printed at 1 - alpha / k holds 0 (and E): such a claim is inconclusive."""
    near = {"name": "near", "group": "new", "vs": "base", "expect": "higher", "sesoi_pct": 0.63}
    strong = {**near, "name": "strong", "group": "big", "sesoi_pct": 10.0}  # both its tests rejected first
    shift = stats.t.ppf(1 - 0.035 / 2, len(SEEDS) - 1) * 0.006 / math.sqrt(len(SEEDS))  # two-sided p 0.035
    values = _sweep({"base": 0.0, "new": shift, "big": 0.262, "fewer": 0.035}, sd=0.006)
    _, claim, big = judge(values, [near, strong], CONTROL)
    assert big.verdict == "direction replicated, size differs (larger)"
    assert claim.p_holm == pytest.approx(0.035, rel=1e-6)  # significant at the last step (multiplier 1) ...
    assert claim.v_low_pct <= 0 <= claim.v_high_pct and claim.v_low_pct <= 0.63 <= claim.v_high_pct
    assert claim.verdict == "inconclusive" and "holds both 0 and E" in claim.why


def _t_cdf(x: float, df: int) -> float:
    """Student t CDF by integrating its density (textbook closed form), independent of scipy.stats.t."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    pdf = lambda t: c * (1 + t * t / df) ** (-(df + 1) / 2)  # noqa: E731
    return 0.5 + math.copysign(integrate.quad(pdf, 0.0, abs(x))[0], x)


def test_tost_on_fixed_inputs_equals_the_textbook():
    d = [0.0020, -0.0010, 0.0040, 0.0005, 0.0015, 0.0030]
    low, high = math.log(0.99), math.log(1.01)
    p, p_low, p_high = tost(d, low, high)
    n, m, s = len(d), float(np.mean(d)), float(np.std(d, ddof=1))
    t1, t2 = (m - low) / (s / math.sqrt(n)), (m - high) / (s / math.sqrt(n))
    assert p_low == pytest.approx(1 - _t_cdf(t1, n - 1), abs=1e-10)
    assert p_high == pytest.approx(_t_cdf(t2, n - 1), abs=1e-10)
    assert p == max(p_low, p_high) and p < 0.05
    # duality: with the upper bound at the 90% interval's upper end, the TOST p is exactly 0.05
    upper = m + stats.t.ppf(0.95, n - 1) * s / math.sqrt(n)
    assert tost(d, low, upper)[0] == pytest.approx(0.05, abs=1e-12)


def test_same_claims_use_tost_against_the_margin():
    same = {"name": "steps", "group": "new", "vs": "base", "expect": "same", "margin_pct": 1.0}
    tight = judge(_sweep({"base": 0.0, "new": 0.001, "fewer": 0.035}, sd=0.001), [same], CONTROL)[1]
    assert tight.verdict == "equivalent within ±1%"
    far = judge(_sweep({"base": 0.0, "new": 0.05, "fewer": 0.035}), [same], CONTROL)[1]
    assert far.verdict == "not equivalent"
    wide = judge(_sweep({"base": 0.0, "new": 0.0, "fewer": 0.035}, sd=0.03), [same], CONTROL)[1]
    assert wide.verdict == "inconclusive"


def test_margin_claims_below_and_above():
    little = {"name": "little", "group": "new", "vs": "base", "expect": "below", "margin_pct": 5.0}
    assert judge(_sweep({"base": 0.0, "new": 0.01, "fewer": 0.035}), [little], CONTROL)[1].verdict == "replicated"
    j = judge(_sweep({"base": 0.0, "new": 0.10, "fewer": 0.035}), [little], CONTROL)[1]
    assert j.verdict == "not replicated at this scale"
    collapse = {"name": "collapse", "group": "new", "vs": "base", "expect": "above", "margin_pct": 100.0}
    j = judge(_sweep({"base": 0.0, "new": 0.3, "fewer": 0.035}), [collapse], CONTROL)[1]
    assert j.verdict == "not replicated at this scale"  # +35% is no collapse


def test_configuration_limited_is_marked_beside_the_verdict():
    values = _sweep({"base": 0.0, "new": -E_LOG, "fewer": 0.035})
    limited = dict(CLAIM, limited="2 differential heads (the paper asks for 8)")
    j = judge(values, [limited], CONTROL, untuned={"new": "no tuning grid"})[1]
    assert j.verdict == "opposite direction" and "2 differential heads" in j.limited and "no tuning grid" in j.limited


def test_seed_variance_claim_uses_the_variance_test():
    rng = np.random.default_rng(5)
    seeds = range(1, 21)
    values = {
        "coupled": {s: 20.0 + 0.05 * rng.normal() for s in seeds},
        "uncoupled": {s: 20.0 + 0.5 * rng.normal() for s in seeds},
    }
    claim = {"name": "var", "group": "uncoupled", "vs": "coupled", "expect": "more_variance", "published_ratio": 8}
    j = judge(values, [claim])[0]
    assert j.verdict.startswith("direction replicated") and j.variance.test == "Pitman-Morgan"
    assert j.variance.ci_low > 1
    flipped = judge({"coupled": values["uncoupled"], "uncoupled": values["coupled"]}, [claim])[0]
    assert flipped.verdict == "opposite direction"


def test_nan_and_inf_seeds_never_crash_a_verdict():
    values = _sweep({"base": 0.0, "new": E_LOG, "fewer": 0.035})
    values["new"][1], values["new"][2] = float("nan"), float("inf")
    claim = judge(values, [CLAIM], CONTROL)[1]
    assert claim.effect.diverged == 2 and claim.effect.n == 6
    values["new"] = {s: float("nan") for s in SEEDS}
    claim = judge(values, [CLAIM], CONTROL)[1]
    assert claim.verdict == "inconclusive" and claim.effect.diverged == 8


@pytest.mark.parametrize(
    "claim, message",
    [
        ({"name": "x", "group": "a", "vs": "b", "expect": "better"}, "expect 'better'"),
        ({"name": "x", "group": "a", "expect": "lower"}, "group \\+ vs"),
        ({"name": "x", "plus": ["a"], "expect": "lower"}, "non-empty plus and minus"),
        ({"name": "x", "group": "a", "vs": "b", "expect": "same"}, "margin_pct"),
        ({"name": "x", "group": "a", "vs": "b", "expect": "below"}, "margin_pct"),
        ({"name": "x", "plus": ["a", "b"], "minus": ["c"], "expect": "more_variance"}, "one group with one"),
        ({"name": "x", "group": "a", "vs": "b", "expect": "lower", "published": {"value": -6.6}}, "unit"),
        (
            {"name": "x", "group": "a", "vs": "b", "expect": "lower", "published": {"value": -1, "unit": "token_ppl"}},
            "tokenizer",
        ),
        (
            {
                "name": "x",
                "group": "a",
                "vs": "b",
                "expect": "lower",
                "published": {"value": -1, "unit": "token_ppl", "tokenizer": "gpt2", "corpus": "slimpajama"},
            },
            "no measured bytes per gpt2 on corpus 'slimpajama'",
        ),
    ],
)
def test_malformed_claims_are_refused(claim, message):
    with pytest.raises(ClaimError, match=message):
        parse_claim(claim)


def test_scipy_is_the_reference():
    values = _sweep({"base": 0.0, "new": -0.01, "fewer": 0.035})
    j = judge(values, [CLAIM])[0]
    ref = stats.ttest_rel(np.log(list(values["new"].values())), np.log(list(values["base"].values())))
    assert j.effect.p == pytest.approx(ref.pvalue, rel=1e-12)
    ref_e = stats.ttest_1samp(np.log(list(values["new"].values())) - np.log(list(values["base"].values())), E_LOG)
    assert j.p_effect == pytest.approx(ref_e.pvalue, rel=1e-10)


def test_the_token_multiplier_is_read_off_the_baselines_own_curve():
    # standard's metric falls as 10 T^-0.3 (T in multiples of B); the coupled run at B equals standard at 1.2 B
    rng = np.random.default_rng(3)
    level = {s: math.exp(rng.normal(0, 0.02)) for s in SEEDS}
    curve = {"std-B": 1.0, "std-1.5B": 1.5, "std-2.4B": 2.4}
    values = {g: {s: level[s] * 10 * t**-0.3 for s in SEEDS} for g, t in curve.items()}
    k = {s: 1.2 * math.exp(0.01 * Z[i]) for i, s in enumerate(SEEDS)}
    values["coupled-B"] = {s: level[s] * 10 * k[s] ** -0.3 for s in SEEDS}
    claim = {"name": "k", "group": "coupled-B", "vs": "std-B", "expect": "token_multiplier", "curve": curve}
    j = judge(values, [dict(claim, published_ratio=2.4)])[0]
    geo = math.exp(np.mean([math.log(k[s]) for s in SEEDS]))
    assert j.effect.delta_pct == pytest.approx(100 * (geo - 1), rel=1e-9)  # exact: the curve is a power law
    assert j.converted_pct == pytest.approx(140.0) and j.verdict == "direction replicated, size differs (smaller)"
    values["coupled-B"] = {s: level[s] * 10 * 0.9**-0.3 * math.exp(0.003 * Z[i]) for i, s in enumerate(SEEDS)}
    assert judge(values, [dict(claim, published_ratio=2.4)])[0].verdict == "opposite direction"  # k < 1: extrapolated
