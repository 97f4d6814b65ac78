"""A run never deletes what it did not create, and never leaves save_dir (issue 25 class 7), through real `fit`s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_cqk.run_dir import UnsafeRunName, check_run_name_part

REPO = Path(__file__).resolve().parents[2]


def fit(runs: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "lightning_cqk", "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--data.data_dir=/nonexistent/shards", "--data.source=null", "--model.config.n_layer=1",
        "--trainer.accelerator=cpu", "--trainer.max_steps=2", f"--trainer.logger.init_args.save_dir={runs}", *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("value", ["..", ".", "../x", "a/b", "/abs", "a\\b", "x\ny", "\x00"])
def test_unsafe_name_parts_are_refused_with_a_pasteable_fix(value):
    with pytest.raises(UnsafeRunName, match="is not a plain directory name") as refused:
        check_run_name_part(value, "--trainer.logger.init_args.version")
    fix = str(refused.value).split("e.g. --trainer.logger.init_args.version ")[1].split(";")[0]
    check_run_name_part(fix.strip("'"), "--trainer.logger.init_args.version")  # the suggested name passes


@pytest.mark.parametrize("value", [None, "", "run-2", "v1.0", 3, "..hidden"])
def test_plain_names_pass(value):
    check_run_name_part(value, "--trainer.logger.init_args.version")


@pytest.mark.slow
def test_unsafe_run_names_are_refused_and_a_failed_fit_keeps_a_directory_it_did_not_create(tmp_path: Path):
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    victim = tmp_path / "victim_empty"
    victim.mkdir()
    runs = work / "runs"
    refused = fit(runs, work, "--trainer.logger.init_args.version=../../../victim_empty")
    assert refused.returncode != 0 and "is not a plain directory name" in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert victim.is_dir() and not runs.exists(), "refused before anything was created"

    # A pre-existing empty directory named as the run's version: the launch fails (no shards), and the directory,
    # which it did not create, stays (before: removed as "created by this launch").
    own = runs / "quickstart" / "victim"
    own.mkdir(parents=True)
    failed = fit(runs, work, "--trainer.logger.init_args.version=victim")
    assert failed.returncode != 0 and "No token shards" in failed.stderr, failed.stderr[-3000:]
    assert own.is_dir() and not list(own.iterdir()), "left as it was: empty, lock released"
    assert "created by this launch" not in failed.stderr

    # A directory the launch did create is still removed.
    created = fit(runs, work, "--trainer.logger.init_args.version=fresh")
    assert created.returncode != 0 and not (runs / "quickstart" / "fresh").exists(), created.stderr[-2000:]
