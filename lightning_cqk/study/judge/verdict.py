"""Verdicts: each claim of a study (spec `claims:`) judged from the runs, never written by hand.

A claim names a contrast of groups, what the paper expects of it and, where the paper gives one, its number in
the paper's own unit (converted to ours by lightning_cqk/study/design/units.py):

    claims:
      - name: coupled-vs-standard
        text: coupled (leapfrog) lowers val PPL vs standard
        group: coupled-leapfrog          # shorthand for plus: [coupled-leapfrog], minus: [standard]
        vs: standard
        expect: lower                    # lower | higher | same | below | above | more_variance | less_variance
        published: {value: -6.6, unit: token_ppl, tokenizer: gpt2, corpus: wikitext, baseline: 24.22,
                    note: "60M, WikiText-103"}
      - name: gain-shrinks-with-size     # an interaction: (L-coupled / L-standard) / (S-coupled / S-standard)
        plus: [d128-coupled, d64-standard]
        minus: [d128-standard, d64-coupled]
        expect: higher
        sesoi_pct: 1.0                   # no published number: the smallest effect of interest (our unit, %)
      - name: one-step-suffices
        group: steps7
        vs: steps1
        expect: same
        margin_pct: 1.0                  # equivalence margin (our unit): TOST against ±1%
      - name: q-k=v-costs-little         # below / above: "Delta% < margin" / "Delta% > margin", one test against it
        group: Q-K=V
        vs: QKV
        expect: below
        margin_pct: 5.0
      - name: differential-vs-coupled
        ...
        limited: "2 differential heads (the paper's code asks for at least 8)"   # configuration-limited, said why

E is the published effect converted to our unit by the rule `nats_per_byte` (units.py), else the declared
`sesoi_pct` in the expected direction. The family counts claims, not tests: every test a verdict uses (against 0,
against E, the TOST, against a margin) is adjusted together by Holm's step-down with Shaffer's multiplier
(`stats.claims_holm`): a claim's two nulls cannot both be true, so each step multiplies by the number of claims
still open, and k, the family's size, is the number of claims (alpha = 0.05).

- lower / higher, with E:
  `opposite direction`   significant against 0, with the sign opposite to E;
  `replicated`           significant against 0 in E's direction, not significantly different from E;
  `direction replicated, size differs (larger|smaller)`  significant against 0 and against E;
  `not replicated at this scale`  not significant against 0, significantly different from E (on 0's side):
                         "effects beyond X excluded", X the interval bound on E's side at the level that test used;
  `inconclusive`         neither: the interval holds both 0 and E.
  Without E: `direction replicated` / `opposite direction` / `inconclusive` (with the excluded bound).
- same: `equivalent within ±m%` when the TOST rejects non-equivalence; `not equivalent` when the effect differs from
  0 significantly and lies outside the margin; else `inconclusive`.
- below / above: `replicated` when the test against the margin is significant on the claimed side, `not replicated at
  this scale` when on the other side, else `inconclusive`.
- more_variance / less_variance: the seed-variance ratio (stats.variance_ratio) against 1 and against the published
  ratio, labelled like lower / higher.

The detectable effect is computed at alpha / k, the level Holm gives a lone true effect (the level the verdict
uses); `seeds_needed` is the number of paired seeds that detects |E| at 80% power at that level with the observed
paired standard deviation. The interval printed beside the verdict is at 1 - alpha / k; a lower / higher claim whose
printed interval holds both 0 and E is `inconclusive`, whatever the step-down found.
The verdict under the other rule (`relative_loss`) is recomputed on the whole family and shown when it differs.
A claim is configuration-limited when an arm lacks a tuned learning rate of its own (tuning parity, spec `tuning:`)
or it declares `limited:`; the verdict is kept and the limit is printed beside it.
The control (spec `control:`) gates; it is not in the family. It is tested first, alone: a one-sided paired t-test
in its expected direction at alpha = 0.05. When it is not detected, the verdicts that rest on finding no effect
(`inconclusive`, `not replicated at this scale`, `equivalent`) are marked `sensitivity not shown`: the study did not
show it could see an effect of the control's size. Significant directional verdicts stand, unless the control came
out significantly the other way (its two-sided 95% interval beyond 0 on the wrong side: the baseline moved away from
its tuned setting, e.g. at a lower learning rate, does *better*): then the baseline was not at its optimum, and every
verdict of a claim that compares with that baseline is marked `baseline off its optimum` (a difference against a
mistuned baseline says little about the mechanism).
The number of seeds is fixed in the spec before the first run: while any planned run of a claim's groups or of the
control has not finished, the report is interim and every claim reads `interim, n of N seeds`, with no verdict
(adding seeds after a look is optional stopping).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_cqk.study.design.claim import EXPECTS, Claim, ClaimError, as_claim, float_or_nan, parse_claim
from lightning_cqk.study.design.units import PRIMARY_RULE, UnitError, convert_pct
from lightning_cqk.study.judge.stats import (
    ALPHA,
    Effect,
    VarianceRatio,
    claims_holm,
    contrast,
    interval,
    mde_log,
    one_sided_p,
    pct,
    seeds_needed,
    t_test_vs,
    tost,
    variance_ratio,
)

__all__ = ["EXPECTS", "Claim", "ClaimError", "Judgement", "judge", "parse_claim", "planned_effect", "planned_tests"]

REPLICATED = "replicated"
DIRECTION = "direction replicated"
SIZE_DIFFERS = "direction replicated, size differs"
NOT_REPLICATED = "not replicated at this scale"
OPPOSITE = "opposite direction"
INCONCLUSIVE = "inconclusive"
EQUIVALENT = "equivalent"
NOT_EQUIVALENT = "not equivalent"
DETECTED, NOT_DETECTED = "detected", "not detected"
SENSITIVITY_NOT_SHOWN = "sensitivity not shown"
BASELINE_OFF_OPTIMUM = "baseline off its optimum"
INTERIM = "interim"
NULL_VERDICTS = (INCONCLUSIVE, NOT_REPLICATED, EQUIVALENT)  # they rest on finding no effect: the control gates them
ALT_RULE = "relative_loss"


@dataclasses.dataclass
class Judgement:
    name: str
    text: str
    expect: str
    plus: list[str]
    minus: list[str]
    effect: Effect | None
    variance: VarianceRatio | None
    p_holm: float  # Holm p of the test against 0 (or of the claim's one test: TOST, margin)
    verdict: str
    why: str
    published_pct: float  # as published, in its own unit
    published_ratio: float
    published_note: str
    margin_pct: float
    is_control: bool = False
    published_unit: str = ""
    converted_pct: float = math.nan  # E: the published effect in our unit (nats per byte), or the declared sesoi
    converted_rule: str = ""
    alt_pct: float = math.nan  # the published effect under the relative-loss rule
    alt_rule: str = ""
    alt_verdict: str = ""  # the verdict under the relative-loss rule, when it differs
    p_effect: float = math.nan  # two-sided p against E (raw), and Holm-adjusted
    p_holm_effect: float = math.nan
    raw_tests: dict[str, float] = dataclasses.field(default_factory=dict)  # test -> raw p (zero, effect, tost, ...)
    family: int = 0  # k: the number of tests in the study's Holm family
    level: float = math.nan  # alpha / k
    mde_pct: float = math.nan  # detectable Delta% at 80% power at alpha / k, signed like the claim (lower: < 0)
    seeds_needed: int = 0  # paired seeds for |E| at 80% power at alpha / k (observed sd)
    excluded_pct: float = math.nan  # X of "effects beyond X excluded"
    v_low_pct: float = math.nan  # the interval at 1 - alpha / k
    v_high_pct: float = math.nan
    limited: str = ""  # why the verdict is configuration-limited ('' when it is not)
    expected_pct: float = math.nan  # a control's planted size, as predicted before the run
    gated: bool = False  # a null-type verdict marked "sensitivity not shown" (the control was not detected)
    seeds_done: int = 0  # finished seeds common to the claim's groups, and the number the spec plans
    seeds_planned: int = 0
    e_corpus: str = ""  # the corpus whose bytes per unit convert E (the paper's), and the one the runs train on
    train_corpus: str = ""
    train_pct: float = math.nan  # E with the training corpus's bytes per unit, where the two corpora differ
    train_verdict: str = ""  # the verdict under that E, when it differs


def token_multipliers(values: Mapping[str, Mapping[int, float]], group: str, curve: Mapping[str, float]) -> dict:
    """{seed: k}: the multiple of `group`'s tokens at which the baseline, interpolated on its own curve (log metric
    vs log tokens, piecewise linear through `curve`'s groups at their token multiples, the end segments extended),
    reaches `group`'s metric. k > 1: the group is worth k times its tokens of the baseline (nan where not defined)."""
    points = sorted(curve.items(), key=lambda kv: kv[1])
    seeds = set(values.get(group, {}))
    for g, _ in points:
        seeds &= set(values.get(g, {}))
    out = {}
    for s in sorted(seeds):
        xs = [math.log(r) for _, r in points]
        ys = [
            math.log(values[g][s]) if values[g][s] > 0 and math.isfinite(values[g][s]) else math.nan for g, _ in points
        ]
        target = values[group][s]
        if not (target > 0 and math.isfinite(target)) or not all(map(math.isfinite, ys)):
            out[s] = math.nan
            continue
        y = math.log(target)
        # the segment whose metric range holds y (the curve falls with tokens), else the nearest end segment
        i = next((i for i in range(len(xs) - 1) if min(ys[i], ys[i + 1]) <= y <= max(ys[i], ys[i + 1])), None)
        if i is None:
            i = 0 if y > ys[0] else len(xs) - 2
        if ys[i + 1] == ys[i]:
            out[s] = math.nan
            continue
        x = xs[i] + (y - ys[i]) * (xs[i + 1] - xs[i]) / (ys[i + 1] - ys[i])
        out[s] = math.exp(x)
    return out


def _log1p_pct(x: float) -> float:
    return math.log1p(x / 100.0) if math.isfinite(x) and x > -100.0 else math.nan


def _target(c: Claim, rule: str, base_loss: float) -> tuple[float, str]:
    """E in % of our metric under `rule` ((nan, why) when none), signed as the claim expects."""
    if c.expect.endswith("variance"):
        return math.nan, ""
    if c.expect == "token_multiplier":
        ratio = c.published_ratio
        if math.isfinite(ratio) and ratio > 0:
            return 100.0 * (ratio - 1.0), f"the paper's multiplier ×{ratio:g} (tokens: no unit to convert)"
        return math.nan, ""
    pub = c.published
    if pub:
        value, text = convert_pct(
            float(pub["value"]),
            c.published_unit,
            pub.get("tokenizer"),
            pub.get("corpus"),
            rule,
            float_or_nan(pub.get("baseline")),
            base_loss,
        )
        if math.isfinite(value) or rule != PRIMARY_RULE:
            return value, text
    if math.isfinite(c.sesoi_pct):
        sign = -1.0 if c.expect == "lower" else 1.0
        return sign * abs(c.sesoi_pct), f"declared smallest effect of interest ±{abs(c.sesoi_pct):g}%"
    if math.isfinite(c.published_pct):
        return math.nan, "published number without a unit (declare published: {value, unit, ...})"
    return math.nan, ""


def _tests(c: Claim, eff: Effect | None, var: VarianceRatio | None, e_pct: float, values) -> dict[str, float]:
    """The raw p-values this claim's verdict uses: {'zero': ..., 'effect': ..., 'tost': ..., 'margin': ...}."""
    expect = c.expect
    if var is not None:
        out = {"zero": var.p}
        ratio = c.published_ratio
        if math.isfinite(ratio) and ratio > 0:
            scaled = {s: v / math.sqrt(ratio) for s, v in values.get(c.plus[0], {}).items()}
            out["effect"] = variance_ratio(scaled, values.get(c.minus[0], {})).p
        return out
    assert eff is not None
    d = eff.d_log
    if expect == "same":
        m = c.margin_pct
        return {"tost": tost(d, math.log1p(-m / 100.0), math.log1p(m / 100.0))[0], "zero": eff.p}
    if expect in ("below", "above"):
        return {"margin": t_test_vs(d, math.log1p(c.margin_pct / 100.0))[1]}
    out = {"zero": eff.p}
    if math.isfinite(e_pct) and d:
        out["effect"] = t_test_vs(d, _log1p_pct(e_pct))[1]
    return out


def _mean_log(values: Mapping[int, float]) -> float:
    logs = [math.log(v) for v in values.values() if math.isfinite(v) and v > 0]
    return sum(logs) / len(logs) if logs else math.nan


def judge(
    values: Mapping[str, Mapping[int, float]],
    claims: Sequence[Claim | Mapping[str, Any]],
    control: Claim | Mapping[str, Any] | None = None,
    alpha: float = ALPHA,
    metric: str = "val/ppl",
    untuned: Mapping[str, str] | None = None,
    planned: Mapping[str, int] | None = None,
    train_corpus: Mapping[str, str] | None = None,
) -> list[Judgement]:
    """Judge every claim (and the control, first in the list) from values: group -> {seed: final metric}.

    untuned: group -> why it lacks a tuned learning rate of its own (its claims are configuration-limited).
    planned: group -> the number of seeds the spec plans for it (a group with fewer finished makes the report
    interim: no verdicts); None when every planned run is in `values`.
    train_corpus: claim name -> the corpus its runs train on (units.BYTES_PER_UNIT key). Where it is not the paper's
    corpus, E is also converted with the training corpus's bytes per unit and the verdict under it is kept too.
    """
    parsed = [as_claim(c) for c in claims]
    if control is not None:
        parsed.insert(0, dataclasses.replace(as_claim(control, "control"), is_control=True))
    measured = []
    for c in parsed:
        if c.expect.endswith("variance"):
            var = variance_ratio(values.get(c.plus[0], {}), values.get(c.minus[0], {}), alpha)
            measured.append((c, None, var))
        elif c.expect == "token_multiplier":
            multipliers = token_multipliers(values, c.plus[0], c.curve)
            ones = {s: 1.0 for s in multipliers}
            measured.append((c, contrast({"k": multipliers, "1": ones}, ["k"], ["1"], alpha), None))
        else:
            measured.append((c, contrast(values, c.plus, c.minus, alpha), None))
    primary = _judge_rule(measured, values, alpha, metric, PRIMARY_RULE)
    alternative = _judge_rule(measured, values, alpha, metric, ALT_RULE, power=False)
    on_training = _judge_rule(_on_training_corpus(measured, train_corpus or {}), values, alpha, metric, PRIMARY_RULE)
    out: list[Judgement] = []
    for (c, _, _), main, alt, own in zip(measured, primary, alternative, on_training, strict=True):
        j = main
        j.alt_pct, j.alt_rule = alt.converted_pct, alt.converted_rule
        if alt.verdict != j.verdict and math.isfinite(alt.converted_pct):
            j.alt_verdict = alt.verdict + (f" ({alt.why})" if alt.why else "")
        j.e_corpus = str(c.published.get("corpus") or "")
        j.train_corpus = str((train_corpus or {}).get(c.name) or "")
        if j.e_corpus and j.train_corpus and j.train_corpus != j.e_corpus and math.isfinite(own.converted_pct):
            j.train_pct = own.converted_pct
            if own.verdict != j.verdict:
                j.train_verdict = own.verdict + (f" ({own.why})" if own.why else "")
        reasons = [c.limited] if c.limited else []
        if not j.is_control and untuned:
            reasons += sorted({f"{g}: {untuned[g]}" for g in [*c.plus, *c.minus] if g in untuned})
        j.limited = "; ".join(reasons)
        out.append(j)
    if control is not None and out[0].verdict != DETECTED:
        reversed_control = _reversed(out[0], alpha)
        if reversed_control:
            out[0].verdict = f"{out[0].verdict}; reversed: the baseline did better off its tuned setting"
        for j in out[1:]:
            _gate(j)
            if reversed_control and set(out[0].minus) & {*j.plus, *j.minus}:
                _mark_off_optimum(j)
    _mark_interim(out, values, planned or {})
    return out


def _on_training_corpus(measured: list, train_corpus: Mapping[str, str]) -> list:
    """The measured claims with each published effect's corpus replaced by the corpus its runs train on, where that
    corpus's bytes per unit are measured (else unchanged)."""
    out = []
    for c, eff, var in measured:
        pub, corpus = c.published, train_corpus.get(c.name)
        if pub and corpus and corpus != pub.get("corpus"):
            try:
                convert_pct(float(pub["value"]), c.published_unit, pub.get("tokenizer"), corpus)
                c = dataclasses.replace(c, published={**pub, "corpus": corpus})
            except UnitError:
                pass
        out.append((c, eff, var))
    return out


def _gate(j: Judgement) -> None:
    """A null-type verdict of a study whose control was not detected: the absence of an effect is not evidence."""
    if j.verdict.startswith(NULL_VERDICTS):
        j.verdict, j.gated = f"{j.verdict}; {SENSITIVITY_NOT_SHOWN}", True
    if j.alt_verdict.startswith(NULL_VERDICTS):
        j.alt_verdict = f"{j.alt_verdict}; {SENSITIVITY_NOT_SHOWN}"
    if j.train_verdict.startswith(NULL_VERDICTS):
        j.train_verdict = f"{j.train_verdict}; {SENSITIVITY_NOT_SHOWN}"


def _reversed(control: Judgement, alpha: float) -> bool:
    """Whether the control came out significantly against its expected direction (two-sided 1 - alpha interval)."""
    if control.effect is None or not control.effect.d_log:
        return False
    lo, hi = interval(control.effect.d_log, 1.0 - alpha)
    return hi < 0.0 if control.expect == "higher" else lo > 0.0


def _mark_off_optimum(j: Judgement) -> None:
    """A verdict against a baseline the reversed control showed off its optimum (module docstring)."""
    j.verdict = f"{j.verdict}; {BASELINE_OFF_OPTIMUM}"
    for name in ("alt_verdict", "train_verdict"):
        if getattr(j, name):
            setattr(j, name, f"{getattr(j, name)}; {BASELINE_OFF_OPTIMUM}")


def _mark_interim(out: list[Judgement], values: Mapping[str, Mapping[int, float]], planned: Mapping[str, int]) -> None:
    """Count each claim's finished and planned seeds; while any claim (or the control) lacks a planned seed, no
    claim has a verdict: every one reads `interim, n of N seeds`."""
    for j in out:
        groups = [*j.plus, *j.minus]
        done = [set(values.get(g, {})) for g in groups]
        j.seeds_done = len(set.intersection(*done)) if done else 0
        j.seeds_planned = min((planned.get(g, len(values.get(g, {}))) for g in groups), default=0)
    if all(j.seeds_done >= j.seeds_planned for j in out):
        return
    for j in out:
        before = j.verdict
        j.verdict = f"{INTERIM}, {j.seeds_done} of {j.seeds_planned} seeds"
        j.why = (
            "no verdict until every planned seed of the study has finished (a verdict after a look, with seeds "
            f"added, would be optional stopping); on the seeds so far: {before}"
        )
        j.alt_verdict, j.train_verdict, j.gated = "", "", False


def _judge_rule(measured, values, alpha: float, metric: str, rule: str, power: bool = True) -> list[Judgement]:
    """The verdicts of every claim with E converted by `rule` (one Holm family); `power`: the detectable effect and
    the seeds needed too."""
    targets = []
    for c, _, _ in measured:
        base = _mean_log(values.get(c.minus[0], {})) if len(c.minus) == 1 else math.nan
        # our baseline's loss in nats per byte: ln(ppl), the loss itself, or bpb x ln 2 (geometric mean over seeds)
        if metric == "val/ppl" or not math.isfinite(base):
            base_loss = base
        else:
            base_loss = math.exp(base) * (math.log(2.0) if metric == "val/bpb" else 1.0)
        if c.is_control:
            targets.append((c.expected_pct, "planted (predicted before the run)"))
        else:
            targets.append(_target(c, rule, base_loss))
    tests = [_tests(c, eff, var, e, values) for (c, eff, var), (e, _) in zip(measured, targets, strict=True)]
    held: list[dict[str, float]] = [{} for _ in measured]
    raw: list[dict[str, float]] = [{} for _ in measured]
    for i, (c, eff, _) in enumerate(measured):  # the control: alone, one-sided, at alpha (not in the family)
        if c.is_control:
            p_one = one_sided_p(eff, c.expect == "higher") if eff is not None else math.nan
            tests[i], held[i], raw[i] = {}, {"zero": p_one}, {"zero": p_one}
    flat = [(i, kind, p) for i, t in enumerate(tests) for kind, p in t.items()]
    adjusted = claims_holm([p for _, _, p in flat], [i for i, _, _ in flat])
    for (i, kind, p), p_adj in zip(flat, adjusted, strict=True):
        held[i][kind], raw[i][kind] = p_adj, p
    k = len({i for i, _, p in flat if math.isfinite(p)})  # claims with a test: the family counts claims
    level = alpha / max(k, 1)
    out = []
    for (c, eff, var), (e_pct, e_text), h, r in zip(measured, targets, held, raw, strict=True):
        j = Judgement(
            name=c.name,
            text=c.text,
            expect=c.expect,
            plus=c.plus,
            minus=c.minus,
            effect=eff,
            variance=var,
            p_holm=h.get("zero", h.get("tost", h.get("margin", math.nan))),
            raw_tests=dict(r),
            verdict=INCONCLUSIVE,
            why="",
            published_pct=c.published_pct,
            published_ratio=c.published_ratio,
            published_note=c.published_note,
            margin_pct=c.margin_pct,
            is_control=bool(c.is_control),
            published_unit=c.published_unit,
            converted_pct=e_pct,
            converted_rule=e_text,
            p_effect=r.get("effect", math.nan),
            p_holm_effect=h.get("effect", math.nan),
            family=k,
            level=level,
            expected_pct=c.expected_pct,
        )
        at = 2.0 * alpha if j.is_control else level  # the control's one-sided test at alpha: a two-sided 2 alpha
        if power and eff is not None and eff.d_log:
            lo, hi = interval(eff.d_log, 1.0 - at)
            j.v_low_pct, j.v_high_pct = pct(lo), pct(hi)
            mde = mde_log(eff.sd_log / math.sqrt(eff.n), eff.n - 1, at) if eff.sd_log > 0 else math.nan
            j.mde_pct = pct(-mde if c.expect in ("lower", "below") else mde)  # signed like the claim's change
            j.seeds_needed = seeds_needed(eff.sd_log, _log1p_pct(e_pct), at) if math.isfinite(e_pct) else 0
        j.verdict, j.why, j.excluded_pct = _label(c, eff, var, h, r, e_pct, alpha, values)
        both = not j.is_control and c.expect in ("lower", "higher") and _holds_both(j, e_pct, level)
        if both and j.verdict != INCONCLUSIVE:
            j.verdict, j.excluded_pct = INCONCLUSIVE, math.nan
            j.why = f"the {100 * (1 - level):.2f}% interval holds both 0 and E {e_pct:+.2f}%; {j.why}"
        out.append(j)
    return out


def _holds_both(j: Judgement, e_pct: float, level: float) -> bool:
    """Whether the interval at 1 - alpha / k (the one printed beside the verdict) holds both 0 and E."""
    if j.effect is None or not j.effect.d_log or not math.isfinite(e_pct):
        return False
    lo, hi = interval(j.effect.d_log, 1.0 - level)
    return lo <= 0.0 <= hi and lo <= _log1p_pct(e_pct) <= hi


def _bound_toward(d: Sequence[float], target: float, p_raw: float, p_adj: float, alpha: float) -> float:
    """The interval bound on `target`'s side at the level the Holm-adjusted test used (alpha x p_raw / p_adj)."""
    if not (p_adj > 0 and math.isfinite(p_raw) and math.isfinite(p_adj)):
        return math.nan
    lo, hi = interval(d, 1.0 - alpha * p_raw / p_adj)
    return pct(lo) if target < (lo + hi) / 2 else pct(hi)


def _label(c: Claim, eff, var, h: dict, r: dict, e_pct: float, alpha: float, values) -> tuple[str, str, float]:
    """(verdict, why, excluded bound X in %)."""
    expect, nan = c.expect, math.nan
    if c.is_control:
        p = h.get("zero", nan)
        delta = eff.delta_pct if eff else nan
        if math.isfinite(p) and p < alpha and (delta > 0) == (expect == "higher"):
            return DETECTED, f"one-sided p {p:.3g}", nan
        return NOT_DETECTED, f"one-sided p {p:.3g}" if math.isfinite(p) else (eff.why if eff else "no test"), nan
    if var is not None:
        p0, pe = h.get("zero", nan), h.get("effect", nan)
        if not math.isfinite(p0):
            return INCONCLUSIVE, var.why or "no variance test possible", nan
        up = expect == "more_variance"
        right = (var.ratio > 1) == up
        ratio = c.published_ratio
        text = f"ratio {var.ratio:.2f} [{var.ci_low:.2f}, {var.ci_high:.2f}], Holm p {p0:.3g}"
        if p0 < alpha:
            if not right:
                return OPPOSITE, text, nan
            if math.isfinite(pe) and pe < alpha:
                return f"{SIZE_DIFFERS} ({'larger' if (var.ratio > ratio) == up else 'smaller'})", text, nan
            return REPLICATED if math.isfinite(pe) else DIRECTION, text, nan
        if math.isfinite(pe) and pe < alpha:  # the bound at the level the step-down used for this test
            used = variance_ratio(values.get(c.plus[0], {}), values.get(c.minus[0], {}), alpha * r["effect"] / pe)
            bound = used.ci_high if ratio > 1 else used.ci_low
            return NOT_REPLICATED, f"ratios beyond {bound:.2f} excluded; {text}, vs {ratio:g}: Holm p {pe:.3g}", nan
        return INCONCLUSIVE, text, nan
    if eff is None or not math.isfinite(eff.delta_pct) or not eff.d_log:
        return INCONCLUSIVE, (eff.why if eff else "") or "no effect could be computed", nan
    d = eff.d_log
    if expect == "same":
        m, pt, p0 = c.margin_pct, h.get("tost", nan), h.get("zero", nan)
        if math.isfinite(pt) and pt < alpha:
            return f"{EQUIVALENT} within ±{m:g}%", f"TOST Holm p {pt:.3g}", nan
        if math.isfinite(p0) and p0 < alpha and abs(eff.delta_pct) > m:
            return NOT_EQUIVALENT, f"differs from 0 (Holm p {p0:.3g}) by more than ±{m:g}%", nan
        return INCONCLUSIVE, f"TOST Holm p {pt:.3g}: neither equivalence within ±{m:g}% nor a difference shown", nan
    if expect in ("below", "above"):
        m, pm = c.margin_pct, h.get("margin", nan)
        if not math.isfinite(pm):
            return INCONCLUSIVE, eff.why or "no test possible", nan
        claimed_side = eff.delta_pct < m if expect == "below" else eff.delta_pct > m
        word = "<" if expect == "below" else ">"
        if pm < alpha and claimed_side:
            return REPLICATED, f"Δ {word} {m:+g}% shown (Holm p {pm:.3g})", nan
        if pm < alpha:
            x = _bound_toward(d, math.log1p(m / 100.0), r["margin"], pm, alpha)
            return NOT_REPLICATED, f"Δ {word} {m:+g}% excluded: effects beyond {x:+.2f}% only (Holm p {pm:.3g})", x
        return INCONCLUSIVE, f"Δ against {m:+g}%: Holm p {pm:.3g}", nan
    p0, pe = h.get("zero", nan), h.get("effect", nan)
    if not math.isfinite(p0):
        return INCONCLUSIVE, eff.why or "no test possible", nan
    want_lower = expect == "lower"  # token_multiplier: k > 1 expected, as `higher`
    right = (eff.delta_pct < 0) == want_lower
    if p0 < alpha and not right:
        return OPPOSITE, f"Holm p {p0:.3g}", nan
    if not math.isfinite(e_pct):
        if p0 < alpha:
            return DIRECTION, f"Holm p {p0:.3g}; no published size", nan
        target = -1.0 if want_lower else 1.0
        x = _bound_toward(d, target, r["zero"], p0, alpha)
        return INCONCLUSIVE, f"Holm p {p0:.3g}; no published size; effects beyond {x:+.2f}% excluded", x
    if p0 < alpha:
        if math.isfinite(pe) and pe < alpha:
            larger = abs(eff.delta_pct) > abs(e_pct)
            return f"{SIZE_DIFFERS} ({'larger' if larger else 'smaller'})", f"vs E {e_pct:+.2f}%: Holm p {pe:.3g}", nan
        return REPLICATED, f"Holm p {p0:.3g}; E {e_pct:+.2f}% not excluded (Holm p {pe:.3g})", nan
    if math.isfinite(pe) and pe < alpha and abs(eff.delta_pct) < abs(e_pct) or (pe < alpha and not right):
        x = _bound_toward(d, _log1p_pct(e_pct), r["effect"], pe, alpha)
        return NOT_REPLICATED, f"effects beyond {x:+.2f}% excluded (E {e_pct:+.2f}%, Holm p {pe:.3g})", x
    return INCONCLUSIVE, f"the interval holds 0 and E {e_pct:+.2f}% (Holm p {p0:.3g} vs 0, {pe:.3g} vs E)", nan


def planned_tests(claim: Claim | Mapping[str, Any]) -> int:
    """How many tests a claim puts in the study's Holm family (before any run: from the spec alone)."""
    c = as_claim(claim)
    if c.expect in ("below", "above"):
        return 1
    if c.expect == "same":
        return 2
    if c.expect.endswith("variance") or c.expect == "token_multiplier":
        return 1 + int(math.isfinite(c.published_ratio))
    return 1 + int(bool(c.published) or math.isfinite(c.sesoi_pct))


def planned_effect(claim: Claim | Mapping[str, Any]) -> float:
    """E of a claim in our unit (%) from the spec alone (nats per byte; nan when it has none)."""
    return _target(as_claim(claim), PRIMARY_RULE, math.nan)[0]
