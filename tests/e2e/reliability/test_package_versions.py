"""Each attempt of a run records the versions of the packages it ran with (run.json `packages`), and a sweep
resumed under other versions says so, as it does for code revisions (issue 26)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from tiny_run import tiny_fit

from lightning_cqk.cli import main
from lightning_cqk.run import version_records as pv
from lightning_cqk.study.design.spec import expand
from lightning_cqk.study.run.runner import Ledger

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's dependency
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[3]
PROFILES = ("cpu", "paper")


def _requirement_names(requirements: list[str]) -> set[str]:
    from packaging.requirements import Requirement

    return {Requirement(r).name.lower().replace("_", "-") for r in requirements}


def test_the_recorded_packages_are_the_direct_dependencies_of_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = _requirement_names(project["dependencies"])
    declared |= _requirement_names(project["optional-dependencies"]["eval"] + project["optional-dependencies"]["data"])
    assert set(pv.DIRECT_DEPENDENCIES) == declared
    versions = pv.package_versions()
    for name in ("python", "torch", "lightning", "litdata", "numpy", "scipy", "jsonargparse", "tiktoken"):
        assert versions[name], f"{name} is installed but recorded as {versions[name]!r}"


def test_differences_name_each_changed_package_and_ignore_unknown_ones():
    old = {"python": "3.11.9", "torch": "2.12.0", "numpy": "2.4.6", "lm-eval": None, "lightning-cqk": "0.1.0"}
    new = {"python": "3.11.9", "torch": "2.13.0", "numpy": "2.4.6", "lm-eval": "0.4.13", "scipy": "1.17.1"}
    assert pv.differences(old, new) == {"lm-eval": (None, "0.4.13"), "torch": ("2.12.0", "2.13.0")}
    assert pv.describe_difference(old, new) == "lm-eval not installed -> 0.4.13, torch 2.12.0 -> 2.13.0"
    assert pv.describe_difference(new, new) == ""


def _fit_args(shards: Path, runs: Path) -> list[str]:
    return tiny_fit(
        shards, runs, "--trainer.max_steps=2", "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=1"
    )


def test_each_attempt_of_run_json_records_its_package_versions(tiny_shards: Path, tmp_path: Path, monkeypatch):
    runs = tmp_path / "runs"
    main(_fit_args(tiny_shards, runs))
    (run_dir,) = (runs / "quickstart").iterdir()
    first = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert first[0]["packages"] == pv.package_versions()
    assert first[0]["revision"] == pv.code_revision(), "the code revision too (issue 33)"

    # The same run continued after an upgrade: the second attempt records the versions it really ran with.
    upgraded = {**pv.package_versions(), "torch": "99.0.0"}
    monkeypatch.setattr("lightning_cqk.run.directory.package_versions", lambda: upgraded)
    main([*_fit_args(tiny_shards, runs), "--trainer.max_steps=3", "--ckpt_path=last"])
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert [a["packages"]["torch"] for a in attempts] == [pv.package_versions()["torch"], "99.0.0"]


def test_a_sweep_resumed_under_other_package_versions_says_which_changed(tmp_path: Path, monkeypatch, capsys):
    spec = {
        "study": "mini",
        "metric": "val/ppl",
        "baseline": {"arm": "ref"},
        "axes": {
            "arm": {"ref": {"model.config.attention": "standard"}, "other": {"model.config.attention": "coupled"}}
        },
        "profiles": {p: {"configs": [str(REPO / "configs" / "quickstart.yaml")], "seeds": [1]} for p in PROFILES},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    sweep = expand(tmp_path / "spec.yaml", "cpu", tmp_path / "out")
    ledger = Ledger(sweep)
    ref, other = sweep.runs
    now = pv.package_versions()
    ledger.set_status(ref, status="done", config_hash=ref.config_hash(), packages=[now])
    assert ledger.mixed_packages(sweep.runs) is None
    older = {**now, "torch": "2.0.0", "numpy": "1.0.0"}
    ledger.set_status(other, status="running", packages=[older])
    note = ledger.mixed_packages(sweep.runs)
    assert note is not None
    assert f"numpy 1.0.0 -> {now['numpy']}, torch 2.0.0 -> {now['torch']} (1 runs)" in note and "--output" in note


@pytest.mark.parametrize("recorded", [[], [{"torch": "2.0.0"}]])
def test_a_launch_adds_this_environment_to_the_runs_packages(tmp_path: Path, monkeypatch, recorded):
    from lightning_cqk.study.run import runner

    spec = {
        "study": "mini",
        "metric": "val/ppl",
        "baseline": {"arm": "ref"},
        "axes": {"arm": {"ref": {}, "other": {"model.config.attention": "coupled"}}},
        "profiles": {p: {"configs": [str(REPO / "configs" / "quickstart.yaml")], "seeds": [1]} for p in PROFILES},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    sweep = expand(tmp_path / "spec.yaml", "cpu", tmp_path / "out")
    ledger = Ledger(sweep)
    ledger.set_status(sweep.runs[0], packages=recorded)

    monkeypatch.setattr(runner, "fit_command", lambda *args: [sys.executable, "-c", "pass"])  # launch no run
    launch = runner._Launch(ledger, sweep.runs[0], None)
    launch.proc.wait()
    launch.log.close()
    launch.lock.release()
    assert ledger.status(sweep.runs[0])["packages"] == [*recorded, pv.package_versions()]


def test_the_code_revision_is_the_checkouts_commit(tmp_path: Path):
    """`revision` in run.json: HEAD of the checkout the package is imported from, `-dirty` with uncommitted changes
    to tracked files; `unknown` where no checkout tracks the package."""
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the package is not in a git checkout here")
    assert pv.code_revision().removesuffix("-dirty") == head.stdout.strip()
    assert pv.git_revision(tmp_path) == {"revision": None, "dirty": None}, "not a checkout"
