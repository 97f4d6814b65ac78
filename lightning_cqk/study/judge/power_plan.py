"""The power plan a dry run prints after its estimate: per claim its expected effect, its seeds and the effect it
can detect (`lightning_cqk sweep --dry-run`)."""

from __future__ import annotations

import math

from lightning_cqk.study.judge.stats import ALPHA, mde_log, pct, seeds_needed
from lightning_cqk.study.judge.verdict import planned_effect, planned_tests


def power_lines(sweep) -> list[str]:
    """The power plan printed before the run: per claim its E in our unit, its seeds and the detectable effect at 80%
    power at alpha / k (k: the claims of the study's family, verdict.py), and the paired seeds that would detect |E|
    there, from the paired standard deviation the profile declares (`planning: {sd_pct: {default: 0.8, <claim>:
    ...}}`, measured by the study's committed report). The control is outside the family: its line is at its own
    one-sided alpha (a two-sided 2 alpha)."""
    claims, control = sweep.claims, sweep.control_claim  # parsed once, by spec.expand (claim.py)
    k = sum(1 for c in claims if planned_tests(c))
    if not k and not control:
        return []
    level = ALPHA / max(k, 1)
    prof = sweep.spec["profiles"][sweep.profile]
    sds = (prof.get("planning") or {}).get("sd_pct") or {}
    seeds_of: dict[str, set[int]] = {}
    for run in sweep.runs:
        if run.role != "tuning":
            seeds_of.setdefault(run.group, set()).add(run.seed)
    lines = [
        f"Power plan: {k} claim{'s' if k != 1 else ''} in the Holm family (a claim's tests exclude each other: "
        "Shaffer), detectable effects "
        f"at alpha/k = {level:.4g}, 80% power; the control at one-sided alpha = {ALPHA:g}, outside the family "
        "(paired sd: the profile's `planning:`; lightning_cqk/study/judge/verdict.py):"
    ]
    for claim in ([control] if control else []) + claims:
        groups = [*claim.plus, *claim.minus]  # token_multiplier: minus holds the curve's groups
        seeds = set.intersection(*(seeds_of.get(g, set()) for g in groups)) if groups else set()
        n = len(seeds)
        sd = sds.get(claim.name, sds.get("default"))
        if claim.is_control:
            e = claim.expected_pct
            e_text = f"planted {e:+.2f}%" if math.isfinite(e) else "–"
        else:
            e = planned_effect(claim)
            e_text = f"E {e:+.2f}%" if math.isfinite(e) else "E –"
        if claim.expect.endswith("variance"):
            mde_text = "a variance ratio (no detectable Δ)"
        elif sd is None or n < 2:
            mde_text = "detectable: no planning sd" if sd is None else "detectable: fewer than 2 seeds"
        else:
            at = 2.0 * ALPHA if claim.is_control else level
            mde = pct(mde_log(float(sd) / 100.0 / math.sqrt(n), n - 1, at))
            mde_text = f"detectable {mde:.2f}% (sd {float(sd):g}%)"
            need = seeds_needed(float(sd) / 100.0, math.log1p(e / 100.0), at) if math.isfinite(e) else 0
            if need:
                mde_text += f"; {'over 200' if need > 200 else need} seeds would detect {abs(e):.2f}%"
        lines.append(f"  {claim.name:<40} {n:>3} seeds  {e_text:<16} {mde_text}")
    return lines
