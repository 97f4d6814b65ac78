"""Student-t p-values and Welch's test (lightning_cqk.sweep.stats) against closed forms, tables and integration."""

from __future__ import annotations

import math

import pytest

from lightning_cqk.sweep.stats import betainc, mean, std, t_two_sided_p, welch_t_test


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 12.706, 100.0])
def test_df1_is_cauchy(t: float):
    assert t_two_sided_p(t, 1.0) == pytest.approx(1.0 - 2.0 / math.pi * math.atan(abs(t)), rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.7, 4.303, 30.0])
def test_df2_closed_form(t: float):
    assert t_two_sided_p(t, 2.0) == pytest.approx(1.0 - abs(t) / math.sqrt(2.0 + t * t), rel=1e-10, abs=1e-14)


@pytest.mark.parametrize(
    "t, df, p",
    [  # two-sided critical values of Student's t tables
        (12.706, 1, 0.05),
        (2.776, 4, 0.05),
        (4.604, 4, 0.01),
        (2.228, 10, 0.05),
        (3.169, 10, 0.01),
        (2.042, 30, 0.05),
        (1.960, 1e6, 0.05),
    ],
)
def test_tabulated_critical_values(t: float, df: float, p: float):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4)


def _t_tail_by_simpson(t: float, df: float, n: int = 20000) -> float:
    """2 * integral_|t|^inf of the t density, by Simpson's rule after u = 1 / (1 + x) (an independent oracle)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def f(u: float) -> float:  # x = 1/u - 1 + |t|, dx = du / u^2
        if u == 0.0:
            return 0.0
        x = 1.0 / u - 1.0 + abs(t)
        return c * (1 + x * x / df) ** (-(df + 1) / 2) / (u * u)

    h = 1.0 / n
    total = f(0.0) + f(1.0) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return 2 * total * h / 3


@pytest.mark.parametrize("t, df", [(1.549, 2.94), (0.8, 5.5), (2.3, 3.3), (3.0, 7.25)])
def test_fractional_df_matches_integration(t: float, df: float):
    assert t_two_sided_p(t, df) == pytest.approx(_t_tail_by_simpson(t, df), rel=1e-6)


def test_betainc_symmetry_and_edges():
    assert betainc(2.5, 0.5, 0.0) == 0.0 and betainc(2.5, 0.5, 1.0) == 1.0
    assert betainc(3.0, 2.0, 0.3) == pytest.approx(1.0 - betainc(2.0, 3.0, 0.7), rel=1e-12)
    assert betainc(1.0, 1.0, 0.37) == pytest.approx(0.37, rel=1e-12)  # uniform
    with pytest.raises(ValueError, match="0 <= x <= 1"):
        betainc(1.0, 1.0, 1.5)


def test_welch_by_hand():
    # a: mean 2, var 1; b: mean 4, var 4 -> se^2 = 1/3 + 4/3, t = -2 / sqrt(5/3), df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2)
    t, df, p = welch_t_test([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert t == pytest.approx(-2.0 / math.sqrt(5.0 / 3.0), rel=1e-12)
    assert df == pytest.approx(50.0 / 17.0, rel=1e-12)
    assert p == pytest.approx(_t_tail_by_simpson(t, df), rel=1e-6)
    assert 0.2 < p < 0.25


def test_welch_undefined_cases_are_nan():
    assert all(math.isnan(x) for x in welch_t_test([1.0], [2.0, 3.0]))
    assert all(math.isnan(x) for x in welch_t_test([1.0, 1.0], [2.0, 2.0]))  # zero variance on both sides


def test_mean_std():
    assert mean([1.0, 2.0, 6.0]) == 3.0
    assert std([1.0, 2.0, 6.0]) == pytest.approx(math.sqrt(7.0))  # sample std: (4 + 1 + 9) / 2
    assert math.isnan(std([1.0])) and math.isnan(mean([]))
