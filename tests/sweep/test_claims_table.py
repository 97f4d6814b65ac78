"""The README's claims table: one row per claim, the positive control in the study's cell, a missed control said."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning_cqk.sweep.claims_table import claims_markdown

FIELDS = ["claim", "control", "plus", "published_pct", "published_ratio", "delta_pct", "ci_low_pct", "ci_high_pct"]
FIELDS += ["var_ratio", "var_ci_low", "var_ci_high", "mde_pct", "verdict", "published_unit", "converted_pct", "level"]
FIELDS += ["excluded_pct", "limited", "expected_pct"]


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
        "E -1.49% | -0.2% [-0.5, +0.1] | -0.90% (α 0.0071) | **not replicated at this scale**: beyond -0.6% excluded |"
    )
    weak = next(x for x in lines if x.startswith("| [weak]"))
    assert "control fewer (planted +3.5%): +1.5%, **not detected: sensitivity not shown**" in weak
    assert weak.endswith("| **inconclusive; sensitivity not shown** (configuration-limited) |")
    assert not any("control-fewer" in x for x in lines)  # the control is no claim row of its own
    assert len([x for x in lines if x.startswith("| ")]) == 1 + 2  # the header, then one claim per study
