"""Studies on a real controller (tests/slurm_cluster.py), in one test so that one test process owns the one cluster
(pytest-xdist's `--dist loadgroup` does not group tests under this pytest):

- a study swept with `--slurm`: `submit.sh` runs the array of each wave and the report job; a run stopped by
  SLURM's stop signal saves, requeues itself and ends equal to its uninterrupted twin to the last digit; a task
  cancelled outright resumes when `submit.sh` runs again, finished runs skipped; `--status` reads each run's state
  from the scheduler;
- a study whose run fails, submitted beside it: `--status` shows it failed with its logs;
- then the documented `srun` line with 2 tasks: one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from slurm_cluster import SlurmCluster
from tiny_run import QUICKSTART, child_env, prepare_tiny_shards, quickstart_callbacks, tiny_args

from lightning_cqk.study.run.run_scalars import read_scalars

HERE = Path(__file__).resolve().parent
STEPS, TOKENS_PER_STEP = 8, 2 * 16  # batch 2 x seq_len 16
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")


def _spec(tmp: Path, shards: Path) -> Path:
    """Four tiny runs in two waves: `stopped` is sent SLURM's stop signal (USR1) after step 3 of its first attempt;
    `twin` is the same run uninterrupted (a callback list of its own makes it another run: identity.py); `cut` is
    cancelled outright after step 3; `matched` (wave 1) trains `stopped`'s tokens (`budget.match_to`)."""
    plain = quickstart_callbacks(tmp / "plain.yaml", every_n_steps=2)
    marker = {"at_step": 3, "marker": str(tmp / "stopped.once")}
    usr1 = {"class_path": "slurm_helpers.StopOwnTaskOnce", "init_args": marker}
    cancel = {"class_path": "slurm_helpers.StopOwnTaskOnce"}
    cancel["init_args"] = {"at_step": 3, "marker": str(tmp / "cut.once"), "signal": "cancel"}
    spec = {
        "study": "mini",
        "metric": "val/loss",
        "baseline": {"arm": "twin"},
        "axes": {
            "arm": {
                "stopped": {"config": str(quickstart_callbacks(tmp / "usr1.yaml", usr1, every_n_steps=2))},
                "twin": {"config": str(plain)},
                "cut": {"config": str(quickstart_callbacks(tmp / "cut.yaml", cancel, every_n_steps=2))},
                "matched": {"config": str(plain), "budget.match_to": "{run:stopped}", "budget.tokens": None},
            }
        },
        "profiles": {
            "paper": {"configs": [str(QUICKSTART)]},
            "cpu": {
                "configs": [str(QUICKSTART)],
                "seeds": [1],
                "overrides": {
                    "data.source": None,
                    "data.data_dir": str(shards),
                    "data.seq_len": 16,
                    "data.batch_size": 2,
                    "model.config.n_layer": 1,
                    "model.config.n_embd": 16,
                    "model.config.n_head": 2,
                    "model.config.mlp_hidden": 32,
                    "model.optim.warmup_steps": 1,
                    "budget.tokens": STEPS * TOKENS_PER_STEP,
                    "trainer.val_check_interval": 4,
                    "trainer.limit_val_batches": 1,
                    "trainer.enable_progress_bar": False,
                    "trainer.enable_model_summary": False,
                    "trainer.accelerator": "cpu",
                },
            },
        },
    }
    path = tmp / "mini.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _env(cluster: SlurmCluster) -> dict[str, str]:
    """A submitting user's shell: this venv's python first on PATH, the cluster's SLURM_CONF, the test callbacks."""
    env = child_env(HERE, SLURM_CONF=str(cluster.conf))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), cluster.env["PATH"]])
    return env


def _submit(cluster: SlurmCluster, sweep_dir: Path, cwd: Path) -> list[str]:
    """`bash submit.sh`; the job ids it printed (waves, then the report)."""
    result = cluster.run(["bash", str(sweep_dir / "slurm" / "submit.sh")], env=_env(cluster), cwd=cwd)
    return [line.rsplit(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("submitted ")]


def _wait(cluster: SlurmCluster, tasks: list[str], timeout: float = 240) -> dict[str, str]:
    """Wait until each job / array task has ended; their final states."""
    deadline = time.monotonic() + timeout
    while True:
        states = {task: cluster.job_state(task) for task in tasks}
        if all(state in FINISHED for state in states.values()):
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs not finished after {timeout} s: {states}\n{cluster.logs()}")
        time.sleep(1)


def _status(sweep_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (sweep_dir / "status").glob("*.json")}


@pytest.mark.slow
def test_studies_on_a_real_cluster(slurm_cluster: SlurmCluster, tmp_path: Path):
    shards = prepare_tiny_shards(tmp_path)
    failing = _submit_failing_study(slurm_cluster, shards, tmp_path / "failing")  # runs beside wave 0 below
    _study_survives_a_stop_signal_and_a_cancelled_task(slurm_cluster, shards, tmp_path / "study")
    _check_failing_study(slurm_cluster, *failing)
    _srun_of_two_tasks_is_one_run(slurm_cluster, shards, tmp_path / "srun")


def _study_survives_a_stop_signal_and_a_cancelled_task(slurm_cluster: SlurmCluster, shards: Path, tmp_path: Path):
    tmp_path.mkdir()
    spec = _spec(tmp_path, shards)
    out = tmp_path / "runs" / "mini"
    env = _env(slurm_cluster)
    sweep = [sys.executable, "-m", "lightning_cqk", "sweep", str(spec), "--output", str(out)]
    written = subprocess.run([*sweep, "--slurm"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    wave0 = (out / "slurm" / "wave0.sbatch").read_text()
    for line in ("#SBATCH --signal=USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append"):
        assert line in wave0

    first, second, report = _submit(slurm_cluster, out, tmp_path)
    names = wave0.split("RUNS=(")[1].split(")")[0].split()
    tasks = {name.removesuffix("-s1"): f"{first}_{i}" for i, name in enumerate(names)}
    states = _wait(slurm_cluster, list(tasks.values()))
    assert states == {tasks["stopped"]: "COMPLETED", tasks["twin"]: "COMPLETED", tasks["cut"]: "CANCELLED"}, states
    status = _status(out)
    assert status["stopped-s1"]["status"] == "done" and status["stopped-s1"]["attempts"] == 2
    assert status["stopped-s1"]["resumed_from"].endswith(".ckpt")
    assert status["cut-s1"]["status"] == "stopped" and status["cut-s1"]["stopped_by"] == "SIGTERM"
    assert status["twin-s1"]["status"] == "done" and status["twin-s1"]["attempts"] == 1
    # the stopped task's log holds both attempts (--open-mode=append): the requeue, then the resume
    task_log = (out / "slurm" / f"mini-cpu-w0-{first}_{names.index('stopped-s1')}.out").read_text()
    assert "requeued" in task_log and "resuming from" in task_log, task_log
    assert "User defined signal" not in task_log, task_log  # the sweep process handled the signal

    # the cancelled task left wave 1 and the report waiting on a dependency that can never be met: the controller
    # names it so once it has re-evaluated the dependency (plain "Dependency" until then), so ask until it has
    for _ in range(30):
        shown = subprocess.run([*sweep, "--status"], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
        if "DependencyNeverSatisfied" in rows.get("matched-s1", ""):
            break
        time.sleep(2)
    assert rows["cut-s1"].split()[1:4] == ["stopped", "saved", "3"], shown.stdout
    assert f"slurm {tasks['cut']} CANCELLED" in rows["cut-s1"], shown.stdout
    assert f"slurm {tasks['stopped']} COMPLETED" in rows["stopped-s1"] and " done " in rows["stopped-s1"]
    assert f"slurm {second}_0 PENDING (DependencyNeverSatisfied)" in rows["matched-s1"], shown.stdout
    slurm_cluster.run(["scancel", second, report])

    again = _submit(slurm_cluster, out, tmp_path)
    states = _wait(slurm_cluster, [f"{again[0]}_{i}" for i in range(len(names))] + again[1:])
    assert set(states.values()) == {"COMPLETED"}, (states, slurm_cluster.logs())
    status = _status(out)
    assert {s["status"] for s in status.values()} == {"done"}, status
    assert status["cut-s1"]["attempts"] == 2 and status["cut-s1"]["resumed_from"].endswith(".ckpt")
    assert status["stopped-s1"]["attempts"] == 2 and status["twin-s1"]["attempts"] == 1  # skipped, not run again
    assert (out / "report" / "mini.csv").is_file()
    budget = json.loads((out / "matched-s1" / "budget.json").read_text())
    assert budget["steps"] == STEPS and budget["budget"]["match_to"] == str(out / "stopped-s1")

    # stopped at step 3 and resumed = uninterrupted, to the last digit: every logged number and every weight
    stopped, twin = read_scalars(out / "stopped-s1"), read_scalars(out / "twin-s1")
    assert stopped["val/loss"] == twin["val/loss"] and stopped["train/loss"] == twin["train/loss"]
    weights = [torch.load(out / run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for run in
               ("stopped-s1", "twin-s1", "cut-s1")]  # fmt: skip
    for name, tensor in weights[1].items():
        assert torch.equal(weights[0][name], tensor) and torch.equal(weights[2][name], tensor), name


def _srun_of_two_tasks_is_one_run(slurm_cluster: SlurmCluster, tiny_shards: Path, tmp_path: Path):
    """The documented srun line (docs/scaling-out.md), 2 tasks on the node, CPU and gloo: one run directory, whose
    one attempt finished at the last step."""
    tmp_path.mkdir()
    runs = tmp_path / "runs"
    fit = [sys.executable, "-m", "lightning_cqk", "fit", "--config", str(QUICKSTART)]
    fit += ["--trainer.devices=2", "--trainer.num_nodes=1", "--trainer.strategy=ddp", "--ckpt_path=last"]
    tiny = tiny_args(tiny_shards, runs, "--trainer.max_steps=4", "--trainer.limit_val_batches=1", quickstart=False)
    srun = ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--job-name=two-tasks", *fit, *tiny]
    result = slurm_cluster.run(srun, check=False, env=_env(slurm_cluster), cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    dirs = [d for d in (runs / "quickstart").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(dirs) == 1, f"one launch must be one run, got {[d.name for d in dirs]}"
    attempts = json.loads((dirs[0] / "run.json").read_text())["attempts"]
    assert [(a["status"], a.get("step")) for a in attempts] == [("finished", 4)]


def _submit_failing_study(cluster: SlurmCluster, tiny_shards: Path, tmp_path: Path) -> tuple[list[str], Path, str, str]:
    """A study of one run whose settings fail (3 heads do not divide width 16), submitted: its sweep command, its
    directory and its job ids."""
    tmp_path.mkdir()
    spec = {
        "study": "broken",
        "metric": "val/loss",
        "baseline": {"arm": "bad"},
        "axes": {"arm": {"bad": {"model.config.n_head": 3}}},
        "profiles": {
            "paper": {"configs": [str(QUICKSTART)]},
            "cpu": {"configs": [str(QUICKSTART)], "seeds": [1], "overrides": {"data.data_dir": str(tiny_shards)}},
        },
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "runs" / "broken"
    sweep = [sys.executable, "-m", "lightning_cqk", "sweep", str(path), "--output", str(out)]
    env = _env(cluster)
    assert subprocess.run([*sweep, "--slurm"], env=env, cwd=tmp_path, capture_output=True).returncode == 0
    return sweep, out, *_submit(cluster, out, tmp_path)


def _check_failing_study(slurm_cluster: SlurmCluster, sweep: list[str], out: Path, wave: str, report: str) -> None:
    """The failing run's task failed, and `--status` says so beside the run's log and the task's SLURM log."""
    env, tmp_path = _env(slurm_cluster), out.parent.parent
    assert _wait(slurm_cluster, [f"{wave}_0"]) == {f"{wave}_0": "FAILED"}
    slurm_cluster.run(["scancel", report])
    shown = subprocess.run([*sweep, "--status"], env=env, cwd=tmp_path, capture_output=True, text=True).stdout
    line = next(line for line in shown.splitlines() if "bad-s1" in line)
    assert "failed" in line and f"slurm {wave}_0 FAILED" in line, shown
    assert f"log {out / 'logs' / 'bad-s1.log'}, slurm log {out / 'slurm' / f'broken-cpu-w0-{wave}_0.out'}" in line
    assert (out / "slurm" / f"broken-cpu-w0-{wave}_0.out").is_file()


def test_without_slurm_the_tests_skip_saying_how_to_install(monkeypatch):
    import slurm_cluster

    monkeypatch.setattr(slurm_cluster, "binary", lambda name: None if name in ("slurmctld", "munged") else name)
    reason = slurm_cluster.missing_reason()
    assert reason.startswith("munged, slurmctld not found")
    assert "apt-get update && apt-get install -y slurm-wlm munge" in reason
