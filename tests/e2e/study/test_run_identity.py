"""No run computed twice (issue 31 item 2): a run is identified by its resolved training configuration, not by its
levels' names; a sweep computes one run per identity and the others share its numbers; a sibling sweep's finished
run (same code, packages and device) is reused, and equals a fresh run to the last digit.

Delta over tests/e2e/study/test_runner.py's tiny spec: two levels that resolve to the same configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_runner import _write_spec

from lightning_cqk.study.design.spec import expand
from lightning_cqk.study.judge.group_estimates import group_values
from lightning_cqk.study.report import figures
from lightning_cqk.study.report.report_command import write_report
from lightning_cqk.study.report.report_read import collect
from lightning_cqk.study.run import identity as identity_module
from lightning_cqk.study.run.identity import canonical_key, settings_digest, settings_of
from lightning_cqk.study.run.runner import Ledger, run_local


def _twin_spec(tmp: Path) -> Path:
    """The runner test's spec, its `other` arm made `ref` again under another name and another spelling
    (`data.init_args.batch_size`, a console-only key), and the run-killing arm left out."""
    path = _write_spec(tmp)
    spec = yaml.safe_load(path.read_text())
    arms = spec["axes"]["arm"]
    arms.pop("matched")
    arms["twin"] = {
        "model.config.attention": "standard",
        "data.init_args.batch_size": 2,
        "trainer.enable_model_summary": True,
    }
    arms.pop("other")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_two_levels_with_other_names_and_the_same_resolved_configuration_are_one_run(tmp_path: Path):
    sweep = expand(_twin_spec(tmp_path), "cpu", str(tmp_path / "out"))
    ledger = Ledger(sweep)
    ref, twin = sweep.run("ref-s1"), sweep.run("twin-s1")
    assert ref.config_hash() != twin.config_hash()  # what the names and spellings used to make two runs of
    assert ledger.identity(ref).digest == ledger.identity(twin).digest
    assert len(ledger.identity(ref).digest) == 64  # the full sha256
    assert canonical_key("data.init_args.batch_size") == "data.batch_size"
    base = dict(ref.overrides)

    def digest(overrides, seed):
        return settings_digest(settings_of(ref.configs, overrides, seed))

    assert digest(base, 2) != digest(base, 1)  # the seed is the run
    assert digest({**base, "model.optim.lr": 1e-3}, 1) != digest(base, 1)
    moved = {**base, "trainer.logger.init_args.save_dir": "/elsewhere"}
    assert digest(moved, 1) == digest(base, 1)  # where it writes: not the run
    settings = settings_of(ref.configs, base, 1)
    assert settings["data.batch_size"] == 2 and not any(k.startswith("trainer.logger") for k in settings)


@pytest.mark.slow
def test_a_sweep_computes_one_run_per_identity_and_a_sibling_sweep_reuses_it(tmp_path: Path, monkeypatch):
    """One real sweep (jobs 2: the twin waits for ref, in flight, then shares it), then the same spec into a sibling
    directory under the same code revision (reused: nothing computed), then under another revision (computed fresh:
    equal to the last digit)."""
    spec = _twin_spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # --jobs 2 and --jobs 1 give their runs one thread alike

    first = expand(spec, "cpu", str(tmp_path / "runs" / "first"))
    result = run_local(first, jobs=2)
    assert sorted(result["done"]) == ["ref-s1", "twin-s1"] and not result["failed"]
    status = {p.stem: json.loads(p.read_text()) for p in (first.sweep_dir / "status").glob("*.json")}
    assert status["twin-s1"]["same_as"] == "ref-s1" and status["twin-s1"]["identity"] == status["ref-s1"]["identity"]
    assert not (first.sweep_dir / "twin-s1").exists(), "the twin was computed"
    assert status["ref-s1"]["device"].startswith("cpu: ")
    data = collect(first.sweep_dir)
    values = group_values(data, "val/ppl")
    assert values["twin"] == values["ref"]  # the same run, read once from ref's directory

    second = expand(spec, "cpu", str(tmp_path / "runs" / "second"))
    result = run_local(second, jobs=1)
    status = {p.stem: json.loads(p.read_text()) for p in (second.sweep_dir / "status").glob("*.json")}
    assert status["ref-s1"]["reused_from"] == str((first.sweep_dir / "ref-s1").resolve())
    assert status["twin-s1"].get("same_as") == "ref-s1" or status["twin-s1"].get("reused_from")
    assert not any(p.is_dir() and p.name.endswith("-s1") for p in second.sweep_dir.iterdir()), "recomputed"
    assert group_values(collect(second.sweep_dir), "val/ppl") == values
    monkeypatch.setattr(figures, "figures", lambda *args, **kwargs: [])
    write_report(second.sweep_dir, quiet=True)
    markdown = (second.sweep_dir / "report" / "mini.md").read_text()
    assert (
        "Runs not computed here" in markdown
        and "2 reused" in markdown
        and f"ref-s1 = {first.sweep_dir / 'ref-s1'}" in markdown
    )

    other_code = {"revision": "1" * 40, "files": {}}  # other code: no reuse, a fresh run
    monkeypatch.setattr(identity_module, "checkout_code", lambda: other_code)
    third = expand(spec, "cpu", str(tmp_path / "runs" / "third"))
    run_local(third, jobs=1)
    assert (third.sweep_dir / "ref-s1" / "budget.json").is_file()
    fresh = group_values(collect(third.sweep_dir), "val/ppl")
    assert fresh["ref"] == values["ref"]  # a reused run equals a fresh run to the last digit


def _one_arm_spec(tmp: Path) -> Path:
    """The runner test's spec with one arm (ref) at seeds 1 and 2: seed 1 is the probe, seed 2 is adopted."""
    path = _write_spec(tmp)
    spec = yaml.safe_load(path.read_text())
    spec["axes"]["arm"] = {"ref": spec["axes"]["arm"]["ref"]}
    spec["profiles"]["cpu"]["seeds"] = [1, 2]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.slow
def test_committed_runs_are_adopted_only_after_the_probe_reproduces_them(tmp_path: Path, monkeypatch):
    """A sweep, its committed results (report --output), then the same spec with --adopt: the probe (seed 1) runs and
    reproduces its twin, so seed 2 is adopted (not computed) and the report reads it from the committed files. With
    the committed probe's final values altered (consistently in runs.csv and curves.csv), nothing is adopted."""
    import csv
    import shutil

    spec = _one_arm_spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setattr(figures, "figures", lambda *args, **kwargs: [])
    first = expand(spec, "cpu", str(tmp_path / "runs" / "first"))
    assert not run_local(first, jobs=1)["failed"]
    committed = tmp_path / "results" / "mini"
    write_report(first.sweep_dir, output=committed, quiet=True)
    values = group_values(collect(committed), "val/ppl")

    # in another folder than the first sweep's: a sibling sweep's runs would be reused before any adoption
    second = expand(spec, "cpu", str(tmp_path / "adopting" / "second"))
    run_local(second, jobs=1, adopt=[tmp_path / "results"])
    status = {p.stem: json.loads(p.read_text()) for p in (second.sweep_dir / "status").glob("*.json")}
    assert status["ref-s1"]["reproduces"] is True and (second.sweep_dir / "ref-s1" / "budget.json").is_file()
    assert status["ref-s2"]["adopted_from"] == f"{committed}#ref-s2" and status["ref-s2"]["probe"] == "ref-s1"
    with (committed / "runs.csv").open() as handle:  # the code that made an adopted run's numbers is its twin's
        made_by = next(row["code_revision"] for row in csv.DictReader(handle) if row["run"] == "ref-s2")
    assert made_by and status["ref-s2"]["revisions"] == made_by.split()
    assert not (second.sweep_dir / "ref-s2").exists(), "an adopted run was computed"
    assert group_values(collect(second.sweep_dir), "val/ppl") == values  # equal to the last digit
    write_report(second.sweep_dir, quiet=True)
    assert "ref-s2 = " in (second.sweep_dir / "report" / "mini.md").read_text()

    altered = tmp_path / "altered" / "mini"
    shutil.copytree(committed, altered)
    for name, column in (("runs.csv", "val_loss"), ("curves.csv", "value")):
        rows = list(csv.DictReader((altered / name).open()))
        for row in rows:  # the probe's twin ends 1e-6 away (every final value it reports, consistently)
            if row.get("run") == "ref-s1" and (name == "runs.csv" or row["tag"] == "val/loss"):
                last = name == "runs.csv" or int(row["step"]) == max(
                    int(r["step"]) for r in rows if r["run"] == "ref-s1"
                )
                row[column] = repr(float(row[column]) + 1e-6) if last else row[column]
        with (altered / name).open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    third = expand(spec, "cpu", str(tmp_path / "not-adopting" / "third"))
    run_local(third, jobs=1, adopt=[altered])
    status = {p.stem: json.loads(p.read_text()) for p in (third.sweep_dir / "status").glob("*.json")}
    assert status["ref-s1"]["reproduces"] is False and "adopted_from" not in status["ref-s2"]
    assert (third.sweep_dir / "ref-s2" / "budget.json").is_file(), "the arm is computed when the probe differs"


def test_a_diverged_probe_reproducing_a_diverged_twin_adopts_nothing(tmp_path: Path, monkeypatch):
    """nan == nan as text: without the finiteness check a diverged probe would vouch for its arm's other twins."""
    from lightning_cqk.study.run import adopt, run_scalars

    nan, loss, ppl = float("nan"), 2.0742690563201904, 7.958
    twin = adopt.CommittedRun(tmp_path, "ref-s1", "x", loss, ppl)
    scalars = {"val/loss": [(499, loss)], "val/ppl": [(499, ppl)]}
    monkeypatch.setattr(run_scalars, "read_scalars", lambda *args, **kwargs: scalars)
    assert adopt.reproduces(tmp_path, twin)
    assert not adopt.reproduces(tmp_path, adopt.CommittedRun(tmp_path, "ref-s1", "x", loss + 1e-9, ppl))
    scalars = {"val/loss": [(499, nan)], "val/ppl": [(499, nan)]}
    assert not adopt.reproduces(tmp_path, adopt.CommittedRun(tmp_path, "ref-s1", "x", nan, nan))
