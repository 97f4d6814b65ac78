"""Verdicts: each claim of a study (spec `claims:`) judged from the runs, never written by hand.

A claim names a contrast of groups and what the paper expects of it:

    claims:
      - name: coupled-beats-standard
        text: coupled (leapfrog) lowers val PPL vs standard
        group: coupled-leapfrog          # shorthand for plus: [coupled-leapfrog], minus: [standard]
        vs: standard
        expect: lower                    # lower | higher | same | more_variance | less_variance
        published_pct: -6.6              # the paper's change (Delta%), shown beside ours; for variance: published_ratio
        published_note: 60M, WikiText-103, GPT-2 BPE
      - name: gain-shrinks-with-size     # an interaction: (L-coupled / L-standard) / (S-coupled / S-standard)
        plus: [d128-coupled, d64-standard]
        minus: [d128-standard, d64-coupled]
        expect: higher
      - name: one-step-suffices
        group: steps7
        vs: steps1
        expect: same
        margin_pct: 1.0                  # "same" means |Delta%| < margin

Rules (alpha = 0.05; p-values Holm-adjusted over every test of the study, the positive control's included):
- lower / higher: `supports` when the adjusted p < alpha and the change has the paper's sign, `contradicts` when
  the adjusted p < alpha and the sign is the opposite, else `inconclusive` (the minimum detectable effect at 80%
  power is printed beside the paper's effect, so "no power" and "no effect" are told apart).
- same: `supports` when the 95% interval of Delta% lies inside (-margin, margin) (equivalence shown),
  `contradicts` when the adjusted p < alpha and the interval lies entirely outside [-margin, margin], else
  `inconclusive`.
- more_variance / less_variance: the seed-variance ratio var(group) / var(vs) and its test (stats.variance_ratio):
  `supports` when the adjusted p < alpha and the ratio is on the paper's side of 1, `contradicts` when significant
  on the other side, else `inconclusive`.
- The positive control (spec `control:`) must be significant in its expected direction; otherwise the study has no
  power and every verdict is `void`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_cqk.sweep.stats import ALPHA, Effect, VarianceRatio, contrast, holm, variance_ratio

EXPECTS = ("lower", "higher", "same", "more_variance", "less_variance")
SUPPORTS, CONTRADICTS, INCONCLUSIVE, VOID = "supports", "contradicts", "inconclusive", "void"


class ClaimError(ValueError):
    """A malformed claim in a spec."""


@dataclasses.dataclass
class Judgement:
    name: str
    text: str
    expect: str
    plus: list[str]
    minus: list[str]
    effect: Effect | None
    variance: VarianceRatio | None
    p_holm: float
    verdict: str
    why: str
    published_pct: float
    published_ratio: float
    published_note: str
    margin_pct: float
    is_control: bool = False


def parse_claim(claim: Mapping[str, Any], where: str = "spec") -> dict[str, Any]:
    """Normalise one claim: plus / minus lists, expect, numbers; raises ClaimError naming what is wrong."""
    if not isinstance(claim, Mapping) or "name" not in claim:
        raise ClaimError(f"{where}: a claim is a mapping with at least name, expect and group/vs or plus/minus.")
    name = str(claim["name"])
    expect = claim.get("expect")
    if expect not in EXPECTS:
        raise ClaimError(f"{where}: claim {name!r} has expect {expect!r}; use one of {', '.join(EXPECTS)}.")
    if "group" in claim:
        if "plus" in claim or "minus" in claim or "vs" not in claim:
            raise ClaimError(f"{where}: claim {name!r}: give either group + vs, or plus + minus lists.")
        plus, minus = [str(claim["group"])], [str(claim["vs"])]
    else:
        plus, minus = [str(g) for g in claim.get("plus") or []], [str(g) for g in claim.get("minus") or []]
        if not plus or not minus:
            raise ClaimError(f"{where}: claim {name!r} needs group + vs, or non-empty plus and minus lists.")
    if expect.endswith("variance") and (len(plus) != 1 or len(minus) != 1):
        raise ClaimError(f"{where}: claim {name!r}: a variance claim compares one group with one (group + vs).")
    if expect == "same" and not float(claim.get("margin_pct") or 0) > 0:
        raise ClaimError(f"{where}: claim {name!r} expects `same`: give margin_pct > 0 (what counts as the same).")
    return {
        "name": name,
        "text": str(claim.get("text", "")),
        "expect": expect,
        "plus": plus,
        "minus": minus,
        "published_pct": _float(claim.get("published_pct")),
        "published_ratio": _float(claim.get("published_ratio")),
        "published_note": str(claim.get("published_note", "")),
        "margin_pct": _float(claim.get("margin_pct")),
    }


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def judge(
    values: Mapping[str, Mapping[int, float]],
    claims: Sequence[Mapping[str, Any]],
    control: Mapping[str, Any] | None = None,
    alpha: float = ALPHA,
) -> list[Judgement]:
    """Judge every claim (and the control, first in the list) from values: group -> {seed: final metric}."""
    parsed = [parse_claim(c) for c in claims]
    if control is not None:
        parsed.insert(0, {**parse_claim(control, "control"), "is_control": True})
    results: list[tuple[dict, Effect | None, VarianceRatio | None, float]] = []
    for c in parsed:
        if c["expect"].endswith("variance"):
            var = variance_ratio(values.get(c["plus"][0], {}), values.get(c["minus"][0], {}), alpha)
            results.append((c, None, var, var.p))
        else:
            eff = contrast(values, c["plus"], c["minus"], alpha)
            results.append((c, eff, None, eff.p))
    adjusted = holm([p for _, _, _, p in results])
    out: list[Judgement] = []
    for (c, eff, var, _), p_adj in zip(results, adjusted, strict=True):
        verdict, why = _verdict(c, eff, var, p_adj, alpha)
        out.append(
            Judgement(
                name=c["name"],
                text=c["text"],
                expect=c["expect"],
                plus=c["plus"],
                minus=c["minus"],
                effect=eff,
                variance=var,
                p_holm=p_adj,
                verdict=verdict,
                why=why,
                published_pct=c["published_pct"],
                published_ratio=c["published_ratio"],
                published_note=c["published_note"],
                margin_pct=c["margin_pct"],
                is_control=bool(c.get("is_control")),
            )
        )
    if control is not None and out[0].verdict != SUPPORTS:
        for j in out[1:]:
            j.why = f"{j.verdict} before voiding; " + j.why if j.why else f"{j.verdict} before voiding"
            j.verdict = VOID
    return out


def _verdict(c: dict, eff: Effect | None, var: VarianceRatio | None, p: float, alpha: float) -> tuple[str, str]:
    expect = c["expect"]
    if var is not None:
        if not math.isfinite(p):
            return INCONCLUSIVE, var.why or "no variance test possible"
        sign_ok = var.ratio > 1 if expect == "more_variance" else var.ratio < 1
        if p < alpha:
            return (SUPPORTS if sign_ok else CONTRADICTS), f"variance ratio {var.ratio:.2f}, Holm p {p:.3g}"
        return INCONCLUSIVE, f"variance ratio {var.ratio:.2f} [{var.ci_low:.2f}, {var.ci_high:.2f}], Holm p {p:.3g}"
    assert eff is not None
    if not math.isfinite(eff.delta_pct):
        return INCONCLUSIVE, eff.why or "no effect could be computed"
    if expect == "same":
        m = c["margin_pct"]
        if -m < eff.ci_low_pct and eff.ci_high_pct < m:
            return SUPPORTS, f"95% CI inside ±{m:g}%"
        outside = eff.ci_low_pct > m or eff.ci_high_pct < -m
        if math.isfinite(p) and p < alpha and outside:
            return CONTRADICTS, f"95% CI outside ±{m:g}%, Holm p {p:.3g}"
        return INCONCLUSIVE, f"95% CI [{eff.ci_low_pct:+.2f}, {eff.ci_high_pct:+.2f}]% not decided against ±{m:g}%"
    if not math.isfinite(p):
        return INCONCLUSIVE, eff.why or "no test possible"
    sign_ok = eff.delta_pct < 0 if expect == "lower" else eff.delta_pct > 0
    if p < alpha:
        return (SUPPORTS if sign_ok else CONTRADICTS), f"Holm p {p:.3g}"
    return INCONCLUSIVE, f"Holm p {p:.3g}; detectable |Δ| ≥ {eff.mde_pct:.2f}% at 80% power"
