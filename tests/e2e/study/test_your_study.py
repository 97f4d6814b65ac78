"""A study of your own backend (issue 42 item 5): `new-study` writes a spec that dry-runs with its power plan; a spec
names its profiles freely; a run shorter than its validation interval is not refused (every fit validates its last
step); `--confirm` (make ablations) prints the estimate and asks before an
hour-long study from a terminal."""

from __future__ import annotations

import sys

import pytest
import yaml
from tiny_run import QUICKSTART

from lightning_cqk.cli.main import main
from lightning_cqk.study.design.new_study import new_study_command
from lightning_cqk.study.design.spec import expand
from lightning_cqk.study.run import runner


def micro_spec(tmp_path, steps: int = 6, val_every: int = 3, profile: str = "tiny"):
    overrides = {
        "data.seq_len": 16,
        "data.batch_size": 2,
        "model.config.n_layer": 1,
        "budget.tokens": steps * 2 * 16,
        "trainer.val_check_interval": val_every,
    }
    spec = {
        "study": "micro",
        "metric": "val/ppl",
        "baseline": {"arm": "standard"},
        "axes": {"arm": {name: {"model.config.attention": name} for name in ("standard", "differential")}},
        "profiles": {profile: {"configs": [str(QUICKSTART)], "seeds": [1, 2], "overrides": overrides}},
    }
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_spec_names_its_profiles_freely(tmp_path):
    sweep = expand(micro_spec(tmp_path, profile="laptop"), "laptop", tmp_path / "out")
    assert len(sweep.runs) == 4
    with pytest.raises(Exception, match="no profile 'cpu'; profiles: laptop"):
        expand(micro_spec(tmp_path, profile="laptop"), "cpu", tmp_path / "out")


def test_a_run_shorter_than_its_validation_interval_still_validates_its_last_step(tmp_path, capsys):
    """Every fit validates its last step (callbacks/final_validation.py, issue 45 item 9), so a spec whose runs are
    shorter than the quickstart's validation interval is no longer refused: it has a metric to report."""
    spec = micro_spec(tmp_path, steps=6, val_every=100)
    main(["sweep", str(spec), "--profile", "tiny", "--output", str(tmp_path / "out"), "--dry-run"])
    assert "would end without a validation" not in capsys.readouterr().err


def test_new_study_writes_a_spec_that_dry_runs_with_its_power_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    source = 'arXiv 2510.00000: "parity", said the paper'
    new_study_command(["mine", "--attention", "differential", "--effect", "-2.5", "--source", source])
    spec = yaml.safe_load((tmp_path / "mine.yaml").read_text())
    assert list(spec["axes"]["arm"]) == ["standard", "differential"] and spec["claims"][0]["expect"] == "lower"
    assert spec["paper"] == source and spec["claims"][0]["published"] == {
        "value": -2.5,
        "unit": "byte_ppl",
        "note": source,
    }
    capsys.readouterr()
    monkeypatch.chdir(QUICKSTART.parents[1])  # the spec's configs/ paths are the repository's
    main(["sweep", str(tmp_path / "mine.yaml"), "--output", str(tmp_path / "out"), "--dry-run"])
    out = capsys.readouterr().out
    assert "differential-vs-standard                  26 seeds  E -2.50%" in out and "6 seeds would detect 2.50%" in out
    assert "control-lower_lr" in out and "about" in out  # the planted control, and the time
    with pytest.raises(SystemExit, match="exists; give another --output"):
        new_study_command(["mine", "--attention", "differential", "--output", str(tmp_path / "mine.yaml")])
    with pytest.raises(SystemExit, match="Unknown attention backend 'difrential'"):
        new_study_command(["other", "--attention", "difrential", "--output", str(tmp_path / "other.yaml")])


def test_confirm_prints_the_estimate_and_asks_before_an_hour_long_study(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    new_study_command(["mine", "--attention", "differential"])
    monkeypatch.chdir(QUICKSTART.parents[1])
    sweep = expand(tmp_path / "mine.yaml", "cpu", tmp_path / "out")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    # the template's 78 runs are estimated under an hour since the estimate's calibration (issue 43): a threshold
    # under their estimate, so that this study is a long one here
    monkeypatch.setattr(runner, "CONFIRM_MINUTES", 20)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    with pytest.raises(SystemExit, match="not started"):
        runner.confirm_start(sweep, 2)
    assert "78 runs (0 done before: skipped), about" in capsys.readouterr().out
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    runner.confirm_start(sweep, 2)  # confirmed: returns
    short = expand(micro_spec(tmp_path), "tiny", tmp_path / "out2")
    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail("asked for a short study"))
    runner.confirm_start(short, 1)
