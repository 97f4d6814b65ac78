"""A claim of a study, parsed once: the typed object the spec check, the verdict (verdict.py) and the dry-run's
power plan (cost_estimate.py) share. Its format (spec `claims:`) is documented in
lightning_cqk/study/judge/verdict.py."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from lightning_cqk.study.design.units import UNITS, UnitError, convert_pct

EXPECTS = ("lower", "higher", "same", "below", "above", "more_variance", "less_variance", "token_multiplier")


class ClaimError(ValueError):
    """A malformed claim in a spec."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim: the contrast `plus` vs `minus` (log-metric means paired by seed), what it expects and the paper's
    number where it gives one (in its own unit: converted to ours by units.py)."""

    name: str
    text: str
    expect: str  # one of EXPECTS
    plus: list[str]
    minus: list[str]  # token_multiplier: the baseline's curve groups, by budget
    published: dict[str, Any]  # {value, unit, tokenizer, corpus, baseline, note}; {} when the paper gives none
    published_unit: str
    published_pct: float  # as published, in its own unit (nan: none)
    published_ratio: float  # a variance ratio or token multiplier as published (nan: none)
    published_note: str
    margin_pct: float  # same / below / above: the margin in our unit (%)
    sesoi_pct: float  # the smallest effect of interest where nothing is published (%)
    limited: str  # why the claim is configuration-limited ('' when it is not)
    expected_pct: float  # a control's planted size, predicted before the run
    curve: dict[str, float]  # token_multiplier: {baseline group: its token multiple}
    is_control: bool = False
    measure: str = ""  # the measure the claim is about (spec `metric:` of the claim); "": the study's metric
    baseline: str = ""  # the group it is measured against as written (`vs`, else minus[0]): its training corpus

    def on(self, measure: str) -> Claim:
        """This claim with its groups named as `measured_group(group, measure)` (a curve's too): how the verdicts
        keep one group's values on two measures apart. The names are labels, built here and never parsed."""
        plus = [measured_group(g, measure) for g in self.plus]
        minus = self.minus if self.expect == "token_multiplier" else [measured_group(g, measure) for g in self.minus]
        return dataclasses.replace(self, plus=plus, minus=minus)


def measured_group(group: str, measure: str) -> str:
    """The label of a group's values on a measure other than the study's: "<group>@<measure>" (the report prints it)."""
    return f"{group}@{measure}"


def parse_claim(claim: Mapping[str, Any], where: str = "spec") -> Claim:
    """The one parser of a claim (a spec's `claims:` entry, a control, or either as study.json recorded it): plus /
    minus lists, expect, numbers checked; raises ClaimError naming what is wrong."""
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
    curve = claim.get("curve") or {}
    if expect == "token_multiplier":
        if not isinstance(curve, Mapping) or len(curve) < 2 or not all(float(r) > 0 for r in curve.values()):
            raise ClaimError(
                f"{where}: claim {name!r} expects token_multiplier: give curve, the baseline's groups at two or "
                "more token budgets as multiples of the group's, e.g. {standard-B: 1.0, standard-2.4B: 2.4}."
            )
        curve = dict(sorted(curve.items(), key=lambda item: (float(item[1]), str(item[0]))))  # by budget: the
        minus = [str(g) for g in curve]  # same order whether the spec or study.json (sorted keys) gave the mapping
    if expect.endswith("variance") and (len(plus) != 1 or len(minus) != 1):
        raise ClaimError(f"{where}: claim {name!r}: a variance claim compares one group with one (group + vs).")
    if expect in ("same", "below", "above") and not float(claim.get("margin_pct") or 0) > 0:
        raise ClaimError(
            f"{where}: claim {name!r} expects `{expect}`: give margin_pct > 0 (in our unit, % of val PPL: what "
            "counts as the same / as little / as much)."
        )
    published = claim.get("published") or {}
    if not isinstance(published, Mapping):
        raise ClaimError(f"{where}: claim {name!r}: published is a mapping {{value, unit, tokenizer, corpus}}.")
    unit = str(published.get("unit", "")) if published else ""
    if published:
        if "value" not in published or unit not in UNITS:
            raise ClaimError(
                f"{where}: claim {name!r}: published needs value and unit (one of {', '.join(UNITS)}), e.g. "
                "{value: -6.6, unit: token_ppl, tokenizer: gpt2, corpus: wikitext, baseline: 24.22}."
            )
        if unit == "token_ppl" and not published.get("tokenizer"):
            raise ClaimError(f"{where}: claim {name!r}: a token_ppl effect needs its tokenizer (e.g. gpt2).")
        try:
            convert_pct(float(published["value"]), unit, published.get("tokenizer"), published.get("corpus"))
        except UnitError as err:
            raise ClaimError(f"{where}: claim {name!r}: {err}") from None
    return Claim(
        name=name,
        text=str(claim.get("text", "")),
        expect=expect,
        plus=plus,
        minus=minus,
        published=dict(published),
        published_unit=unit,
        published_pct=float_or_nan(published.get("value") if published else claim.get("published_pct")),
        published_ratio=float_or_nan(claim.get("published_ratio")),
        published_note=str(published.get("note", "") if published else claim.get("published_note", "")),
        margin_pct=float_or_nan(claim.get("margin_pct")),
        sesoi_pct=float_or_nan(claim.get("sesoi_pct")),
        limited=str(claim.get("limited") or ""),
        expected_pct=float_or_nan(claim.get("expected_pct")),
        curve={str(g): float(r) for g, r in curve.items()} if expect == "token_multiplier" else {},
        measure=str(claim.get("metric") or ""),
        baseline=str(claim.get("vs") or (claim.get("minus") or [""])[0]),
    )


def as_claim(claim: Claim | Mapping[str, Any], where: str = "spec") -> Claim:
    """`claim` itself when already parsed, else `parse_claim(claim, where)`."""
    return claim if isinstance(claim, Claim) else parse_claim(claim, where)


def float_or_nan(x: Any) -> float:
    """x as a float; nan for None."""
    return math.nan if x is None else float(x)
