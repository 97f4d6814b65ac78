"""The README's claims table: one row per claim, the positive control in the study's cell, a missed control said."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning_cqk.sweep.claims_table import claims_markdown

FIELDS = ["claim", "control", "plus", "published_pct", "published_ratio", "delta_pct", "ci_low_pct", "ci_high_pct"]
FIELDS += ["var_ratio", "var_ci_low", "var_ci_high", "mde_pct", "verdict"]


def _study(root: Path, name: str, rows: list[dict[str, str]]) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / f"{name}.md").write_text("report")
    with open(folder / "claims.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS, restval="nan")
        writer.writeheader()
        writer.writerows(rows)


def test_control_in_the_study_cell_and_a_missed_control_voids_the_rows(tmp_path: Path):
    control = {"claim": "control-half", "control": "True", "plus": "half", "delta_pct": "250.0", "verdict": "supports"}
    claim = {"claim": "b-beats-a", "control": "False", "published_pct": "-6.6", "delta_pct": "-2.0"}
    claim.update(ci_low_pct="-3.0", ci_high_pct="-1.0", verdict="supports")
    _study(tmp_path, "good", [control, claim])
    missed = dict(control, delta_pct="1.5", verdict="inconclusive")
    _study(tmp_path, "weak", [missed, dict(claim, mde_pct="4.0", verdict="void")])
    lines = claims_markdown(tmp_path, link_root="r").splitlines()
    good = next(x for x in lines if x.startswith("| [good]"))
    assert good == (
        "| [good](r/good/good.md)<br>control half: +250.0%, detected | b-beats-a | -6.6% | -2.0% [-3.0, -1.0] "
        "| **supports** |"
    )
    weak = next(x for x in lines if x.startswith("| [weak]"))
    assert "control half: +1.5%, **not detected: verdicts void**" in weak and weak.endswith("| **void** |")
    assert not any("control-half" in x for x in lines)  # the control is no claim row of its own
    assert len([x for x in lines if x.startswith("| ")]) == 1 + 2  # the header, then one claim per study
