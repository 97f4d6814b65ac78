"""`lightning_cqk report`: its numbers equal the TensorBoard scalars they come from (statistics against scipy),
unfinished and diverged runs are named and never scored, and its figures are small PNGs with plain labels."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from torch.utils.tensorboard import SummaryWriter

from lightning_cqk.cli import main
from lightning_cqk.downstream.glue_table import FORMAT
from lightning_cqk.study.report.render import code_line
from lightning_cqk.study.report.report_command import report_command, write_report
from lightning_cqk.study.report.report_read import unfinished_reason
from lightning_cqk.study.run.run_scalars import read_scalars

# final val/ppl per seed (the last of three validations); the curve before it is arbitrary
FINAL = {"base": [20.5, 21.25, 19.75], "var": [18.0, 18.5, 19.75], "half": [26.0, 27.5, 26.5]}
RESUMED = 22.0  # base-s1's final val/ppl as re-logged by its resumed attempt (the value the report must use)
EXPECTED = {"base": [RESUMED, 21.25, 19.75], "var": FINAL["var"], "half": FINAL["half"]}
STEPS = (10, 20, 30)
TOKENS_PER_STEP = 512


def f32(x: float) -> float:
    return float(np.float32(x))  # TensorBoard stores scalars as float32


LOG_EVERY = 10  # train/tokens_seen is logged on logging steps (LitLM), train/loss at every step


def _write_run(
    run_dir: Path, group: str, seed: int, final: float, steps=STEPS, budget_steps: int = STEPS[-1] + 1
) -> None:
    """A finished run of `budget_steps` optimizer steps (its last validation, after the last step, is logged at
    step index budget_steps - 1, as a real run's is)."""
    with SummaryWriter(str(run_dir)) as w:
        for step in range(budget_steps):
            w.add_scalar("train/loss", 3.0 + 0.25 * math.sin(step * seed) - step / 100.0, step, walltime=500.0 + step)
            if (step + 1) % LOG_EVERY == 0 or step == budget_steps - 1:
                w.add_scalar("train/tokens_seen", (step + 1) * TOKENS_PER_STEP, step, walltime=500.0 + step)
        for i, step in enumerate(steps):
            ppl = final + 10.0 * (len(steps) - 1 - i) + seed
            ppl = final if step == steps[-1] else ppl
            w.add_scalar("val/ppl", ppl, step, walltime=1000.0 + step)
            w.add_scalar("val/bpb", math.log2(ppl) / 3.0 if math.isfinite(ppl) else ppl, step, walltime=1000.0 + step)
            w.add_scalar("train/grad_norm/total", 1.0 / (i + 1) + seed, step, walltime=1000.0 + step)
            w.add_scalar("train/spikes", 0.0, step, walltime=1000.0 + step)
    budget = {"tokens": budget_steps * TOKENS_PER_STEP, "flops": 3.0e9 * seed, "wallclock": 10.0 * seed + 1.0}
    (run_dir / "budget.json").write_text(
        json.dumps({**budget, "steps": budget_steps, "tokens_per_step": TOKENS_PER_STEP})
    )


SPEC = {
    "study": "toy",
    "title": "Toy study",
    "metric": "val/ppl",
    "baseline": {"arm": "base"},
    "published": {"source": "a paper", "values": {"base": 10.0, "var": 9.0}, "deltas": {}},
    "claims": [{"name": "var-helps", "group": "var", "vs": "base", "expect": "lower", "published_pct": -10.0}],
    "control": {"name": "control-half", "group": "half", "vs": "base", "expect": "higher"},
    "claims_not_in_profile": ["needs-a-level-cpu-leaves-out"],
}


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    sweep = tmp_path / "toy-cpu"
    runs = []
    for group, finals in FINAL.items():
        for seed, final in enumerate(finals, start=1):
            name = f"{group}-s{seed}"
            runs.append({"name": name, "group": group, "seed": seed, "levels": {"arm": group}})
            _write_run(sweep / name, group, seed, final)
    runs.append({"name": "var-s4", "group": "var", "seed": 4, "levels": {"arm": "var"}})  # never ran
    # var-s5 was killed during its final validation: its last validation (step 20) is not its last step (30)
    runs.append({"name": "var-s5", "group": "var", "seed": 5, "levels": {"arm": "var"}})
    _write_run(sweep / "var-s5", "var", 5, 5.0, steps=(10, 20), budget_steps=30)
    # base-s1 was killed after its last validation and resumed: the resumed attempt re-logged step 30 (last wins)
    with SummaryWriter(str(sweep / "base-s1"), filename_suffix=".resumed") as w:
        w.add_scalar("val/ppl", RESUMED, 30, walltime=5000.0)
    (sweep / "manifest.json").write_text(json.dumps({"study": "toy", "profile": "cpu", "spec": SPEC, "runs": runs}))
    return sweep


def test_read_scalars_keeps_the_last_write_of_a_step(sweep_dir: Path):
    scalars = read_scalars(sweep_dir / "base-s1")
    assert [s for s, _ in scalars["val/ppl"]] == list(STEPS)
    assert scalars["val/ppl"][-1][1] == RESUMED


def test_table_numbers_equal_the_scalars(sweep_dir: Path, capsys):
    paths = write_report(sweep_dir)
    rows = {r["group"]: r for r in csv.DictReader(paths["csv"].open())}
    base = [f32(x) for x in EXPECTED["base"]]
    var = [f32(x) for x in EXPECTED["var"]]
    for group, values in (("base", base), ("var", var)):
        row = rows[group]
        assert int(row["seeds"]) == 3 and int(row["diverged"]) == 0
        assert float(row["val/ppl_mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert float(row["val/ppl_std"]) == pytest.approx(statistics.stdev(values), rel=1e-12)
        # base-s1's resumed attempt re-logged only val/ppl at step 30: its bpb stays the first attempt's
        bpb = [f32(math.log2(v) / 3.0) for v in FINAL[group]]
        assert float(row["val/bpb_mean"]) == pytest.approx(statistics.fmean(bpb), rel=1e-6)
        assert float(row["tokens"]) == (STEPS[-1] + 1) * TOKENS_PER_STEP
        assert float(row["flops"]) == pytest.approx(3.0e9 * 2)  # mean over seeds 1, 2, 3
        assert float(row["wallclock"]) == pytest.approx(21.0)
    var_row = rows["var"]
    ref = stats.ttest_rel(np.log(var), np.log(base))  # paired by seed, on the log metric
    assert var_row["test"] == "paired t" and float(var_row["p"]) == pytest.approx(ref.pvalue, rel=1e-9)
    geo = math.exp(statistics.fmean(np.log(var)) - statistics.fmean(np.log(base)))
    assert float(var_row["delta_pct"]) == pytest.approx(100 * (geo - 1), rel=1e-9)
    assert float(var_row["ci_low_pct"]) < float(var_row["delta_pct"]) < float(var_row["ci_high_pct"])
    assert float(var_row["published_delta_pct"]) == pytest.approx(-10.0)
    # the last 20% of training: from step 20 (<= 0.8 x 30) to 30; var-s1: 18 + 10 + 1 -> 18
    moved = statistics.fmean([100 * (f32(v) / f32(v + 10.0 + s) - 1) for s, v in enumerate(FINAL["var"], start=1)])
    assert float(var_row["settle_pct"]) == pytest.approx(moved, rel=1e-6)
    assert math.isnan(float(rows["base"]["p"])) and rows["base"]["baseline"] == "base"
    out = capsys.readouterr().out
    assert "| var | 3 |" in out and "(baseline)" in out and "var-s4" in out  # the missing run is named
    assert "var-s5: last validation after step 21, training ended at step 30" in out  # unfinished: named, left out
    assert f"{statistics.fmean(var):.2f} ± {statistics.stdev(var):.2f}" in paths["markdown"].read_text()
    claims = {r["claim"]: r for r in csv.DictReader(paths["claims"].open())}
    assert claims["control-half"]["control"] == "True" and claims["control-half"]["verdict"] == "detected"
    assert "Control `half`" in out and "detected (one-sided p" in out and "outside the family" in out
    assert "Not tested at this profile (a group it leaves out): needs-a-level-cpu-leaves-out." in out


def test_nan_and_inf_seeds_are_reported_as_diverged(sweep_dir: Path, capsys):
    for seed, bad in ((2, float("nan")), (3, float("inf"))):
        with SummaryWriter(str(sweep_dir / f"var-s{seed}"), filename_suffix=".diverged") as w:
            w.add_scalar("val/ppl", bad, 30, walltime=9000.0)
    paths = write_report(sweep_dir)  # never raises
    rows = {r["group"]: r for r in csv.DictReader(paths["csv"].open())}
    assert int(rows["var"]["diverged"]) == 2 and float(rows["var"]["val/ppl_mean"]) == f32(18.0)
    assert rows["var"]["test"] == "" or math.isnan(float(rows["var"]["p"]))  # one finite pair: no test
    out = capsys.readouterr().out
    assert "Diverged" in out and "var-s2" in out and "var-s3" in out
    claims = {r["claim"]: r for r in csv.DictReader(paths["claims"].open())}
    assert claims["var-helps"]["verdict"] in ("inconclusive", "void")


def test_unfinished_reason():
    assert unfinished_reason({"val/ppl": [(10, 5.0)]}, {}, "val/ppl").startswith("no budget.json")
    assert unfinished_reason({}, {"steps": 10}, "val/ppl") == "no val/ppl logged"
    assert unfinished_reason({"val/ppl": [(8, 5.0)]}, {"steps": 10}, "val/ppl") == (
        "last validation after step 9, training ended at step 10"
    )
    assert unfinished_reason({"val/ppl": [(9, 5.0)]}, {"steps": 10}, "val/ppl") == ""  # logged at index 9 = step 10


def test_figures_are_small_pngs_and_say_when_there_were_no_spikes(sweep_dir: Path):
    paths = write_report(sweep_dir, quiet=True)
    for name in ("val_curves", "delta_curves", "stability", "ppl_vs_tokens"):
        data = paths[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5000 < len(data) < 300_000, name


def test_log_axis_labels_are_plain_numbers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_cqk.study.report.figures import _plain

    fig, ax = plt.subplots()
    ax.plot([1, 2], [12.0, 48.0])
    ax.set_yscale("log")
    _plain(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    plt.close(fig)
    assert labels and all("times" not in t and "^" not in t for t in labels), labels
    assert "20" in labels


def test_report_command_errors_clearly(tmp_path: Path):
    with pytest.raises(SystemExit, match="no manifest.json"):
        main(["report", str(tmp_path)])


def _glue_json(acc: float, checkpoint: str) -> dict:
    entry = {"status": "ok", "metrics": {"acc": {"mean": acc, "std": 0.0, "per_seed": [acc]}}, "score": acc}
    table = {"checkpoint": checkpoint, "tasks": {"rte": entry}, "average": acc, "average_over": ["rte"]}
    return {"format": FORMAT, **table}


def test_report_puts_glue_tables_side_by_side(sweep_dir: Path, tmp_path: Path, capsys):
    """glue.json files of the sweep's checkpoints, and of checkpoints named by --glue, become one GLUE section."""
    own = sweep_dir / "base-s1" / "checkpoints"
    own.mkdir(parents=True)
    (own / "glue.json").write_text(json.dumps(_glue_json(0.5, str(own / "last.ckpt"))))
    other = tmp_path / "elsewhere" / "coupled-tiny-s1" / "checkpoints"
    other.mkdir(parents=True)
    (other / "glue.json").write_text(json.dumps(_glue_json(0.625, str(other / "last.ckpt"))))

    report_command([str(sweep_dir), "--glue", str(other / "glue.json")])
    printed = capsys.readouterr().out
    assert "## GLUE" in printed
    assert "| RTE (acc) | 50.0 | 62.5 |" in printed
    glue_md = (sweep_dir / "report" / "glue.md").read_text()
    assert "| RTE (acc) | 50.0 | 62.5 |" in glue_md
    assert "| RTE (acc) |" in (sweep_dir / "report" / "toy.md").read_text()
    # report/ itself is never searched: a second report finds the same two tables, not a copy of them
    report_command([str(sweep_dir), "--glue", str(other / "glue.json")])
    assert capsys.readouterr().out.count("| RTE (acc) |") == 1


def test_validation_sampling_error_of_the_set_and_of_a_difference(sweep_dir: Path, capsys):
    """The windows' own difficulty dominates the set's error but cancels in a same-seed difference."""
    rng = np.random.default_rng(0)
    difficulty = rng.normal(0.0, 0.3, size=200)  # per-window loss offsets shared by every model
    for group, finals in FINAL.items():
        for seed, final in enumerate(finals, start=1):
            noise = rng.normal(0.0, 0.01, size=200)
            nll = [(math.log(final) + d + e) * 256.0 for d, e in zip(difficulty, noise, strict=True)]
            (sweep_dir / f"{group}-s{seed}" / "val_windows.json").write_text(
                json.dumps({"step": 30, "nll": nll, "tokens": [256.0] * 200})
            )
    paths = write_report(sweep_dir)
    rows = {r["group"]: r for r in csv.DictReader(paths["csv"].open())}
    paired = float(rows["var"]["val_se_delta_pct"])
    assert 0.05 < paired < 0.2  # ~ 100 x 0.01 x sqrt(2) / sqrt(200) = 0.1%
    out = capsys.readouterr().out
    own = float(out.split("Validation-set sampling error: ±")[1].split("%")[0])
    assert own == pytest.approx(100 * 0.3 / math.sqrt(200), rel=0.2)  # ~2.1%: the set alone, far above the paired


def test_csv_numbers_are_plain_numbers_even_from_numpy(tmp_path: Path):
    """numpy 2's repr of a float64 is `np.float64(0.5)`: a CSV cell must read back with float()."""
    from lightning_cqk.study.report.render import CSV_FIELDS, _cell, to_csv

    assert _cell(np.float64(0.625)) == "0.625" and _cell(math.nan) == "nan" and _cell("x") == "x"
    text = to_csv([{CSV_FIELDS[0]: np.float64(1.5)}])
    assert next(csv.DictReader(text.splitlines()))[CSV_FIELDS[0]] == "1.5"


def test_the_code_line_names_every_revision_the_runs_were_made_by():
    a, b = "a" * 40, "b" * 40
    done = lambda *revs: {"status": "done", "revisions": list(revs)}  # noqa: E731
    assert code_line({"runs": [done(a), done(a)]}) == f"Code: git {a[:12]}."
    assert code_line({"runs": [done(a + "-dirty")]}) == f"Code: git {a[:12]} (dirty)."
    mixed = code_line({"runs": [done(a), done(a), done(b), done(a, b), {"status": "done"}]})
    assert "more than one revision" in mixed
    assert f"{a[:12]}: 2 runs" in mixed and f"{b[:12]}: 1 run;" in mixed
    assert f"{a[:12]} then {b[:12]}: 1 run" in mixed and "not recorded: 1 run" in mixed
    # a sweep written before runs recorded their revision: the manifest's, said as such
    old = code_line({"git": {"revision": a, "dirty": False}, "runs": [{"status": "done"}]})
    assert old.startswith(f"Code: git {a[:12]}") and "record no revision" in old
    assert code_line({"runs": []}) == ""
    # outside a git checkout the runs say so, never a made-up "git unknown"
    assert code_line({"runs": [done("unknown")]}).startswith("Code: unknown (not a git checkout")


def test_a_contrast_claim_is_labelled_with_its_groups_in_brackets(sweep_dir: Path):
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    contrast = {"name": "gap", "plus": ["var", "base"], "minus": ["half", "base"], "expect": "lower"}
    manifest["spec"]["claims"].append(contrast)
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    text = write_report(sweep_dir)["markdown"].read_text()
    assert "| gap: (var + base) − (half + base) |" in text


def test_the_papers_notes_are_said_once_or_per_claim(sweep_dir: Path):
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    claims = manifest["spec"]["claims"]
    claims[0]["published_note"] = "60M, WikiText-103"
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    text = write_report(sweep_dir)["markdown"].read_text()
    assert "The paper's side, per claim: var-helps: 60M, WikiText-103." in text
    claims.append({"name": "var-same", "group": "var", "vs": "base", "expect": "same", "margin_pct": 50.0})
    claims[-1]["published_note"] = "direction only"
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    text = write_report(sweep_dir)["markdown"].read_text()
    assert "The paper's side, per claim: var-helps: 60M, WikiText-103; var-same: direction only." in text


def test_report_from_the_committed_files_alone_equals_the_report_from_the_runs(sweep_dir: Path, tmp_path: Path):
    """`report docs/results/<study>` reads runs.csv, curves.csv, study.json and val_windows.json only, and writes the
    same Markdown and CSVs as the report from the run directories (which are deleted first)."""
    import shutil

    rng = np.random.default_rng(1)
    for group, finals in FINAL.items():
        for seed in range(1, len(finals) + 1):
            nll = list(rng.normal(2.0, 0.1, size=20) * 256.0)
            (sweep_dir / f"{group}-s{seed}" / "val_windows.json").write_text(
                json.dumps({"step": 30, "nll": nll, "tokens": [256.0] * 20})
            )
    results = tmp_path / "results" / "toy"
    first = write_report(sweep_dir, results, quiet=True)
    assert {"runs.csv", "curves.csv", "study.json", "val_windows.json"} <= {p.name for p in results.iterdir()}
    before = {name: (results / name).read_text() for name in ("toy.md", "toy.csv", "claims.csv")}
    runs = {r["run"]: r for r in csv.DictReader((results / "runs.csv").open())}
    assert runs["base-s1"]["status"] == "done" and float(runs["base-s1"]["val_ppl"]) == f32(RESUMED)
    assert runs["var-s4"]["status"] == "not started" and "training ended at step 30" in runs["var-s5"]["status"]
    shutil.rmtree(sweep_dir)  # nothing but the committed files from here on
    for name in before:
        (results / name).unlink()
    second = write_report(results, quiet=True)
    assert second["markdown"] == results / "toy.md" and set(first) >= set(second) - {"runs.csv"}
    for name, text in before.items():
        assert (results / name).read_text() == text, name
    assert "var-s4" in before["toy.md"] and "Validation-set sampling error: ±" in before["toy.md"]


def test_results_written_by_the_old_code_say_what_to_regenerate(tmp_path: Path):
    old = tmp_path / "docs" / "results" / "coupling"
    old.mkdir(parents=True)
    (old / "claims.csv").write_text("claim\n")
    with pytest.raises(SystemExit, match="lightning_cqk report runs/coupling-cpu --output .*coupling"):
        report_command([str(old)])


def _another_study(sweep_dir: Path, results: Path, keep: list[str], edit=None) -> None:
    """results/toy: the toy study's report; results/other: a study whose runs.csv holds only the `keep` runs of it,
    each passed through `edit`."""
    import shutil

    write_report(sweep_dir, results / "toy", quiet=True)
    shutil.copytree(results / "toy", results / "other")
    with open(results / "other" / "runs.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["run"] in keep]
    for row in rows:
        if edit:
            edit(row)
    with open(results / "other" / "runs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_runs_shared_with_another_study_are_named(sweep_dir: Path, tmp_path: Path):
    """Two studies that ran the same run (the same config hash) name it in both reports."""

    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    for run in manifest["runs"]:
        run["config_hash"] = f"hash-{run['name']}"
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    results = tmp_path / "results"
    _another_study(sweep_dir, results, ["base-s2"])  # the other study shares base-s2 only
    text = write_report(results / "toy", quiet=True)["markdown"].read_text()
    assert "Runs shared with other studies (identical configs, overrides and seed" in text
    assert "other: base-s2." in text


def test_runs_with_the_same_results_under_another_name_are_named(sweep_dir: Path, tmp_path: Path):
    """A run of another study with another config hash (its level has another name) but the same seed, rate,
    tokens, steps and final validation loss to the last digit is named as the same run; one digit off is not."""

    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    for run in manifest["runs"]:
        run["overrides"] = {"model.optim.lr": 1e-3}
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    results = tmp_path / "results"

    def rename(row: dict[str, str]) -> None:  # another level name, hence another config hash
        row["config_hash"], row["run"] = "another-hash", row["run"].replace("base", "standard-B")
        if row["run"] == "standard-B-s1":  # base-s1's twin is one float away: not the same
            row["val_ppl"] = repr(math.nextafter(float(row["val_ppl"]), math.inf))

    _another_study(sweep_dir, results, ["base-s1", "base-s2"], rename)
    text = write_report(results / "toy", quiet=True)["markdown"].read_text()
    assert "Runs with the same results as another study's runs under another name" in text
    assert "other: base-s2 = standard-B-s2." in text and "base-s1 = " not in text


# ---------------------------------------------------------------------- issue 34: hostile report inputs (delta)
@pytest.fixture
def committed(sweep_dir: Path, tmp_path: Path, monkeypatch) -> Path:
    """results/toy: the toy sweep's committed report (figures left out for time), the sweep directory deleted."""
    import shutil

    import lightning_cqk.study.report.figures

    monkeypatch.setattr(lightning_cqk.study.report.figures, "figures", lambda *args, **kwargs: [])
    results = tmp_path / "results" / "toy"
    write_report(sweep_dir, results, quiet=True)
    shutil.rmtree(sweep_dir)
    return results


def _refused_report(folder: Path) -> str:
    """`lightning_cqk report FOLDER`'s one-paragraph refusal; the folder's files are left as they were."""
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}
    with pytest.raises(SystemExit) as refused:
        main(["report", str(folder)])
    message = str(refused.value.code)
    assert message.startswith("lightning_cqk report: ") and "\n" not in message, message
    assert before == {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}
    return message


def _edit_rows(path: Path, edit) -> None:
    """Rewrite a committed CSV with `edit(rows)` applied to its rows (dicts)."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, list(reader)
    edit(rows)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _set(run: str, column: str, value: str):
    def edit(rows: list[dict[str, str]]) -> None:
        next(r for r in rows if r["run"] == run)[column] = value

    return edit


def test_two_runs_with_one_seed_in_a_group_are_refused_naming_both(sweep_dir: Path, tmp_path: Path):
    """Issue 34 defect 5: base-s2 hand-edited to seed 1 (as in a merged folder) made the report keep one of the two
    base runs of seed 1 and drop the other silently; now both are named, from the run directories and from the
    committed files alike."""
    results = tmp_path / "results" / "toy"
    write_report(sweep_dir, results, quiet=True)
    for path in (sweep_dir / "manifest.json", results / "study.json"):
        manifest = json.loads(path.read_text())
        next(r for r in manifest["runs"] if r["name"] == "base-s2")["seed"] = 1
        path.write_text(json.dumps(manifest))
        message = _refused_report(path.parent)
        assert f"{path}: runs base-s1 and base-s2 of group base both have seed 1" in message, message
        assert "remove one of the two runs" in message


@pytest.mark.parametrize(
    "edit, words",
    [
        (_set("base-s2", "val_ppl", "-8.4"), "line 3: run base-s2's val_ppl is '-8.4', but its last val/ppl in "),
        (_set("var-s1", "val_ppl", "1e308"), "run var-s1's val_ppl is '1e308', but its last val/ppl in curves.csv"),
        (lambda rows: rows.append(dict(rows[1])), "lines 3 and 13: two rows for run base-s2"),
        (
            _set("half-s1", "group", '=HYPERLINK("http://example.com","x")'),
            "run half-s1's group is '=HYPERLINK(\"http://example.com\",\"x\")', but study.json gives 'half'",
        ),
        (_set("var-s2", "status", "failed"), "has curves of run var-s2, which runs.csv does not list as done"),
    ],
    ids=["negative ppl", "1e308", "duplicated row", "formula group", "a finished run hidden"],
)
def test_a_runs_csv_that_disagrees_with_the_curves_is_refused(committed: Path, edit, words: str):
    """Issue 34 defect 11: runs.csv was copied into the new report unchanged while the verdicts came from
    curves.csv; now the two (and study.json) must agree."""
    _edit_rows(committed / "runs.csv", edit)
    message = _refused_report(committed)
    assert words in message, message
    assert f"git checkout -- {committed / 'runs.csv'}" in message


def test_two_values_at_one_step_of_curves_csv_are_refused_not_sorted(committed: Path):
    lines = (committed / "curves.csv").read_text().splitlines(keepends=True)
    changed = lines[1].replace(lines[1].rsplit(",", 1)[1], "12.5\n")  # base-s1's val/ppl at step 10, another value
    (committed / "curves.csv").write_text("".join([*lines, changed]))
    message = _refused_report(committed)
    assert f"curves.csv, lines 2 and {len(lines) + 1}: two values of val/ppl for run base-s1 at step 10" in message


def test_a_final_perplexity_of_1e300_is_named_not_an_overflow(committed: Path):
    """Issue 34 defect 12: a committed final val/ppl of 1e300 (in runs.csv and curves.csv alike) raised
    OverflowError inside the statistics; no run can log it (TensorBoard stores float32)."""
    curves = (committed / "curves.csv").read_text()
    old = f"base-s2,val/ppl,{STEPS[-1]},{f32(21.25)!r}\n"
    assert old in curves
    (committed / "curves.csv").write_text(curves.replace(old, old.replace(repr(f32(21.25)), "1e+300")))
    _edit_rows(committed / "runs.csv", _set("base-s2", "val_ppl", "1e+300"))
    message = _refused_report(committed)
    assert "val/ppl of run base-s2 at step 30 is 1e+300, which no run can have logged (a logged value is at most " \
        "3.4e+38, the largest float32" in message  # fmt: skip


def test_curves_csv_linked_to_a_system_file_is_named_not_a_key_error(committed: Path):
    """Issue 34 defect 12: curves.csv as a symbolic link to /etc/passwd raised KeyError('run')."""
    (committed / "curves.csv").unlink()
    (committed / "curves.csv").symlink_to("/etc/passwd")
    message = _refused_report(committed)
    assert f"{committed / 'curves.csv'} is a symbolic link to /etc/passwd; the committed results" in message
    assert f"rm {committed / 'curves.csv'}" in message


def test_curves_csv_with_other_columns_is_named(committed: Path):
    (committed / "curves.csv").write_text("root:x:0:0:root:/root:/bin/bash\n")
    message = _refused_report(committed)
    assert (
        "curves.csv is not the curves.csv a report writes: its first line is 'root:x:0:0:root:/root:/bin/bash'"
        in message
    )


@pytest.mark.parametrize("lock", [".sweep.lock", "status/base-s1.lock"], ids=["whole sweep", "array task"])
def test_a_report_while_the_sweep_runs_says_it_is_of_a_live_sweep(sweep_dir: Path, lock: str, monkeypatch, capsys):
    """Issue 34 defect 13: a report written while a sweep still ran in its directory read like a final one. Now its
    Markdown says, under the title, that it is an interim report of a live sweep (the process holding the sweep's
    lock, or an array task's run lock), and how to write it again; once the sweep has ended, nothing is said."""
    import subprocess
    import sys

    import lightning_cqk.study.report.figures

    monkeypatch.setattr(lightning_cqk.study.report.figures, "figures", lambda *args, **kwargs: [])
    path = sweep_dir / lock
    hold = "import sys, time; from lightning_cqk.run.lock import acquire; acquire(sys.argv[1], name=sys.argv[2]); "
    hold += "print('held', flush=True); time.sleep(120)"
    sweep = subprocess.Popen(
        [sys.executable, "-c", hold, str(path.parent), path.name], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    try:
        assert sweep.stdout.readline().strip() == "held"
        text = write_report(sweep_dir, quiet=True)["markdown"].read_text()
        title, blank, note = text.splitlines()[:3]
        assert title.startswith("## Toy study") and blank == ""
        assert note.startswith(f"**Interim report of a live sweep:** a sweep is still running in {sweep_dir} (pid ")
        assert f"pid {sweep.pid} on host" in note and "9 of its 11 runs have finished" in note
        assert note.endswith(f"Write the report again when the sweep has ended: `lightning_cqk report {sweep_dir}`.")
    finally:
        sweep.kill()
        sweep.wait()
    assert "live sweep" not in write_report(sweep_dir, quiet=True)["markdown"].read_text()


def test_the_report_and_the_claims_table_print_a_published_number_with_one_function():
    """Issue 33: the report printed `+6.6 (token PPL)` and the README's claims table `+6.6% token PPL` from two
    formatters. Both now call render.published_cell; the table only adds E."""
    from lightning_cqk.study.report.claims_table import _published
    from lightning_cqk.study.report.render import published_cell

    nan = float("nan")
    assert published_cell("lower", -6.6, nan, "token_ppl") == "-6.6% token PPL"
    assert published_cell("more_variance", nan, 8.0, "") == "var ×8"
    assert published_cell("token_multiplier", nan, 2.4, "") == "×2.4 tokens"
    assert published_cell("lower", nan, nan, "") == "–"
    row = {"expect": "lower", "published_pct": "-6.6", "published_unit": "token_ppl", "converted_pct": "-1.49"}
    assert _published(row) == "-6.6% token PPL → E -1.49%"
    assert _published({"expect": "more_variance", "published_ratio": "8", "converted_pct": "7"}) == "var ×8"
