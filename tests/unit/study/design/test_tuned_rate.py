"""Tuning parity (lightning_cqk/study/design/tuned_rate.py): a learning-rate grid per mechanism whose choice reads only
the
held-out validation windows, never the windows the verdicts read; the runs of a tuned level start at the choice."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.study.design.spec import SpecError, expand
from lightning_cqk.study.design.tuned_rate import TuningError, choose, held_out_loss
from lightning_cqk.study.results_model import StudyData, TuningTable
from lightning_cqk.study.run.runner import fit_command

REPO = Path(__file__).resolve().parents[4]
VERDICT_WINDOWS = 4 * 8  # limit_val_batches x val_batch_size of the spec below
SPEC = {
    "study": "tuned",
    "baseline": {"attention": "standard"},
    "axes": {
        "attention": {
            "standard": {"model.config.attention": "standard"},
            "coupled": {"model.config.attention": "coupled"},
        }
    },
    "profiles": {
        "paper": {"configs": ["configs/quickstart.yaml"]},
        "cpu": {
            "configs": ["configs/quickstart.yaml"],
            "seeds": [1, 2],
            "overrides": {"trainer.limit_val_batches": 4, "data.val_batch_size": 8},
            "control": {"name": "fewer", "overrides": {"budget.tokens": 1000}, "expect": "higher"},
            "tuning": {
                "axis": "attention",
                "lrs": [1e-3, 2e-3, 4e-3],
                "seed": 0,
                "held_out": [32, 64],
                "overrides": {"trainer.limit_val_batches": 8},
            },
        },
    },
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def _spec(tmp_path: Path, **tuning) -> Path:
    """SPEC with its grid's keys replaced (a key given as None is removed)."""
    spec = json.loads(json.dumps(SPEC))
    spec["profiles"]["cpu"]["tuning"].update(tuning)
    spec["profiles"]["cpu"]["tuning"] = {k: v for k, v in spec["profiles"]["cpu"]["tuning"].items() if v is not None}
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _windows(verdict_part: float, held_part: float) -> dict:
    """val_windows.json of 64 windows: the verdicts' 32 at one loss, the held-out 32 at another."""
    nll = [verdict_part * 100.0] * VERDICT_WINDOWS + [held_part * 100.0] * 32
    return {"step": 10, "nll": nll, "tokens": [100.0] * 64}


def test_the_choice_reads_only_the_held_out_windows():
    # the verdicts' windows would choose 4e-3 (loss 1.0), the held-out ones choose 1e-3: the held-out ones decide
    losses = {
        1e-3: held_out_loss(_windows(3.0, 2.0), [32, 64]),
        2e-3: held_out_loss(_windows(2.0, 2.5), [32, 64]),
        4e-3: held_out_loss(_windows(1.0, 3.0), [32, 64]),
    }
    assert losses[1e-3] == pytest.approx(2.0) and choose(losses) == 1e-3
    poisoned = _windows(float("nan"), 2.0)  # whatever the verdicts' windows hold, they are never read
    assert held_out_loss(poisoned, [32, 64]) == pytest.approx(2.0)
    assert math.isnan(held_out_loss(_windows(1.0, 2.0) | {"nll": [1.0] * 40}, [32, 64]))  # too few windows: no loss
    assert choose({1e-3: math.nan, 2e-3: 5.0}) == 2e-3 and math.isnan(choose({1e-3: math.nan}))


def test_the_grid_expands_and_tuned_runs_wait_for_it(tmp_path: Path):
    sweep = expand(_spec(tmp_path), "cpu", tmp_path / "out")
    tune = [r for r in sweep.runs if r.role == "tuning"]
    assert sorted(r.name for r in tune) == sorted(
        f"tune-{level}-lr{lr}-s0" for level in ("standard", "coupled") for lr in ("0.001", "0.002", "0.004")
    )
    assert all(r.overrides["trainer.limit_val_batches"] == 8 for r in tune)
    coupled = sweep.run("coupled-s1")
    assert coupled.overrides["model.optim.lr"] == "{tuned_lr:coupled}"
    assert sorted(coupled.depends_on) == sorted(r.name for r in tune if r.levels["attention"] == "coupled")
    control = sweep.run("fewer-s1")  # the planted control trains at the baseline's rate
    assert control.overrides["model.optim.lr"] == "{tuned_lr:standard}"
    assert "tune-standard-lr0.001" not in {c for claim in sweep.spec.get("claims", []) for c in claim}
    # launching a tuned run fills the choice in from the grid runs' held-out windows
    for r in tune:
        (sweep.sweep_dir / r.name).mkdir(parents=True)
        held = {0.001: 2.5, 0.002: 2.0, 0.004: 2.2}[r.overrides["model.optim.lr"]]
        verdict = 0.5 if r.overrides["model.optim.lr"] == 0.004 else 3.0  # would pick 4e-3 if it were read
        (sweep.sweep_dir / r.name / "val_windows.json").write_text(json.dumps(_windows(verdict, held)))
    assert "--model.optim.lr=0.002" in fit_command(sweep, coupled)
    (sweep.sweep_dir / "tune-standard-lr0.001-s0" / "val_windows.json").unlink()
    assert "--model.optim.lr=0.002" in fit_command(sweep, control)  # a missing grid run is never chosen
    for lr in ("0.002", "0.004"):
        (sweep.sweep_dir / f"tune-standard-lr{lr}-s0" / "val_windows.json").unlink()
    with pytest.raises(TuningError, match="no learning rate of level 'standard'"):
        fit_command(sweep, control)


def test_a_grid_at_several_seeds_chooses_the_lowest_mean_and_never_a_rate_unstable_at_one_seed(tmp_path: Path):
    """Issue 31's coupling rerun: at one grid seed, standard chose 8e-3 by 0.01% and then varied widely over its 26
    seeds. With `seeds:`, each rate runs at every grid seed, the choice is the lowest mean held-out loss, a rate with
    one seed missing or diverged is never chosen, and the tuned runs wait for every grid run."""
    sweep = expand(_spec(tmp_path, seed=None, seeds=[0, 1000, 1001]), "cpu", tmp_path / "out")
    tune = [r for r in sweep.runs if r.role == "tuning"]
    assert len(tune) == 2 * 3 * 3 and {r.seed for r in tune} == {0, 1000, 1001}
    point = sweep.spec["tuning"]["grid"]["standard"][repr(2e-3)]
    assert point == [f"tune-standard-lr0.002-s{s}" for s in (0, 1000, 1001)] and sweep.spec["tuning"]["seeds"]
    coupled = sweep.run("coupled-s1")
    assert sorted(coupled.depends_on) == sorted(r.name for r in tune if r.levels["attention"] == "coupled")
    # seed 0 alone would choose 4e-3 (2.00 vs 2.01); over the three seeds 4e-3 is unstable: mean 2.40 vs 2.01
    held = {0.001: [2.5, 2.5, 2.5], 0.002: [2.01, 2.0, 2.02], 0.004: [2.0, 2.9, 2.3]}
    for r in tune:
        (sweep.sweep_dir / r.name).mkdir(parents=True)
        loss = held[r.overrides["model.optim.lr"]][[0, 1000, 1001].index(r.seed)]
        (sweep.sweep_dir / r.name / "val_windows.json").write_text(json.dumps(_windows(3.0, loss)))
    assert "--model.optim.lr=0.002" in fit_command(sweep, coupled)
    for lr in ("0.001", "0.002"):  # one seed of 1e-3 and 2e-3 missing: only 4e-3 has every seed
        (sweep.sweep_dir / f"tune-coupled-lr{lr}-s1000" / "val_windows.json").unlink()
    assert "--model.optim.lr=0.004" in fit_command(sweep, coupled)
    # the report's grid table: the mean over the seeds and their sd
    from lightning_cqk.study.judge.group_estimates import tuning_table
    from lightning_cqk.study.report.render import tuning_lines

    runs = [
        {"name": r.name, "heldout_loss": held[r.overrides["model.optim.lr"]][[0, 1000, 1001].index(r.seed)]}
        for r in tune
    ]
    data = StudyData({"spec": sweep.spec}, tuning_runs=runs)
    data.tuning = tuning_table(data)
    assert data.tuning.chosen == {"standard": 2e-3, "coupled": 2e-3}
    text = "\n".join(tuning_lines(data))
    assert "at each of seeds 0, 1000, 1001, chosen by the mean loss" in text
    assert "| 2.0100 ± 0.0100 |" in text and "| 2.4000 ± 0.4583 |" in text


@pytest.mark.parametrize(
    "tuning, message",
    [
        ({"seeds": [0, 1000]}, "one of `seed: 0`"),
        ({"seed": None, "seeds": [0, 2]}, "no verdict run uses"),
        ({"seed": None, "seeds": [0, 0, 5]}, "distinct"),
        ({"seed": None, "seeds": []}, "no verdict run uses"),
    ],
)
def test_bad_grid_seeds_are_refused(tmp_path: Path, tuning: dict, message: str):
    with pytest.raises(SpecError, match=message):
        expand(_spec(tmp_path, **tuning), "cpu", tmp_path / "out")


@pytest.mark.parametrize(
    "tuning, message",
    [
        ({"held_out": [0, 32]}, "overlaps the verdicts' validation windows \\[0, 32\\)"),
        ({"held_out": [16, 64]}, "overlaps"),
        ({"lrs": [1e-3, 2e-3]}, "3 or more"),
        ({"seed": 1}, "no verdict run uses"),
        ({"overrides": {}}, "trainer.limit_val_batches: 8"),
        ({"axis": "size"}, "not an axis"),
    ],
)
def test_a_grid_that_could_read_the_verdicts_windows_is_refused(tmp_path: Path, tuning: dict, message: str):
    with pytest.raises(SpecError, match=message):
        expand(_spec(tmp_path, **tuning), "cpu", tmp_path / "out")


def _lr_control_spec(tmp_path: Path, control: dict, tuned: bool = True, **overrides) -> Path:
    spec = json.loads(json.dumps(SPEC))
    cpu = spec["profiles"]["cpu"]
    cpu["control"] = control
    cpu["overrides"].update(overrides)
    if not tuned:
        del cpu["tuning"]
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_control_at_a_fraction_of_the_tuned_rate_starts_at_the_choice_times_it(tmp_path: Path):
    control = {"name": "half_lr", "overrides": {}, "lr_scale": 0.5, "expect": "higher", "expected_pct": 3.9}
    sweep = expand(_lr_control_spec(tmp_path, control), "cpu", tmp_path / "out")
    run = sweep.run("half_lr-s1")
    assert run.overrides["model.optim.lr"] == "{tuned_lr:standard*0.5}"
    assert sorted(run.depends_on) == sorted(f"tune-standard-lr{lr}-s0" for lr in ("0.001", "0.002", "0.004"))
    assert sweep.spec["control"]["lr_scale"] == 0.5
    for r in (r for r in sweep.runs if r.role == "tuning"):
        (sweep.sweep_dir / r.name).mkdir(parents=True)
        held = {0.001: 2.5, 0.002: 2.2, 0.004: 2.0}[r.overrides["model.optim.lr"]]
        (sweep.sweep_dir / r.name / "val_windows.json").write_text(json.dumps(_windows(3.0, held)))
    assert "--model.optim.lr=0.002" in fit_command(sweep, run)  # 0.5 x the choice 4e-3
    assert "--model.optim.lr=0.004" in fit_command(sweep, sweep.run("standard-s1"))  # the baseline keeps the choice


def test_an_untuned_control_scales_the_stated_rate_or_is_refused(tmp_path: Path):
    control = {"name": "lower_lr", "overrides": {}, "lr_scale": 0.8, "expect": "higher"}
    sweep = expand(_lr_control_spec(tmp_path, control, tuned=False, **{"model.optim.lr": 2e-3}), "cpu", tmp_path / "o")
    assert sweep.run("lower_lr-s1").overrides["model.optim.lr"] == pytest.approx(1.6e-3)
    assert sweep.run("standard-s1").overrides["model.optim.lr"] == 2e-3
    with pytest.raises(SpecError, match="set `model.optim.lr: <rate>` in the profile's overrides"):
        expand(_lr_control_spec(tmp_path, control, tuned=False), "cpu", tmp_path / "o2")


@pytest.mark.parametrize(
    "control, message",
    [
        ({"lr_scale": 1}, "other than 1"),
        ({"lr_scale": -0.5}, "a positive number"),
        ({"lr_scale": "half"}, "a positive number"),
        ({"lr_scale": 0.5, "overrides": {"model.optim.lr": 1e-3}}, "keep one"),
    ],
)
def test_a_bad_lr_scale_is_refused(tmp_path: Path, control: dict, message: str):
    control = {"name": "half_lr", "overrides": {}, "expect": "higher", **control}
    with pytest.raises(SpecError, match=message):
        expand(_lr_control_spec(tmp_path, control), "cpu", tmp_path / "out")


def test_the_report_predicts_an_lr_controls_size_from_the_baselines_own_grid():
    """Δ = exp(L(scale x chosen) - L(chosen)) - 1 on the grid of the level the control's runs scale, L interpolated
    linearly in log(lr) between the grid's held-out losses; a rate outside the grid predicts nothing."""
    from lightning_cqk.study.judge.group_estimates import lr_control_prediction

    rows = [("standard", 2e-3, "a", 2.20), ("standard", 4e-3, "b", 2.10), ("standard", 8e-3, "c", 2.05)]
    rows += [("coupled", 4e-3, "d", 9.0)]  # another level's grid is never read
    spec = {"tuning": {"axis": "attention", "seed": 0}, "metric": "val/ppl", "control": {"group": "half_lr"}}
    runs = [{"name": "half_lr-s1", "group": "half_lr", "overrides": {"model.optim.lr": "{tuned_lr:standard*0.5}"}}]
    runs += [{"name": "coupled-s1", "group": "coupled", "overrides": {"model.optim.lr": "{tuned_lr:coupled}"}}]
    chosen = {"standard": 8e-3, "coupled": 4e-3}
    data = StudyData({"spec": spec, "runs": runs}, tuning=TuningTable(rows, chosen))
    assert lr_control_prediction(data, 0.5).startswith(f"{100 * math.expm1(2.10 - 2.05):+.2f}%")  # a grid point
    mid = 2.20 + (2.10 - 2.20) * math.log(8e-3 * 0.35 / 2e-3) / math.log(2)  # between 2e-3 and 4e-3
    assert lr_control_prediction(data, 0.35).startswith(f"{100 * math.expm1(mid - 2.05):+.2f}%")
    assert lr_control_prediction(data, 0.1) == ""  # 8e-4: below the grid
    spec["metric"] = "val/loss"
    assert lr_control_prediction(data, 0.5).startswith(f"{100 * (2.10 / 2.05 - 1):+.2f}%")
    runs[0]["overrides"]["model.optim.lr"] = "{tuned_lr:coupled*0.5}"  # a control that scales another level's rate
    assert lr_control_prediction(data, 0.5) == ""  # coupled's grid holds one rate: nothing to interpolate


def test_runs_csv_records_a_scaled_controls_rate():
    from lightning_cqk.study.report.results import run_lr

    data = StudyData({}, tuning=TuningTable(chosen={"standard": 4e-3}))
    assert run_lr({"overrides": {"model.optim.lr": "{tuned_lr:standard*0.5}"}}, data) == pytest.approx(2e-3)
    assert run_lr({"overrides": {"model.optim.lr": "{tuned_lr:standard}"}}, data) == pytest.approx(4e-3)
    assert math.isnan(run_lr({"overrides": {"model.optim.lr": "{tuned_lr:coupled*0.5}"}}, data))


def test_auto_scale_solves_the_grid_for_the_target_on_the_low_side_first():
    """Δ(s) = exp(L(s·lr*) - L(lr*)) - 1 equals the target at the returned s, L linear in log(lr) between points
    (hand computation); the high side only when the low side cannot reach it; else the grid end of largest Δ."""
    from lightning_cqk.study.design.tuned_rate import auto_scale, predicted_change

    steep = [(2e-3, 2.20), (4e-3, 2.10), (8e-3, 2.30)]
    s = auto_scale(steep, 4e-3, 4.0, "val/ppl")
    frac = math.log1p(0.04) / (2.20 - 2.10)  # the share of the 4e-3 -> 2e-3 segment that rises by log(1.04)
    assert s == pytest.approx(math.exp(-frac * math.log(2)))  # below 1: a lower rate
    assert 100 * predicted_change(steep, 4e-3, s, "val/ppl") == pytest.approx(4.0)
    flat_below = [(2e-3, 2.105), (4e-3, 2.10), (8e-3, 2.30)]  # +0.5% at half the rate: the high side is used
    s = auto_scale(flat_below, 4e-3, 4.0, "val/ppl")
    assert s > 1 and 100 * predicted_change(flat_below, 4e-3, s, "val/ppl") == pytest.approx(4.0)
    flat = [(2e-3, 2.105), (4e-3, 2.10), (8e-3, 2.11)]  # nowhere +4%: the end with the largest Δ (8e-3)
    assert auto_scale(flat, 4e-3, 4.0, "val/ppl") == pytest.approx(2.0)
    loss = [(2e-3, 2.20), (4e-3, 2.00), (8e-3, 2.50)]  # a loss metric: L(s·lr*) / L(lr*) = 1.04
    s = auto_scale(loss, 4e-3, 4.0, "val/loss")
    assert 100 * predicted_change(loss, 4e-3, s, "val/loss") == pytest.approx(4.0) and s < 1
    with pytest.raises(TuningError, match="cannot be planted"):
        auto_scale([(2e-3, 2.1), (4e-3, 2.1)], 2e-3, 4.0, "val/ppl")  # a tie: no rate is worse than the choice
    gap = [(1e-3, 2.50), (2e-3, math.nan), (4e-3, 2.10), (8e-3, 2.30)]  # 2e-3 diverged: never interpolated across
    s = auto_scale(gap, 4e-3, 4.0, "val/ppl")
    assert s > 1 and 100 * predicted_change(gap, 4e-3, s, "val/ppl") == pytest.approx(4.0)
    assert math.isnan(predicted_change(gap, 4e-3, 0.4, "val/ppl"))  # 1.6e-3 lies next to the diverged rate
    with pytest.raises(TuningError, match="crossing a diverged one"):
        auto_scale([(1e-3, 2.5), (2e-3, math.nan), (4e-3, 2.1)], 4e-3, 4.0, "val/ppl")


def test_an_auto_scaled_control_starts_where_its_grid_predicts_the_target(tmp_path: Path):
    control = {"name": "lower_lr", "overrides": {}, "lr_scale": "auto", "expect": "higher", "expected_pct": 4.0}
    sweep = expand(_lr_control_spec(tmp_path, control), "cpu", tmp_path / "out")
    run = sweep.run("lower_lr-s1")
    assert run.overrides["model.optim.lr"] == "{tuned_lr:standard*auto(4.0)}"
    held = {0.001: 2.3, 0.002: 2.2, 0.004: 2.0}
    for r in (r for r in sweep.runs if r.role == "tuning"):
        (sweep.sweep_dir / r.name).mkdir(parents=True)
        (sweep.sweep_dir / r.name / "val_windows.json").write_text(
            json.dumps(_windows(3.0, held[r.overrides["model.optim.lr"]]))
        )
    lr = 4e-3 * math.exp(-math.log1p(0.04) / 0.2 * math.log(2))  # 4e-3 -> 2e-3 rises by 0.2 nats
    arg = next(a for a in fit_command(sweep, run) if a.startswith("--model.optim.lr="))
    assert float(arg.split("=")[1]) == pytest.approx(lr)
    assert "--model.optim.lr=0.004" in fit_command(sweep, sweep.run("standard-s1"))

    from lightning_cqk.study.judge.group_estimates import lr_control_prediction
    from lightning_cqk.study.report.results import run_lr

    rows = [("standard", lr_, f"tune-{lr_}", loss) for lr_, loss in held.items()]
    spec = {"tuning": {"seed": 0}, "metric": "val/ppl", "control": {"group": "lower_lr"}}
    runs = [
        {"name": "lower_lr-s1", "group": "lower_lr", "overrides": {"model.optim.lr": run.overrides["model.optim.lr"]}}
    ]
    data = StudyData({"spec": spec, "runs": runs}, tuning=TuningTable(rows, {"standard": 4e-3}))
    assert run_lr(runs[0], data) == pytest.approx(lr)  # runs.csv: the rate the run started at
    text = lr_control_prediction(data, None)
    assert text.startswith("+4.00% from the baseline's own learning-rate grid") and "target of +4.00%" in text


@pytest.mark.parametrize(
    "control, tuned, message",
    [
        ({"expected_pct": None}, True, "expected_pct` between 0 and 50"),
        ({"expected_pct": 4.0, "expect": "lower"}, True, "give `expect: higher`"),
        ({"expected_pct": 4.0}, False, "add a `tuning:` block"),
    ],
)
def test_an_auto_scale_without_a_target_or_a_grid_is_refused(tmp_path: Path, control: dict, tuned: bool, message):
    control = {"name": "lower_lr", "overrides": {}, "lr_scale": "auto", "expect": "higher", **control}
    extra = {} if tuned else {"model.optim.lr": 2e-3}
    with pytest.raises(SpecError, match=message):
        expand(_lr_control_spec(tmp_path, control, tuned=tuned, **extra), "cpu", tmp_path / "out")


def test_a_run_that_starts_at_a_grids_choice_hashes_the_grid(tmp_path: Path):
    """Editing the grid (its rates or held-out windows) changes the hash of every run that starts at its choice, so a
    finished run whose rate came from the old grid is refused on resume; runs that no grid sets keep their hash."""
    base = expand(_spec(tmp_path, levels=["coupled"]), "cpu", tmp_path / "out")
    same = expand(_spec(tmp_path, levels=["coupled"]), "cpu", tmp_path / "out")
    rates = expand(_spec(tmp_path, levels=["coupled"], lrs=[1e-3, 2e-3, 8e-3]), "cpu", tmp_path / "out")
    windows = expand(_spec(tmp_path, levels=["coupled"], held_out=[32, 48]), "cpu", tmp_path / "out")
    tuned, untuned = "coupled-s1", "standard-s1"
    assert base.run(tuned).config_hash() == same.run(tuned).config_hash()
    assert base.run(tuned).config_hash() != rates.run(tuned).config_hash()
    assert base.run(tuned).config_hash() != windows.run(tuned).config_hash()
    assert base.run(untuned).config_hash() == rates.run(untuned).config_hash() == windows.run(untuned).config_hash()


def test_the_tuned_rate_placeholder_is_built_and_read_in_tuning_only():
    """Issue 33: the "{tuned_lr:...}" string was built by concatenation in spec.py, read by regex here and tested by
    `startswith` in report_command.py, results.py and adopt.py. tuned_rate.py owns it both ways now, and no other
    module spells
    it."""
    import re
    from pathlib import Path

    from lightning_cqk.study.design.tuned_rate import TunedRate, is_tuned_rate, parse_tuned, tuned_rate

    assert tuned_rate("wikitext") == "{tuned_lr:wikitext}" and parse_tuned(tuned_rate("wikitext")) == TunedRate(
        "wikitext"
    )
    assert parse_tuned(tuned_rate("a", 0.46)) == TunedRate("a", 0.46)
    assert parse_tuned(tuned_rate("a", auto_target_pct=3.0)) == TunedRate("a", auto_target_pct=3.0)
    assert parse_tuned("{tuned_lr:a*auto(3.0)}").text == "{tuned_lr:a*auto(3.0)}"
    assert is_tuned_rate(tuned_rate("a")) and not is_tuned_rate(4e-3) and not is_tuned_rate("4e-3")
    package = Path(__file__).resolve().parents[4] / "lightning_cqk"
    for path in package.rglob("*.py"):
        if path.name == "tuned_rate.py":
            continue
        code = re.sub(r'"""[\s\S]*?"""|#.*', "", path.read_text())  # docstrings and comments may name it
        assert "tuned_lr:" not in code, f"{path.relative_to(package)} spells the placeholder itself"


def test_the_report_reads_the_rate_each_finished_run_recorded(tmp_path: Path):
    """Issue 33: the report recomputed each tuned run's rate from the grid (auto_scale), so a change to how the grid
    chooses would silently rewrite the rates of committed runs. A finished run's rate is now the one it recorded (its
    config.yaml in a sweep, runs.csv in committed results); only a run not yet finished is given its predicted rate."""
    from lightning_cqk.study.report.report_read import recorded_lr
    from lightning_cqk.study.report.results import run_lr

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": {"optim": {"name": "adamw", "lr": 0.0023983}}}))
    assert recorded_lr(tmp_path) == 0.0023983 and math.isnan(recorded_lr(tmp_path / "absent"))
    rows = [("standard", lr, f"tune-{lr}", loss) for lr, loss in {1e-3: 2.3, 2e-3: 2.2, 4e-3: 2.0}.items()]
    data = StudyData({"spec": {"metric": "val/ppl"}}, tuning=TuningTable(rows, {"standard": 4e-3}))
    entry = {"overrides": {"model.optim.lr": "{tuned_lr:standard}"}}
    assert run_lr(entry, data, {"lr": 0.0023983}) == 0.0023983  # recorded: never recomputed from the grid
    assert run_lr(entry, data, None) == pytest.approx(4e-3)  # not finished: what the runner will fill in


def test_a_committed_run_that_waited_only_for_its_grid_can_be_adopted():
    """A tuned run waits for its grid (depends_on), and adopt.index_committed skipped every run with a depends_on,
    so no tuned arm of any study could ever be adopted (the coupling rerun of 2026-11-28 recomputed all 52 coupled and
    MLP runs whose committed twins had the same identity). Only a run that waits for another run's *directory*
    (budget.match_to) is left out now. (The committed corpus runs predate recorded identities (issue 43): every one
    that passes this rule, tuned runs included, reaches the identity check and is named as not recorded.)"""
    from lightning_cqk.study.design.tuned_rate import all_grid_runs
    from lightning_cqk.study.report.results import read_committed
    from lightning_cqk.study.run.adopt import index_committed

    folder = REPO / "docs" / "results" / "corpus"
    if not (folder / "study.json").is_file():
        pytest.skip("no committed corpus results")
    manifest, finished, _ = read_committed(folder)
    grid = all_grid_runs(manifest["spec"].get("tuning"))
    runs = [r for r in manifest["runs"] if r["name"] in finished and not set(r.get("depends_on") or []) - grid]
    tuned = [r for r in runs if r.get("depends_on")]
    assert any(r["name"] == "wikitext-coupled-s2" for r in tuned)
    notes: list[str] = []
    assert index_committed([folder], notes) == {}
    assert notes == [f"{folder}: {len(runs)} finished runs have no recorded identity (committed before identities "
                     "were recorded): not adopted"]  # fmt: skip
