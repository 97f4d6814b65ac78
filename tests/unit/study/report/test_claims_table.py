"""The README's claims table: one row per claim, the positive control in the study's cell, a missed control said."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning_cqk.study.report.claims_table import claims_markdown

FIELDS = ["claim", "control", "plus", "published_pct", "published_ratio", "delta_pct", "ci_low_pct", "ci_high_pct"]
FIELDS += ["var_ratio", "var_ci_low", "var_ci_high", "mde_pct", "verdict", "published_unit", "converted_pct", "level"]
FIELDS += ["excluded_pct", "limited", "expected_pct", "tests", "p_holm", "p_holm_effect"]


def _study(root: Path, name: str, rows: list[dict[str, str]]) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / f"{name}.md").write_text("report")
    with open(folder / "claims.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS, restval="nan")
        writer.writeheader()
        writer.writerows(rows)


def test_control_in_the_study_cell_and_a_missed_control_marks_the_null_rows(tmp_path: Path):
    control = {"claim": "control-fewer", "control": "True", "plus": "fewer", "delta_pct": "3.8", "verdict": "detected"}
    control["expected_pct"] = "3.55"
    claim = {"claim": "b-vs-a", "control": "False", "published_pct": "-6.6", "delta_pct": "-0.2"}
    claim.update(published_unit="token_ppl", converted_pct="-1.491", mde_pct="-0.9", level="0.00714")
    claim.update(ci_low_pct="-0.5", ci_high_pct="0.1", verdict="not replicated at this scale", excluded_pct="-0.61")
    _study(tmp_path, "good", [control, claim])
    missed = dict(control, delta_pct="1.5", verdict="not detected")
    gated = "inconclusive; sensitivity not shown"
    _study(tmp_path, "weak", [missed, dict(claim, mde_pct="4.0", verdict=gated, excluded_pct="nan", limited="x")])
    lines = claims_markdown(tmp_path, link_root="r").splitlines()
    good = next(x for x in lines if x.startswith("| [good]"))
    assert good == (
        "| [good](r/good/good.md)<br>control fewer (planted +3.5%): +3.8%, detected | b-vs-a | -6.6% token PPL → "
        "E -1.49% | -0.2% [-0.5, +0.1] | -0.90% (α 0.0071) | **not replicated at this scale**: beyond -0.6% excluded "
        "| – |"  # no test recorded: no program-wide p
    )
    weak = next(x for x in lines if x.startswith("| [weak]"))
    assert "control fewer (planted +3.5%): +1.5%, **not detected: sensitivity not shown**" in weak
    assert weak.endswith("| **inconclusive; sensitivity not shown** (configuration-limited) | – |")
    assert not any("control-fewer" in x for x in lines)  # the control is no claim row of its own
    assert len([x for x in lines if x.startswith("| ")]) == 1 + 2  # the header, then one claim per study


def test_the_program_wide_column_is_holm_over_every_study_with_a_shared_claim_counted_once(tmp_path: Path):
    """Issue 43: two studies each significant alone (raw p 0.03 against 0) are not both significant across the
    program (Holm over 2 claims: 0.03 x 2 = 0.06; against E, 0.4 x 2 = 0.8 and the step-down's maximum for
    0.5: 0.8, by hand); a third study judging the first's claim on the same runs (the same
    raw p's and change) is the same hypothesis, counted once."""
    base = {"control": "False", "delta_pct": "-1.0", "ci_low_pct": "-2", "ci_high_pct": "-0.1", "verdict": "x"}
    one = dict(base, claim="a-vs-b", tests="zero:0.03 effect:0.5", p_holm="0.03", p_holm_effect="0.5")
    two = dict(base, claim="c-vs-d", delta_pct="-1.5", tests="zero:0.03 effect:0.4", p_holm="0.03")
    _study(tmp_path, "first", [one])
    _study(tmp_path, "second", [two])
    _study(tmp_path, "shared", [dict(one)])  # the first study's claim on its runs
    lines = claims_markdown(tmp_path, link_root="r").splitlines()
    row = next(x for x in lines if "a-vs-b" in x and x.startswith("| [first]"))
    assert row.endswith("| 0.06 / 0.8 **not significant program-wide** |")
    assert lines[1].endswith("| program-wide Holm p (vs 0 / vs E) |")
