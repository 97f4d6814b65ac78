"""Statistics of sweep reports (scipy.stats): effects with confidence intervals, tests, power, variance ratios.

Every effect is measured on the log of the metric (val ppl, bpb or loss are positive), per seed:

    d_s = sum(log x_s for x in `plus` groups) - sum(log x_s for x in `minus` groups)

so a simple comparison (plus = [group], minus = [baseline]) gives d_s = log(x_s / b_s), and for val ppl that is the
difference of the validation losses in nats. An interaction (the change at one scale minus the change at another)
is plus = [L-coupled, S-standard], minus = [L-standard, S-coupled]. The effect is reported as
Delta% = 100 (exp(mean d) - 1), the change of the geometric mean, with its 95% confidence interval transformed the
same way.

- Paired (every group has a run at the seed, the design of `lightning_cqk sweep`): a one-sample t-test of the
  per-seed d_s (`scipy.stats.ttest_1samp`, identical to `ttest_rel` for two groups).
- Unpaired (a plain two-group comparison whose seeds do not match): Welch's t-test (`ttest_ind(equal_var=False)`).
  Contrasts of more than two groups need pairing.
- Holm-Bonferroni (step-down) adjusts the p-values of the comparisons of one study (scipy has no Holm: 8 lines);
  `claims_holm` counts claims, not tests, at each step, since a claim's two nulls exclude each other (Shaffer).
- Minimum detectable effect: the smallest |Delta%| that a two-sided test at alpha 0.05 detects with 80% power, given
  the observed standard deviation and the number of seeds (noncentral t, `scipy.stats.nct`, solved with brentq;
  where nct is NaN, for one or two df far in its tail, the same power integrated over the chi-square).
- Seed variance: the ratio var(a) / var(b) of the metric over seeds. Paired seeds are not independent samples, so the
  test is Pitman-Morgan's (r = corr(a + b, a - b), t with n - 2 df; `scipy.stats.pearsonr`), with Pitman's
  confidence interval of the ratio; unpaired groups get the F-test and its interval (`scipy.stats.f`).

A non-finite value (NaN or inf: a diverged seed) is never used in a mean or a test: it is counted as diverged, and
the statistics use the seeds that are finite in every group of the comparison.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import integrate, optimize, stats

ALPHA = 0.05
POWER = 0.80


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean of the finite values (nan for none)."""
    xs = [x for x in xs if math.isfinite(x)]
    return float(np.mean(xs)) if xs else math.nan


def std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1) of the finite values; nan for fewer than two."""
    xs = [x for x in xs if math.isfinite(x)]
    return float(np.std(xs, ddof=1)) if len(xs) >= 2 else math.nan


def n_diverged(xs: Sequence[float]) -> int:
    """How many values are NaN or inf."""
    return sum(1 for x in xs if not math.isfinite(x))


def pct(log_ratio: float) -> float:
    """A change on the log scale as a percentage: 100 (exp(d) - 1)."""
    return 100.0 * math.expm1(log_ratio) if math.isfinite(log_ratio) else math.nan


@dataclasses.dataclass
class Effect:
    """One comparison (a contrast of groups on the log metric)."""

    test: str  # "paired t" | "Welch t" | "" (no test possible)
    n: int  # seeds used (pairs when paired; the smaller group when Welch)
    diverged: int  # seeds left out because a value was NaN/inf (in any group of the contrast)
    delta_pct: float
    ci_low_pct: float
    ci_high_pct: float
    t: float
    df: float
    p: float
    mde_pct: float  # minimum detectable |Delta%| at 80% power, alpha 0.05 (two-sided)
    sd_log: float  # standard deviation of the per-seed d (paired) or pooled-by-Welch standard error x sqrt(n)
    why: str = ""  # why a number is nan
    d_log: tuple[float, ...] = ()  # the per-seed log differences of a paired contrast (empty for Welch)
    p_signflip: float = math.nan  # exact two-sided sign-flip p of a paired contrast of fewer than SIGNFLIP_BELOW seeds


SIGNFLIP_BELOW = 10  # below this many pairs the t-test's p leans on normality: the exact sign-flip p is given beside it


def signflip_p(d: Sequence[float]) -> float:
    """Exact two-sided sign-flip (paired permutation) p of the mean of `d` against 0, over all 2^n sign patterns
    (scipy.stats.permutation_test); nan from SIGNFLIP_BELOW pairs on. Its smallest value is 2 / 2^n (0.0625 at 5)."""
    if not 2 <= len(d) < SIGNFLIP_BELOW:
        return math.nan
    res = stats.permutation_test(
        (np.asarray(d, dtype=float),),
        np.mean,
        permutation_type="samples",
        n_resamples=np.inf,
        alternative="two-sided",
    )
    return float(res.pvalue)


def _nan_effect(test: str, n: int, diverged: int, why: str) -> Effect:
    nan = math.nan
    return Effect(test, n, diverged, nan, nan, nan, nan, nan, nan, nan, nan, why)


def mde_log(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true effect delta (log units) that a two-sided t-test with standard error `se` and `df` degrees of
    freedom rejects with probability `power`: P(|T'| > t_crit) = power, T' ~ noncentral t(df, delta / se)."""
    if not (se > 0 and df > 0 and math.isfinite(se) and math.isfinite(df)):
        return math.nan
    crit = stats.t.ppf(1 - alpha / 2, df)

    def power_at(ncp: float) -> float:
        p = stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp)
        if math.isfinite(p):
            return float(p)

        # nct is NaN for few df far in the tail: T' = (Z + ncp) / sqrt(V / df), V ~ chi2(df), integrated over V
        def at(v: float) -> float:
            c = crit * math.sqrt(v / df)
            return (stats.norm.sf(c - ncp) + stats.norm.cdf(-c - ncp)) * stats.chi2.pdf(v, df)

        return float(integrate.quad(at, 0.0, math.inf, limit=200)[0])

    hi = 1.0
    while power_at(hi) < power:  # bracket the root (nct is NaN far out in the tail, so never start wide)
        hi *= 2.0
        if hi > 1e4:
            return math.nan
    ncp = optimize.brentq(lambda c: power_at(c) - power, 0.0, hi, xtol=1e-10)
    return ncp * se


def contrast(
    values: Mapping[str, Mapping[int, float]], plus: Sequence[str], minus: Sequence[str], alpha: float = ALPHA
) -> Effect:
    """Effect of `plus` minus `minus` groups on the log metric; values: group -> {seed: metric}.

    Paired over the seeds every group has; Welch when plus and minus are one group each and share fewer than two
    finite seeds while each has at least two.
    """
    groups = list(plus) + list(minus)
    for g in groups:
        if g not in values:
            return _nan_effect("", 0, 0, f"group {g!r} has no runs")
    common = set.intersection(*(set(values[g]) for g in groups))
    finite = sorted(s for s in common if all(_positive_finite(values[g][s]) for g in groups))
    diverged = (
        len(common)
        - len(finite)
        + sum(n_diverged([v for s, v in values[g].items() if s not in common]) for g in groups)
    )
    if len(finite) >= 2:
        d = np.array(
            [sum(math.log(values[g][s]) for g in plus) - sum(math.log(values[g][s]) for g in minus) for s in finite]
        )  # (n,)
        n = len(d)
        sd = float(np.std(d, ddof=1))
        md = float(np.mean(d))
        se = sd / math.sqrt(n)
        if se == 0.0:
            return Effect(
                "paired t",
                n,
                diverged,
                pct(md),
                pct(md),
                pct(md),
                math.nan,
                n - 1,
                math.nan,
                math.nan,
                0.0,
                "zero variance of the per-seed differences: no test",
                tuple(float(x) for x in d),
                signflip_p(d),
            )
        res = stats.ttest_1samp(d, 0.0)
        half = stats.t.ppf(1 - alpha / 2, n - 1) * se
        mde = mde_log(se, n - 1, alpha)
        return Effect(
            "paired t",
            n,
            diverged,
            pct(md),
            pct(md - half),
            pct(md + half),
            float(res.statistic),
            float(n - 1),
            float(res.pvalue),
            pct(mde),
            sd,
            "",
            tuple(float(x) for x in d),
            signflip_p(d),
        )
    if len(plus) == 1 and len(minus) == 1:
        a = [math.log(v) for v in values[plus[0]].values() if _positive_finite(v)]
        b = [math.log(v) for v in values[minus[0]].values() if _positive_finite(v)]
        div = n_diverged(list(values[plus[0]].values())) + n_diverged(list(values[minus[0]].values()))
        if len(a) < 2 or len(b) < 2:
            return _nan_effect("Welch t", min(len(a), len(b)), div, "fewer than two finite seeds on a side")
        va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
        md = float(np.mean(a) - np.mean(b))
        if va + vb == 0.0:
            return _nan_effect("Welch t", min(len(a), len(b)), div, "zero variance on both sides: no test")
        res = stats.ttest_ind(a, b, equal_var=False)
        se = math.sqrt(va + vb)
        df = float((va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)))
        half = stats.t.ppf(1 - alpha / 2, df) * se
        return Effect(
            "Welch t",
            min(len(a), len(b)),
            div,
            pct(md),
            pct(md - half),
            pct(md + half),
            float(res.statistic),
            df,
            float(res.pvalue),
            pct(mde_log(se, df, alpha)),
            se * math.sqrt(min(len(a), len(b))),
        )
    return _nan_effect("paired t", len(finite), diverged, "fewer than two seeds finite in every group of the contrast")


def _positive_finite(x: float) -> bool:
    return math.isfinite(x) and x > 0


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values (nan entries stay nan and do not count in the family)."""
    idx = [i for i, p in enumerate(pvalues) if math.isfinite(p)]
    m = len(idx)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def claims_holm(pvalues: Sequence[float], claims: Sequence[object]) -> list[float]:
    """Holm's step-down over a family of claims whose tests exclude each other (Shaffer 1986, his method S1).

    Every claim puts one or two tests in the family, and a claim's two nulls cannot both be true (change = 0 and
    change = E with E != 0; the TOST's |change| >= m and change = 0; variance ratio 1 and R != 1). So after the tests
    ranked before a step are rejected, at most one true null is left per claim that still has an unrejected test:
    the step's multiplier is that number of claims, never the number of tests. `claims[i]` names the claim of test
    i; nan p-values stay nan and count in no step. With one test per claim this is `holm`. The familywise error stays
    at alpha, since Shaffer's multiplier at each step is the largest number of nulls that can be true together.
    """
    if len(pvalues) != len(claims):
        raise ValueError(f"{len(pvalues)} p-values but {len(claims)} claim names")
    order = sorted((i for i, p in enumerate(pvalues) if math.isfinite(p)), key=lambda i: pvalues[i])
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        open_claims = len({claims[j] for j in order[rank:]})
        running = max(running, min(1.0, open_claims * pvalues[i]))
        adjusted[i] = running
    return adjusted


def one_sided_p(effect: Effect, higher: bool) -> float:
    """One-sided p of a contrast in the expected direction (higher: change > 0), from its two-sided t-test."""
    if not math.isfinite(effect.p) or not math.isfinite(effect.delta_pct):
        return math.nan
    right = effect.delta_pct > 0 if higher else effect.delta_pct < 0
    return effect.p / 2.0 if right else 1.0 - effect.p / 2.0


@dataclasses.dataclass
class VarianceRatio:
    """var(a) / var(b) over seeds with a two-sided test and a 95% confidence interval."""

    test: str  # "Pitman-Morgan" (paired) | "F" (independent) | ""
    n_a: int
    n_b: int
    ratio: float
    ci_low: float
    ci_high: float
    p: float
    why: str = ""


def variance_ratio(a: Mapping[int, float], b: Mapping[int, float], alpha: float = ALPHA) -> VarianceRatio:
    """Seed-variance ratio of group a over group b (values seed -> metric; non-finite seeds left out).

    Paired (>= 3 common finite seeds): Pitman-Morgan test, r = corr(a + b, a - b) ~ t(n - 2); interval (Pitman
    1939): F (K -+ sqrt(K^2 - 1)) with K = 1 + 2 (1 - rho^2) t_crit^2 / (n - 2), rho = corr(a, b), F = s_a^2 / s_b^2.
    Otherwise the F-test with interval [F / F_(1-alpha/2), F / F_(alpha/2)] (df n_a - 1, n_b - 1).
    """
    common = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    if len(common) >= 3:
        x = np.array([a[s] for s in common])  # (n,)
        y = np.array([b[s] for s in common])  # (n,)
        n = len(common)
        vx, vy = float(np.var(x, ddof=1)), float(np.var(y, ddof=1))
        if vx == 0.0 or vy == 0.0:
            return VarianceRatio(
                "Pitman-Morgan", n, n, _ratio(vx, vy), math.nan, math.nan, math.nan, "a group has zero variance"
            )
        ratio = vx / vy
        p = _pm_p(x, y)
        rho = float(np.corrcoef(x, y)[0, 1])
        tc = stats.t.ppf(1 - alpha / 2, n - 2)
        k = 1.0 + 2.0 * (1.0 - rho**2) * tc**2 / (n - 2)
        root = math.sqrt(max(k * k - 1.0, 0.0))
        return VarianceRatio("Pitman-Morgan", n, n, ratio, ratio * (k - root), ratio * (k + root), p)
    xa = [v for v in a.values() if math.isfinite(v)]
    xb = [v for v in b.values() if math.isfinite(v)]
    if len(xa) < 2 or len(xb) < 2:
        return VarianceRatio("F", len(xa), len(xb), math.nan, math.nan, math.nan, math.nan, "fewer than two seeds")
    va, vb = float(np.var(xa, ddof=1)), float(np.var(xb, ddof=1))
    if va == 0.0 or vb == 0.0:
        return VarianceRatio("F", len(xa), len(xb), _ratio(va, vb), math.nan, math.nan, math.nan, "zero variance")
    ratio, d1, d2 = va / vb, len(xa) - 1, len(xb) - 1
    p = float(2 * min(stats.f.cdf(ratio, d1, d2), stats.f.sf(ratio, d1, d2)))
    lo = ratio / stats.f.ppf(1 - alpha / 2, d1, d2)
    hi = ratio / stats.f.ppf(alpha / 2, d1, d2)
    return VarianceRatio("F", len(xa), len(xb), ratio, lo, hi, min(p, 1.0))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _pm_p(x: np.ndarray, y: np.ndarray) -> float:
    """Pitman-Morgan two-sided p: r = corr(x + y, x - y), t = r sqrt((n - 2) / (1 - r^2)) ~ t(n - 2)."""
    r = float(np.corrcoef(x + y, x - y)[0, 1])
    n = len(x)
    if abs(r) >= 1.0:
        return 0.0
    t = r * math.sqrt((n - 2) / (1 - r * r))
    return float(2 * stats.t.sf(abs(t), n - 2))


def bootstrap_se_of_mean_loss(
    nll: Sequence[float], tokens: Sequence[float], n_boot: int = 2000, seed: int = 0
) -> float:
    """Bootstrap standard error (over validation windows) of the validation loss sum(nll) / sum(tokens)."""
    nll_a, tok_a = np.asarray(nll, dtype=float), np.asarray(tokens, dtype=float)
    if len(nll_a) < 2 or not np.all(np.isfinite(nll_a)):
        return math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(nll_a), size=(n_boot, len(nll_a)))  # (n_boot, windows)
    losses = nll_a[idx].sum(axis=1) / tok_a[idx].sum(axis=1)  # (n_boot,)
    return float(np.std(losses, ddof=1))


# ------------------------------------------------------------------------ tests against a value, TOST, planning
def t_test_vs(d: Sequence[float], value: float) -> tuple[float, float]:
    """(t, two-sided p) of the one-sample t-test H0: mean(d) = value (log units; nan for fewer than 2 or sd 0)."""
    d_a = np.asarray([x for x in d if math.isfinite(x)], dtype=float)
    if len(d_a) < 2 or not math.isfinite(value):
        return math.nan, math.nan
    se = float(np.std(d_a, ddof=1)) / math.sqrt(len(d_a))
    if se == 0.0:
        return math.nan, math.nan
    t = (float(np.mean(d_a)) - value) / se
    return t, float(2.0 * stats.t.sf(abs(t), len(d_a) - 1))


def tost(d: Sequence[float], low: float, high: float) -> tuple[float, float, float]:
    """Two one-sided t-tests of equivalence (Schuirmann 1987) of mean(d) within (low, high), log units.

    H0: mean <= low or mean >= high. t_low = (mean - low) / se ~ t(n - 1) tested upper-tail, t_high = (mean - high) /
    se tested lower-tail; p = max of the two one-sided p-values (the equivalence is shown when p < alpha, i.e. the
    (1 - 2 alpha) interval lies inside the bounds). Returns (p, p_low, p_high); nan for fewer than 2 or sd 0.
    The same numbers as statsmodels' `ttost_paired(x, y, low, upp)` applied to d = x - y.
    """
    d_a = np.asarray([x for x in d if math.isfinite(x)], dtype=float)
    if len(d_a) < 2 or not low < high:
        return math.nan, math.nan, math.nan
    n = len(d_a)
    se = float(np.std(d_a, ddof=1)) / math.sqrt(n)
    if se == 0.0:
        return math.nan, math.nan, math.nan
    md = float(np.mean(d_a))
    p_low = float(stats.t.sf((md - low) / se, n - 1))
    p_high = float(stats.t.cdf((md - high) / se, n - 1))
    return max(p_low, p_high), p_low, p_high


def interval(d: Sequence[float], level: float) -> tuple[float, float]:
    """Two-sided t interval of mean(d) at confidence `level` (log units); nan for fewer than 2."""
    d_a = np.asarray([x for x in d if math.isfinite(x)], dtype=float)
    if len(d_a) < 2 or not 0.0 < level < 1.0:
        return math.nan, math.nan
    se = float(np.std(d_a, ddof=1)) / math.sqrt(len(d_a))
    half = float(stats.t.ppf(0.5 + level / 2.0, len(d_a) - 1)) * se
    md = float(np.mean(d_a))
    return md - half, md + half


def seeds_needed(sd_log: float, effect_log: float, alpha: float, power: float = POWER, most: int = 200) -> int:
    """Fewest paired seeds n (>= 3) whose detectable effect (`mde_log` at sd / sqrt(n), n - 1 df, `alpha`) is at
    most |effect_log|; 0 when not computable, `most` + 1 when more than `most` would be needed."""
    if not (sd_log > 0 and math.isfinite(sd_log) and math.isfinite(effect_log) and effect_log != 0):
        return 0
    target = abs(effect_log)

    def enough(n: int) -> bool:
        mde = mde_log(sd_log / math.sqrt(n), n - 1, alpha, power)
        return math.isfinite(mde) and mde <= target

    if not enough(most):
        return most + 1
    lo, hi = 2, most  # enough(hi); the detectable effect falls with n, so bisect for the first n that is enough
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return max(hi, 3)
