"""`lightning_cqk sweep` / `make ablations` say where they are: each running run's step / total and eta, read from
its log's progress lines, and the study's eta (issue 26)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_cqk.study.design.spec import expand
from lightning_cqk.study.run import runner
from lightning_cqk.study.run.runner import Ledger, Progress, run_progress

REPO = Path(__file__).resolve().parents[3]
LINE = "step {0}/1000 ({1}%) | 9.1 step/s | elapsed 0:00:44 | eta 0:01:39 | train/loss=2.310\n"


def test_the_last_progress_line_of_a_log_gives_step_total_and_eta(tmp_path: Path):
    log = tmp_path / "run.log"
    assert run_progress(log) is None  # no log yet
    log.write_text("# command\nSeed set to 1\n")
    assert run_progress(log) is None  # no progress line yet
    log.write_text("x" * 20000 + LINE.format(100, 10) + "validation: " + LINE.format(400, 40) + "Epoch 0: noise\n")
    assert run_progress(log) == (400, 1000, "0:01:39")
    log.write_text("step 7/20 (35%)\n")
    assert run_progress(log) == (7, 20, None)


@pytest.fixture
def coupling(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(REPO)
    return expand(REPO / "configs" / "ablations" / "coupling.yaml", "cpu", tmp_path / "out")


def test_progress_lines_name_each_running_run_and_the_study_eta(coupling, tmp_path: Path, capsys, monkeypatch):
    ledger = Ledger(coupling)
    runs = coupling.runs
    progress = Progress(ledger, list(runs), jobs=2)
    assert set(progress.estimates) == {r.name for r in runs}
    a, b = runs[0], runs[1]
    ledger.log_dir.mkdir(parents=True)
    (ledger.log_dir / f"{a.name}.log").write_text(LINE.format(500, 50))
    running = [SimpleNamespace(run=a, start=time.perf_counter()), SimpleNamespace(run=b, start=time.perf_counter())]
    todo = list(runs[2:])
    line = progress.line(todo, running, finished=set(), failed=set())
    assert line.startswith(f"[sweep] progress: 0/{len(runs)} runs finished; ")
    assert f"{a.name} step 500/1000 eta 0:01:39" in line and f"{b.name} starting" in line
    expected = (sum(progress.estimates[r.name] for r in todo) + progress.estimates[b.name]) / 2
    expected += progress.estimates[a.name] * 0.5 / 2
    assert f"study eta {runner._clock(expected)}" in line

    # a finished run that took twice its estimate doubles the rest
    progress.measured.append((2 * progress.estimates[a.name], progress.estimates[a.name]))
    slower = progress.line(todo, running, finished={"x"}, failed={"y"})
    assert f"study eta {runner._clock(2 * expected)}" in slower and f"2/{len(runs)} runs finished (1 failed)" in slower

    # printed at most every PROGRESS_SECONDS, and only while runs are in flight
    monkeypatch.setattr(runner, "PROGRESS_SECONDS", 0.0)
    progress.maybe_print(todo, [], set(), set())
    assert capsys.readouterr().out == ""
    progress.maybe_print(todo, running, set(), set())
    assert "[sweep] progress:" in capsys.readouterr().out


def test_a_run_resumed_from_its_checkpoint_counts_only_its_remaining_steps_in_the_study_eta(coupling, tmp_path: Path):
    """Issue 35 item 3: after a resume, the study's eta counted a resumed run as a full one."""
    import torch

    from lightning_cqk.study.design.cost_estimate import estimate_runs

    ledger = Ledger(coupling)
    runs = coupling.runs
    resumed = runs[0]
    steps = {r.name: r.steps for r in estimate_runs(coupling)}[resumed.name]
    ckpt = coupling.sweep_dir / resumed.name / "checkpoints" / f"step={steps // 4 * 3:08d}.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": steps // 4 * 3}, ckpt)
    progress = Progress(ledger, list(runs), jobs=1)
    assert progress.left[resumed.name] == pytest.approx(1 - (steps // 4 * 3) / steps)
    line = progress.line(list(runs), [], finished=set(), failed=set())
    expected = (
        sum(progress.estimates[r.name] for r in runs) - progress.estimates[resumed.name] * (steps // 4 * 3) / steps
    )
    assert f"study eta {runner._clock(expected)}" in line
