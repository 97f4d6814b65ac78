"""Issue 45 items 2 and 3: every runs.csv number that a verdict, a grid choice or a control reads is recomputed from a
second committed source (curves.csv, val_windows.json, study.json's grid), and a runs.csv that disagrees with it is
refused naming the file and line. Before, only the final validation columns were checked: an edited stability,
held-out loss, learning rate, tokens or steps column went into the verdicts and the published runs.csv unnoticed.

Delta over test_report.py's toy sweep (its run directories and committed folder, reused here): the edits."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import test_report
from test_report import _edit_rows, _refused_report

from lightning_cqk.cli import main

sweep_dir, committed = test_report.sweep_dir, test_report.committed  # the toy sweep and its committed report

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


def _copy(study: str, tmp_path: Path) -> Path:
    """A copy of the committed docs/results/<study> (siblings left out: the edits are refused before they are read)."""
    if not (RESULTS / study / "study.json").is_file():
        pytest.skip(f"no committed {study} results")
    return Path(shutil.copytree(RESULTS / study, tmp_path / "results" / study))


def _line(path: Path, run: str) -> int:
    """The line of `run`'s row in a runs.csv (the header is line 1)."""
    with open(path, newline="") as handle:
        return next(i for i, row in enumerate(csv.DictReader(handle), start=2) if row["run"] == run)


def _scale(runs: list[str], column: str, factor: float):
    def edit(rows: list[dict[str, str]]) -> None:
        for row in rows:
            if row["run"] in runs:
                row[column] = repr(float(row[column]) * factor)

    return edit


def _put(run: str, column: str, value: str):
    def edit(rows: list[dict[str, str]]) -> None:
        next(r for r in rows if r["run"] == run)[column] = value

    return edit


QUACK = [f"mha-lr3e-2-quack-s{seed}" for seed in range(1, 7)]


@pytest.mark.parametrize(
    "study, run, edit, words",
    [
        (
            "logit_control",
            "mha-lr3e-2-quack-s1",
            _put("mha-lr3e-2-quack-s1", "spikes", "3.0"),
            "run mha-lr3e-2-quack-s1's spikes is '3.0', but its last train/spikes in curves.csv is 0.0",
        ),
        (
            "corpus",  # the grid then chose 0.001 for runs that trained at 0.004, and the control's lr_scale moved
            "tune-standard-lr0.001-s0",
            _put("tune-standard-lr0.001-s0", "heldout_loss", "2.0"),
            "run tune-standard-lr0.001-s0's heldout_loss is '2.0', but its windows 1024-1183 in val_windows.json "
            "give 2.1791926309466363",
        ),
        (
            "corpus",
            "wikitext-standard-s1",
            _put("wikitext-standard-s1", "lr", "0.001"),
            "run wikitext-standard-s1's lr is '0.001', but its rate {tuned_lr:standard} in study.json is 0.004 "
            "(the grid's choice from the held-out losses)",
        ),
        (
            "logit_control",
            "mha-lr3e-2-default-s2",
            _put("mha-lr3e-2-default-s2", "tokens", "512000"),
            "run mha-lr3e-2-default-s2's tokens is '512000', but its last train/tokens_seen in curves.csv (step "
            "499, its last step) is 256000",
        ),
        (
            "logit_control",
            "mha-lr3e-2-default-s2",
            _put("mha-lr3e-2-default-s2", "steps", "250"),
            "run mha-lr3e-2-default-s2's steps is '250', but its last validation in curves.csv is at step index "
            "499, after 500 steps",
        ),
        (
            "logit_control",  # the control's predicted size went from +13.23% to +2.02%
            "mha-lr3e-2-default-s1",
            _put("mha-lr3e-2-default-s1", "tokens_per_step", "4096"),
            "run mha-lr3e-2-default-s1's tokens_per_step is '4096', but its train/tokens_seen in curves.csv is "
            "(step + 1) x 512 at each of its ",
        ),
    ],
    ids=["spikes", "heldout_loss", "lr", "tokens", "steps", "tokens_per_step"],
)
def test_an_edited_committed_number_is_refused_naming_file_and_line(study, run, edit, words, tmp_path: Path):
    """Each trigger of issue 45 items 2-3 on a copy of the committed results: `report` exited 0 and published it."""
    folder = _copy(study, tmp_path)
    runs = folder / "runs.csv"
    _edit_rows(runs, edit)
    message = _refused_report(folder)
    assert f"{runs}, line {_line(runs, run)}: {words}" in message, message
    assert f"git checkout -- {runs}" in message


def _held_out(manifest: dict) -> None:
    manifest["spec"]["tuning"]["held_out"] = ["a", 1184]


def _rate(manifest: dict) -> None:
    manifest["runs"][0]["overrides"]["model.optim.lr"] = "abc"


@pytest.mark.parametrize(
    "edit, words",
    [
        (_held_out, "its grid's held_out ['a', 1184] is not the [first, end) of the held-out windows"),
        (_rate, "run tune-standard-lr0.001-s0's model.optim.lr 'abc' is not a learning rate"),
    ],
    ids=["held_out", "rate"],
)
def test_a_study_json_that_cannot_be_a_source_is_named_not_a_traceback(edit, words: str, tmp_path: Path):
    """The sources themselves are read as untrusted: a held-out range or a rate in study.json that is not one."""
    import json

    folder = _copy("corpus", tmp_path)
    manifest = json.loads((folder / "study.json").read_text())
    edit(manifest)
    (folder / "study.json").write_text(json.dumps(manifest))
    message = _refused_report(folder)
    assert f"{folder / 'study.json'}: {words}. Put back the file the report wrote" in message, message


def test_a_run_never_started_relabelled_done_is_refused(committed: Path):
    """var-s4 never started (no curves); marked done with its numbers left nan it entered the verdicts as a diverged
    seed of var."""
    runs = committed / "runs.csv"
    _edit_rows(runs, _put("var-s4", "status", "done"))
    message = _refused_report(committed)
    assert f"{runs}, line {_line(runs, 'var-s4')}: run var-s4 is listed as done, but curves.csv holds no " in message


def test_late_loss_sd_is_recomputed_from_the_committed_late_train_loss(committed: Path):
    """Issue 45's critical trigger (late_loss_sd_pct of one arm's rows x 0.45 reversed a verdict), on a report that
    commits the late train-loss window in curves.csv."""
    with open(committed / "curves.csv", newline="") as handle:
        assert any(row["tag"] == "train/loss" for row in csv.DictReader(handle))
    runs = committed / "runs.csv"
    _edit_rows(runs, _scale(["var-s1", "var-s2", "var-s3"], "late_loss_sd_pct", 0.45))
    message = _refused_report(committed)
    assert f"{runs}, line {_line(runs, 'var-s1')}: run var-s1's late_loss_sd_pct is " in message, message
    assert "the sd of its late train/loss in curves.csv" in message


def test_a_run_whose_late_train_loss_was_removed_is_refused(committed: Path):
    """Deleting a run's train/loss rows (its late sd's source) is not a folder without a source: refused by name."""
    curves = committed / "curves.csv"
    lines = curves.read_text().splitlines(keepends=True)
    curves.write_text("".join(line for line in lines if not line.startswith("var-s2,train/loss,")))
    message = _refused_report(committed)
    assert f"{committed / 'runs.csv'}, line {_line(committed / 'runs.csv', 'var-s2')}: run var-s2's " in message
    assert "curves.csv holds no train/loss of this run" in message, message


def test_a_run_adopted_from_a_folder_without_train_loss_is_read_and_named(committed: Path, capsys, monkeypatch):
    """A sweep that adopted runs from one of the folders committed before train/loss was (sweep --adopt) commits
    them without their late train loss: its folder is read, and the report names them as unchecked."""
    import json

    import lightning_cqk.study.report.figures

    monkeypatch.setattr(lightning_cqk.study.report.figures, "figures", lambda *args, **kwargs: [])
    curves = committed / "curves.csv"
    lines = curves.read_text().splitlines(keepends=True)
    curves.write_text("".join(line for line in lines if not line.startswith("var-s2,train/loss,")))
    manifest = json.loads((committed / "study.json").read_text())
    next(r for r in manifest["runs"] if r["name"] == "var-s2").update(adopted_from="old/toy#var-s2", probe="var-s1")
    (committed / "study.json").write_text(json.dumps(manifest))
    main(["report", str(committed)])
    out = capsys.readouterr().out
    assert f"Note: late_loss_sd_pct of {committed / 'runs.csv'}, 1 run (var-s2): no second source" in out


def test_every_committed_report_reads_without_a_refusal():
    """The nine committed folders agree with their second sources (what the checks read)."""
    from lightning_cqk.study.report.results import read_committed

    folders = sorted(p.parent for p in RESULTS.glob("*/study.json"))
    if not folders:
        pytest.skip("no committed study results")
    for folder in folders:
        read_committed(folder)


def test_the_issue_trigger_on_the_committed_logit_control(tmp_path: Path, capsys, monkeypatch):
    """Issue 45's trigger as filed: late_loss_sd_pct of the six mha-lr3e-2-quack rows x 0.45 turned
    quack-steadier-mha from +39.8% 'not replicated' to -37.1% 'inconclusive', exit 0 and no word. A logit_control
    folder whose curves.csv holds the late train loss refuses it naming the line. The one committed at issue 45 holds
    none (its runs' event files were never committed; all nine folders are so): its late sd has no second source, so
    `report` reads it as recorded and says so, naming the claims that read it and the commands that give it one."""
    import lightning_cqk.study.report.figures

    monkeypatch.setattr(lightning_cqk.study.report.figures, "figures", lambda *args, **kwargs: [])
    folder = _copy("logit_control", tmp_path)
    runs = folder / "runs.csv"
    _edit_rows(runs, _scale(QUACK, "late_loss_sd_pct", 0.45))
    if "train/loss" in (folder / "curves.csv").read_text():  # regenerated from its runs since issue 45
        message = _refused_report(folder)
        assert f"{runs}, line {_line(runs, QUACK[0])}: run {QUACK[0]}'s late_loss_sd_pct is " in message, message
        return
    main(["report", str(folder)])
    out = capsys.readouterr().out
    assert f"Note: late_loss_sd_pct of {runs}, all 30 runs: no second source" in out, out[-2000:]
    assert "unchecked, by the claims quack-steadier-mha, quack-steadier-than-qk-clip." in out
    assert "lightning_cqk sweep configs/ablations/logit_control.yaml --profile cpu, then lightning_cqk report " in out


def _row(run: str, **values: str) -> dict[str, str]:
    from lightning_cqk.study.report.results import RUN_FIELDS

    row = dict.fromkeys(RUN_FIELDS, "nan")
    row.update(run=run, status="done", **values)
    return row


@pytest.mark.parametrize(
    "counts, per_step, refused",
    [
        ([(3, 2048.0), (7, 4096.0)], "512", False),
        ([(3, 2048.0), (7, 4096.0)], "256", True),
        ([(3, 2048.0), (7, 3072.0)], "256", False),
    ],
    ids=["one rate", "another rate", "no one rate: resumed at another"],
)
def test_tokens_per_step_is_the_one_rate_of_the_logged_token_counts(counts, per_step: str, refused: bool):
    """A token control's predicted size reads tokens_per_step; the counts give it back unless the rate changed."""
    from lightning_cqk.study.report.second_sources import disagreements

    scalars = {"a-s1": {"val/loss": [(9, 2.0)], "train/tokens_seen": counts}}
    tokens = str(int(counts[-1][1]) + 2 * int(per_step))
    rows = [(2, _row("a-s1", steps="10", tokens=tokens, tokens_per_step=per_step, val_loss="2.0"))]
    found = [what for _, what in disagreements(rows, scalars, {}, {"runs": [], "spec": {}})]
    why = "but its train/tokens_seen in curves.csv is (step + 1) x 512 at each of its 2 steps"
    expected = [f"run a-s1's tokens_per_step is '256', {why}"] if refused else []
    assert [w for w in found if "tokens_per_step" in w] == expected


@pytest.mark.parametrize("tokens, refused", [("5120", False), ("5000", True)])
def test_tokens_after_the_last_logged_count_are_whole_steps_at_the_recorded_rate(tokens: str, refused: bool):
    """train/tokens_seen is logged on logging steps only: a run whose last step is not one recomputes its tokens as
    the last count plus the steps after it at tokens_per_step (8 x 512 at step 7, then 2 steps: 5120)."""
    from lightning_cqk.study.report.second_sources import disagreements

    scalars = {"a-s1": {"val/loss": [(9, 2.0)], "train/tokens_seen": [(3, 2048.0), (7, 4096.0)]}}
    rows = [(2, _row("a-s1", steps="10", tokens=tokens, tokens_per_step="512", val_loss="2.0"))]
    found = list(disagreements(rows, scalars, {}, {"runs": [], "spec": {}}))
    why = "but its last train/tokens_seen in curves.csv (4096 at step 7) and 2 more steps of 512 tokens give 5120"
    assert found == ([(2, f"run a-s1's tokens is '5000', {why}")] if refused else [])


def test_the_grid_runs_windows_are_committed_even_when_all_would_be_too_many(tmp_path: Path, monkeypatch):
    """val_windows.json is left out when it would hold more than MAX_WINDOW_VALUES numbers; the grid runs' windows
    (the held-out losses' source, which the grid's choice and the tuned rates are recomputed from) stay."""
    import json

    from lightning_cqk.study.report import results
    from lightning_cqk.study.results_model import Group, StudyData

    monkeypatch.setattr(results, "MAX_WINDOW_VALUES", 10)
    spec = {"tuning": {"grid": {"std": {"0.002": "tune-std-lr0.002-s0"}}, "held_out": [0, 2]}}
    manifest = {"study": "toy", "spec": spec, "runs": []}
    runs = []
    for name, group in (("tune-std-lr0.002-s0", "tune-std-lr0.002"), ("std-s1", "std")):
        manifest["runs"].append({"name": name, "group": group, "seed": int(name[-1]), "overrides": {}})
        windows = {"nll": [1.0, 2.0, 3.0, 4.0], "tokens": [4.0] * 4}
        runs.append({"name": name, "scalars": {}, "budget": {}, "windows": windows, "stability": {}})
    data = StudyData(manifest, groups={"std": Group(runs=runs[1:])}, tuning_runs=runs[:1])
    results.write_committed(data, tmp_path)
    kept = json.loads((tmp_path / "val_windows.json").read_text())
    assert kept == {"tokens": {"*": [4.0] * 4}, "nll": {"tune-std-lr0.002-s0": [1.0, 2.0, 3.0, 4.0]}}


def test_what_a_report_commits_is_what_its_checks_recompute_from(tmp_path: Path):
    """A finished run whose last spike count and token count were logged before its last step (logging every 10
    steps, 31 steps, validations at 10 and 30) and whose late train loss holds a nan: the committed curves keep those
    last counts and the late window, so the folder the report wrote reads back with the same numbers."""
    import math

    from lightning_cqk.study.judge.group_estimates import run_stability
    from lightning_cqk.study.report.results import read_committed, write_committed
    from lightning_cqk.study.results_model import Group, StudyData

    scalars = {
        "val/loss": [(10, 2.5), (30, 2.0)],
        "val/ppl": [(10, math.exp(2.5)), (30, math.exp(2.0))],
        "val/bpb": [(10, 3.6), (30, 2.9)],
        "train/spikes": [(9, 1.0), (29, 3.0)],
        "train/tokens_seen": [(9, 5120.0), (19, 10240.0), (29, 15360.0)],
        "train/loss": [(s, math.nan if s == 27 else 3.0 - s / 50 + (s % 3) / 10) for s in range(31)],
    }
    manifest = {"study": "toy", "spec": {}, "runs": [{"name": "a-s1", "group": "a", "seed": 1, "levels": {}}]}
    manifest["runs"][0]["overrides"] = {"model.optim.lr": 0.002}
    budget = {"tokens": 31 * 512, "steps": 31, "tokens_per_step": 512}
    run = {"name": "a-s1", "seed": 1, "scalars": scalars, "budget": budget, "windows": None, "lr": 0.002}
    run["stability"] = run_stability(scalars)
    write_committed(StudyData(manifest, groups={"a": Group({}, [run])}), tmp_path)
    _, finished, _ = read_committed(tmp_path)
    assert finished["a-s1"]["stability"] == run["stability"] and finished["a-s1"]["budget"]["tokens"] == 31 * 512
    assert finished["a-s1"]["scalars"]["train/spikes"][-1] == (29, 3.0)
    assert [s for s, _ in finished["a-s1"]["scalars"]["train/loss"]] == list(range(24, 31))  # from 0.8 x 30


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '{"tokens": {"*": [1]}, "nll": {"a-s1": ["x"]}}'])
def test_a_val_windows_json_that_is_not_one_is_named_not_a_traceback(text: str, tmp_path: Path):
    """The held-out losses' source is read as untrusted too: `[1, 2]` was an AttributeError traceback."""
    folder = _copy("logit_control", tmp_path)
    (folder / "val_windows.json").write_text(text)
    message = _refused_report(folder)
    assert f"{folder / 'val_windows.json'} is not the val_windows.json a report writes" in message, message
