"""Reports cannot misstate their own bookkeeping (issue 43, item 5): the counts of computed and adopted runs that the
results' prose gives are the runs' records' (study.json), and a report's `Runs:` line is generated from them."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from lightning_cqk.study.report.render import bookkeeping_line, code_line

RESULTS = Path(__file__).resolve().parents[4] / "docs" / "results"
COUNTS = re.compile(r"(\d+) computed, (\d+) adopted")


def _recorded(study: str) -> tuple[int, int]:
    runs = json.loads((RESULTS / study / "study.json").read_text())["runs"]
    done = [r for r in runs if r.get("status") == "done"]
    adopted = sum(1 for r in done if r.get("adopted_from"))
    shared = sum(1 for r in done if r.get("same_as") or r.get("reused_from"))
    return len(done) - adopted - shared, adopted


@pytest.mark.parametrize("study", sorted(p.parent.name for p in RESULTS.glob("*/study.json")))
def test_the_counts_the_results_prose_gives_are_the_records(study: str):
    recorded = _recorded(study)
    readme = (RESULTS / study / "README.md").read_text()
    index = (RESULTS / "README.md").read_text().splitlines()
    row = next((line for line in index if line.startswith(f"| [{study}](")), "")
    for text in (readme, row):
        for match in COUNTS.finditer(text):
            assert (int(match.group(1)), int(match.group(2))) == recorded, (study, match.group(0))


def test_the_runs_line_and_the_code_line_come_from_the_records():
    """By hand: 2 computed (one at revision a, one at b then c), 1 adopted recorded before provenance was kept (its
    started attempt's revision is not its numbers'), 1 adopted with its twin's provenance, 1 shared, 1 failed."""
    a, b, c, d = "a" * 40, "b" * 40, "c" * 40, "d" * 40
    manifest = {
        "runs": [
            {"status": "done", "revisions": [a]},
            {"status": "done", "revisions": [b, c]},
            {"status": "done", "revisions": [a], "adopted_from": "x#r1"},
            {"status": "done", "revisions": [d], "adopted_from": "x#r2", "made_by": {"device": "cpu"}},
            {"status": "done", "revisions": [a], "same_as": "r0"},
            {"status": "failed"},
        ]
    }
    assert bookkeeping_line(manifest) == (
        "Runs: 6 (2 computed, 2 adopted, 1 shared; 1 not finished; from the runs' records)."
    )
    line = code_line(manifest)
    assert f"{a[:12]}: 2 runs" in line and "not recorded: 1 run" in line and f"{d[:12]}: 1 run" in line


def test_moved_over_the_last_20_percent_is_on_the_same_windows():
    """The curve scores 2 windows, the final validation 4 (data.final_val_windows): by hand, the final loss on the
    curve's 2 windows is (3 + 5) / (2 + 2) = 2.0 nats per token, the curve's value at 80% was 2.5, so the metric moved
    exp(2.0) / exp(2.5) - 1 = -39.3%; the 4-window final value (10 / 8 = 1.25) against the 2-window 2.5 is not that."""
    from lightning_cqk.study.judge.group_estimates import settle_pct

    run = {
        "scalars": {
            "val/loss": [(0, 3.0), (80, 2.5), (100, 1.25)],
            "val/ppl": [(0, 20.1), (80, math.exp(2.5)), (100, 3.49)],
        },
        "windows": {"nll": [3.0, 5.0, 1.0, 1.0], "tokens": [2, 2, 2, 2]},
    }
    assert settle_pct(run, "val/ppl", subset=2) == pytest.approx(100 * math.expm1(2.0 - 2.5))
    assert settle_pct(run, "val/loss", subset=2) == pytest.approx(100 * (2.0 / 2.5 - 1))
    assert settle_pct(run, "val/loss") == pytest.approx(100 * (1.25 / 2.5 - 1))  # one set: as before
    assert math.isnan(settle_pct({**run, "windows": None}, "val/loss", subset=2))  # no per-window losses: unknown


def test_the_control_calibration_counts_the_planted_sizes_prediction_error():
    """A rate control at 0.5 x the chosen 0.004, predicted from 3 grid seeds whose curves give +2%, +3% and +4% (by
    hand: losses at 0.002 are the chosen rate's + ln 1.02, 1.03, 1.04): planted +3%, its error sd 1% / sqrt 3. The
    control's observed +4.5% with se_obs from its 95% interval: z = 1.5 / sqrt(se_obs^2 + 1/3), two-sided."""
    from scipy import stats as scipy_stats

    from lightning_cqk.study.judge.group_estimates import control_calibration
    from lightning_cqk.study.judge.stats import Effect
    from lightning_cqk.study.judge.verdict import Judgement
    from lightning_cqk.study.results_model import StudyData, TuningTable

    base = [2.0, 2.1, 2.2]
    low = [b + math.log(1 + x / 100) for b, x in zip(base, (2.0, 3.0, 4.0), strict=True)]
    data = StudyData(
        manifest={
            "spec": {"metric": "val/ppl", "control": {"group": "lower", "lr_scale": 0.5}},
            "runs": [{"group": "lower", "overrides": {"model.optim.lr": "{tuned_lr:standard*0.5}"}}],
        },
        tuning=TuningTable(
            rows=[("standard", 0.002, "", sum(low) / 3), ("standard", 0.004, "", sum(base) / 3)],
            chosen={"standard": 0.004},
            per_seed={("standard", 0.002): low, ("standard", 0.004): base},
        ),
    )
    t = scipy_stats.t.ppf(0.975, 7)
    effect = Effect("paired t", 8, 0, 4.5, 4.5 - 2 * t, 4.5 + 2 * t, 0, 7, 0.001, 1.0, 0.02)  # se_obs 2.0
    control = Judgement(
        "c", "", "higher", ["lower"], ["standard"], effect, None, 0.001, "", "", math.nan, math.nan, "", math.nan
    )
    control.expected_pct = 3.0
    se_pred, p, seeds = control_calibration(data, control)
    assert seeds == 3 and se_pred == pytest.approx(1.0 / math.sqrt(3), rel=1e-6)
    assert p == pytest.approx(2 * scipy_stats.norm.sf(1.5 / math.sqrt(4 + 1 / 3)), rel=1e-6)


def test_an_adopted_run_whose_record_names_no_probe_is_reported_as_unchecked():
    """Issue 45 (noticed): a study.json run with `adopted_from` but no `probe` (written by hand) was a KeyError."""
    from lightning_cqk.study.report.report_read import computed_once

    manifest = {
        "runs": [
            {"name": "a-s1", "adopted_from": "docs/results/x:a-s1", "probe": "a-s0"},
            {"name": "a-s2", "adopted_from": "docs/results/x:a-s2"},
            {"name": "a-s3"},
        ]
    }
    lines = computed_once(manifest)
    assert lines[0] == "a-s1 = docs/results/x:a-s1 (adopted: a-s0 reproduced its committed twin to the last digit)"
    assert lines[1].startswith("a-s2 = docs/results/x:a-s2 (adopted, but its record names no probe run")
    assert len(lines) == 2
