"""The calibration reads committed study.json files through one checked reader (study/design/cost_calibration.py);
its fit over the real studies is checked in tests/test_docs_drift.py, where the estimates are already made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_cqk.study.design.cost_calibration import fit, measured_study
from lightning_cqk.study.design.spec_checks import SpecError


def _study(tmp_path: Path, run: dict) -> Path:
    record = {
        "study": "toy",
        "spec_path": "configs/ablations/toy.yaml",
        "profile": "cpu",
        "spec": {"profiles": {"cpu": {"jobs": 2}}},
        "created": "2026-11-28T03:00:00+00:00",
        "updated": "2026-11-28T03:10:00+00:00",
        "runs": [run, {"name": "b-s1", "status": "done", "seconds": 5, "adopted_from": "docs/results/x#b-s1"}],
    }
    path = tmp_path / "study.json"
    path.write_text(json.dumps(record))
    return path


def test_a_study_json_gives_its_computed_runs_wall_and_jobs(tmp_path: Path):
    study = measured_study(_study(tmp_path, {"name": "a-s1", "status": "done", "seconds": 61.5}))
    assert (study.jobs, study.wall_s, study.seconds) == (2, 600.0, {"a-s1": 61.5})  # the adopted run is not its time


@pytest.mark.parametrize("seconds", [None, "61", True])
def test_a_run_without_its_seconds_is_refused_naming_the_file_and_field(tmp_path: Path, seconds):
    path = _study(tmp_path, {"name": "a-s1", "status": "done", "seconds": seconds})
    with pytest.raises(SpecError, match=rf"{path}: field 'seconds' is .*, not a int or float"):
        measured_study(path)


def test_the_fit_recovers_known_constants():
    points = [(t, v, 13.4 + 0.69 * t + 1.5 * v) for t, v in [(40, 10), (80, 12), (60, 30), (120, 5)]]
    assert fit(points) == pytest.approx((13.4, 0.69, 1.5))


def test_a_study_measured_under_load_is_left_out_until_it_is_rerun(tmp_path: Path, monkeypatch):
    """MEASURED_UNDER_LOAD names a study *and* its `created`: that record is left out of the fit, a rerun of the same
    study (another `created`) is measured again."""
    from lightning_cqk.study.design import cost_calibration

    folder = tmp_path / "toy"
    folder.mkdir()
    _study(folder, {"name": "a-s1", "status": "done", "seconds": 61.5})
    monkeypatch.setattr(cost_calibration, "MEASURED_UNDER_LOAD", {("toy", "2026-11-28T03:00:00+00:00"): "loaded"})
    assert cost_calibration.committed_studies(tmp_path) == []
    monkeypatch.setattr(cost_calibration, "MEASURED_UNDER_LOAD", {("toy", "2026-11-27T03:00:00+00:00"): "loaded"})
    assert [s.study for s in cost_calibration.committed_studies(tmp_path)] == ["toy"]
